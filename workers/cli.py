"""``dra-ledger watch``, ``dra-ledger record`` and ``dra-ledger fake-apiserver`` (registered through the
entry-point group ``dra_ledger.commands``, so ``ledger`` never imports ``workers``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
import yarl
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from pydantic import ValidationError
from pydantic_settings import SettingsError

from ledger import cli, services
from ledger.config import load_config
from ledger.embedded import require_port
from ledger.errors import LedgerError
from ledger.recorded import BrokenLine, WatchLine, read_history
from workers.fake_apiserver import FakeApiServer, HttpClock
from workers.health import HealthServer, WorkerMetrics
from workers.jobs import JobSettings, build_scheduler
from workers.k8s.client import ApiError, Clock
from workers.k8s.kinds import DEVICE_TAINT_RULE_VERSIONS, DRA_VERSIONS
from workers.logs import configure_logging
from workers.main import run_worker, system_clock
from workers.record import RecordSink
from workers.settings import WatchSettings
from workers.sink import LedgerSink, keep_projections_current

log = logging.getLogger(__name__)

KubeconfigOpt = Annotated[Path | None, typer.Option(
    "--kubeconfig", envvar="KUBECONFIG",
    help="kubeconfig file; unset: in-cluster config in a pod, else ~/.kube/config.")]
ContextOpt = Annotated[str | None, typer.Option("--context", help="kubeconfig context (default: current).")]
ClockOpt = Annotated[str | None, typer.Option(
    "--clock-url", help="Take receive times from a fake API server's /fake/clock (so a served recorded history "
                        "is dated as recorded, not by this machine's clock).")]

EXPECTED_FAILURES: tuple[type[BaseException], ...] = (
    LedgerError, ApiError, k8s_config.ConfigException, OSError, ValueError, yaml.YAMLError, ValidationError,
    SettingsError,
)
"""Failures a user can cause (bad kubeconfig, unreachable or refusing API server, busy port, bad file or
setting): reported as one ``error:`` line with exit code 2 instead of a traceback."""


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def run_command(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run an async command; turn the failures in :data:`EXPECTED_FAILURES` into one-line errors (exit 2)."""
    try:
        asyncio.run(main())
    except BaseException as error:  # sorted below: only expected failures are reworded
        leaves = _leaves(error)
        if not leaves or not all(isinstance(leaf, EXPECTED_FAILURES) for leaf in leaves):
            raise
        for leaf in leaves:
            text = str(leaf).strip().splitlines()[0] if str(leaf).strip() else type(leaf).__name__
            typer.echo(f"error: {type(leaf).__name__}: {text}", err=True)
        raise typer.Exit(2) from error


async def api_client_for(kubeconfig: Path | None, context: str | None) -> k8s.ApiClient:
    """A kubernetes-asyncio client from ``kubeconfig``/``context``, in-cluster config in a pod, else ~/.kube/config.

    Raises:
        kubernetes_asyncio.config.ConfigException: no usable configuration; a kubeconfig that cannot be read, is
            not UTF-8, is not YAML, or is YAML but no mapping (an empty file, a list), is named in the message
            (:func:`check_kubeconfig`).
    """
    if kubeconfig is not None:
        check_kubeconfig(kubeconfig)
    configuration = k8s.Configuration()
    if kubeconfig is None and context is None:
        try:
            load_incluster: Any = k8s_config.load_incluster_config  # untyped in kubernetes-asyncio 36
            load_incluster(client_configuration=configuration)
            return k8s.ApiClient(configuration)
        except k8s_config.ConfigException:
            pass  # not in a pod: fall back to ~/.kube/config
    named = kubeconfig or os.path.expanduser(k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    if kubeconfig is None and os.path.exists(named):
        check_kubeconfig(Path(named))  # a missing default file is kubernetes-asyncio's to report
    try:
        await k8s_config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context,
                                          client_configuration=configuration, persist_config=False)
    except yaml.YAMLError as e:
        raise k8s_config.ConfigException(f"kubeconfig {named} is not valid YAML: {_yaml_problem(e)}") from e
    except (TypeError, AttributeError) as e:
        # YAML of another shape: kubernetes-asyncio indexes whatever it parsed as a mapping and fails inside.
        raise k8s_config.ConfigException(f"kubeconfig {named} is not a kubeconfig (a YAML mapping of clusters, "
                                         f"users and contexts): {e}") from e
    check_server(str(configuration.host), named)
    return k8s.ApiClient(configuration)


_HOST = re.compile(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?")
"""A DNS name or IPv4 address, or an IPv6 address (yarl gives it without brackets) with an optional zone."""


async def _loads(kubeconfig: Path, context: str | None) -> None:
    """Load ``kubeconfig`` as :func:`api_client_for` does, then close the client.

    Raises:
        kubernetes_asyncio.config.ConfigException: as :func:`api_client_for`.
    """
    await (await api_client_for(kubeconfig, context)).close()


def check_server(server: str, kubeconfig: str | Path) -> None:
    """Refuse a cluster ``server`` that no request can reach: not an ``http(s)://`` URL with a host.

    Why: aiohttp refused every request to it as an invalid URL, a client error the worker retried as a fault of the
    connection, for ever. Parsed by yarl (aiohttp's own URL type).

    Raises:
        kubernetes_asyncio.config.ConfigException: naming ``kubeconfig``, the server and the form it needs.
    """
    try:
        url = yarl.URL(server)
        problem = None if url.scheme in ("http", "https") and url.host else "is not an http(s) URL with a host"
        if problem is None and not _HOST.fullmatch(url.raw_host or ""):
            # "a b" was looked up, failed as a fault of the connection and was retried for ever
            problem = f"has a host {url.raw_host!r} that is no name nor address"
    except ValueError as e:
        problem = f"is not a URL ({e})"
    if problem is not None:
        raise k8s_config.ConfigException(f"kubeconfig {kubeconfig}: the cluster's server {server!r} {problem}, such as "
                                         "https://10.0.0.1:6443")


def check_kubeconfig(path: Path) -> None:
    """Refuse a kubeconfig file that cannot be one, before anything is opened or contacted.

    Checks that ``path`` is a file, can be read, is UTF-8 text, parses as YAML and holds a mapping (the
    clusters, users and contexts are kubernetes-asyncio's to check when it loads the file).

    Raises:
        kubernetes_asyncio.config.ConfigException: the message names ``path`` and what is wrong with it (the
            offending byte and its offset, or the YAML problem with its 1-based line and column).
    """
    if not path.is_file():
        raise k8s_config.ConfigException(f"kubeconfig {path} does not exist or is not a file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise k8s_config.ConfigException(f"kubeconfig {path} cannot be read: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise k8s_config.ConfigException(f"kubeconfig {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at "
                                         f"offset {e.start}); a kubeconfig is YAML, which is UTF-8") from e
    try:
        parsed = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise k8s_config.ConfigException(f"kubeconfig {path} is not valid YAML: {_yaml_problem(e)}") from e
    if not isinstance(parsed, dict):
        holds = "nothing" if parsed is None else f"a {type(parsed).__name__}"
        raise k8s_config.ConfigException(f"kubeconfig {path} is not a kubeconfig (a YAML mapping of clusters, users "
                                         f"and contexts): it holds {holds}")


def _yaml_problem(error: yaml.YAMLError) -> str:
    """The YAML error on one line, with its 1-based line and column when the parser gave them."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem:
        where = error.problem_mark
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        return f"{error.context + ': ' if error.context else ''}{error.problem}{at}"
    return " ".join(str(error).split())


def check_output(output: Path, *, append: bool = False) -> None:
    """Refuse, before any work, an output file that cannot be written: say why on one line, exit code 2.

    Checks that ``output`` is no directory and that its folder exists and is writable (a file already there is
    written to, so it must be writable too), and, unless ``append``, that no file with content is there: a
    restarted ``record`` emptied the recording it had made. Only a check: the file is neither made nor truncated.

    Raises:
        typer.Exit: code 2, after ``error: cannot write <output>: <reason>`` on stderr.
    """
    folder = output.parent
    if output.is_dir():
        reason = "it is a directory"
    elif not folder.is_dir():
        reason = f"no such directory: {folder}"
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = f"the directory {folder} is not writable"
    elif output.exists() and not os.access(output, os.W_OK):
        reason = "the file is not writable"
    elif not append and output.is_file() and (size := output.stat().st_size) > 0:
        reason = (f"it is not empty ({size} bytes); pass --append to go on with the recording in it (replay reads "
                  "the two sessions as one history), or remove it first")
    else:
        return
    typer.echo(f"error: cannot write {output}: {reason}", err=True)
    raise typer.Exit(2)


def _ends_inside_a_line(path: Path) -> bool:
    """Whether the file's last byte is not a newline (an empty file ends no line)."""
    with path.open("rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


@contextlib.asynccontextmanager
async def _stopping_on_signals(first: Callable[[str], None] = lambda _: None,
                               again: Callable[[], None] = lambda: None) -> AsyncIterator[asyncio.Event]:
    """An event set by the first SIGTERM or SIGINT, which also calls ``first`` with the signal's name; each one after
    calls ``again`` (the sink's: say the stop, then no more grace)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def signalled(sig: signal.Signals) -> None:
        if stop.is_set():
            again()
        else:
            first(sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled, sig)
    try:
        yield stop
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@contextlib.asynccontextmanager
async def _clock(clock_url: str | None) -> AsyncIterator[Clock]:
    if not clock_url:
        yield system_clock
        return
    clock = HttpClock(clock_url)
    try:
        yield clock
    finally:
        await clock.close()


def served_versions(serve: str) -> list[str]:
    """The ``--serve`` list as versions of ``resource.k8s.io``.

    Raises:
        typer.BadParameter: (exit code 2) empty, or a version the fake API server cannot serve.
    """
    versions = [v.strip() for v in serve.split(",") if v.strip()]
    known = [*DRA_VERSIONS, *(v for v in DEVICE_TAINT_RULE_VERSIONS if v not in DRA_VERSIONS)]
    unknown = [v for v in versions if v not in known]
    if unknown or not versions:
        raise typer.BadParameter(f"{', '.join(unknown) or 'nothing'} cannot be served; give one or more of "
                                 f"{', '.join(known)}, comma-separated", param_hint="--serve")
    return versions


def report_broken(lines: list[WatchLine | BrokenLine], *, shown: int = 3) -> None:
    """Say on stderr how many lines of a history cannot be read (and are not served), naming the first
    ``shown`` with their reasons (``BrokenLine.reason``), as ``dra-ledger replay`` names rejected lines."""
    broken = [x for x in lines if isinstance(x, BrokenLine)]
    if not broken:
        return
    typer.echo(f"skipped {len(broken)} line{'s' if len(broken) != 1 else ''} that cannot be read "
               "(not served):", err=True)
    for x in broken[:shown]:
        typer.echo(f"  {x.source}:{x.line}: {x.reason}", err=True)
    if len(broken) > shown:
        typer.echo(f"  ... and {len(broken) - shown} more", err=True)


def register(app: typer.Typer) -> None:
    """Add ``watch``, ``record`` and ``fake-apiserver`` to the ``dra-ledger`` Typer app."""

    @app.command()
    def watch(
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        cluster: cli.WriteClusterOpt = None,
        database_url: cli.UrlOpt = None,
        identity: Annotated[str | None, typer.Option("--identity", help="Lease holder identity "
                                                     "(default $POD_NAME, else host-pid).")] = None,
        leader_election: Annotated[bool, typer.Option(help="Compete for the Lease (off: write at once).")] = True,
        jobs: Annotated[bool, typer.Option(help="Run the report jobs (hourly rollups, snapshots) while leader.")]
        = True,
        config: cli.ConfigOpt = None,
        health_port: Annotated[int | None, typer.Option("--health-port", min=-1, max=65535,
                                                        help="Port of /healthz /readyz /metrics (default "
                                                        "LEDGER_WATCH_HEALTH_PORT, 8081; 0: a free one, -1: "
                                                        "none).")] = None,
        clock_url: ClockOpt = None,
        data_dir: cli.DataDirOpt = None,
    ) -> None:
        """Follow a cluster's DRA-related kinds into the ledger (list, then watch; leader-elected): ResourceSlice,
        ResourceClaim, DeviceClass, Pod, Namespace, and DeviceTaintRule where the server serves it.

        While leader it also keeps the read models caught up and runs the report jobs (--no-jobs
        when 'dra-ledger jobs' runs them in a process of its own). Without a database URL the ledger is
        the embedded one in ``--data-dir`` (``LEDGER_DATA_DIR``, else the default), made there if new.
        A ``--kubeconfig`` that is not a file, cannot be read, is not UTF-8 or not YAML, holds no mapping, names
        no usable context or a cluster server that is no http(s) URL is refused (exit code 2, the message naming
        the file) before the ledger is opened, so a mistyped path or a wrong file starts no database server.
        """
        configure_logging()
        if kubeconfig is not None:
            try:
                # Before the ledger: a bad file must start no database server. Loading it whole (check_kubeconfig
                # first, then its server) costs a parse; the client made here is closed at once, and main() makes the
                # one it uses.
                asyncio.run(_loads(kubeconfig, context))
            except k8s_config.ConfigException as e:
                typer.echo(f"error: {e}", err=True)
                raise typer.Exit(2) from e
        settings = cli.settings_from(database_url, data_dir)
        watch_settings = cli.read_settings(WatchSettings)
        # The report jobs' schedules too, before the Lease is taken: a bad LEDGER_JOBS_* value ended a leader that was
        # already following, in a message naming no variable.
        job_settings = cli.read_settings(JobSettings) if jobs else None
        if leader_election and (problem := watch_settings.grace_outlives_the_lease()) is not None:
            typer.echo(f"error: bad setting: {problem}", err=True)
            raise typer.Exit(2)
        if cluster:
            settings = settings.model_copy(update={"cluster": cluster})
        if health_port is not None:
            watch_settings = watch_settings.model_copy(update={"health_port": health_port})
        # One line and exit code 2 for a bad file, a refused schema or a database that cannot be reached, as the
        # other commands say it (cli.reported_errors), never a traceback.
        with cli.reported_errors():
            if watch_settings.health_port > 0:  # said before the database and the cluster are contacted
                require_port(watch_settings.health_host, watch_settings.health_port, doing="serve the health checks",
                             port_option="--health-port (-1: none)", host_option="LEDGER_WATCH_HEALTH_HOST")
            ledger_config = load_config(config or settings.config)
            translator = services.translator_settings(settings, ledger_config, config_path=config or settings.config)
            db = services.open_ledger(settings)

        async def main() -> None:
            api_client = await api_client_for(kubeconfig, context)
            metrics = WorkerMetrics()
            sink = LedgerSink(db, cluster=settings.cluster, translator=translator, batch_size=settings.batch_size,
                              metrics=metrics, stop_grace_s=watch_settings.stop_grace_s)

            async def ready() -> bool:
                return await asyncio.to_thread(services.database_ready, db)

            async def catch_up() -> None:
                await keep_projections_current(sink, settings=watch_settings, metrics=metrics)

            async def report_jobs() -> None:
                scheduler = build_scheduler(db, config=ledger_config, settings=job_settings, cluster=settings.cluster)
                scheduler.start()
                try:
                    await asyncio.Event().wait()  # until this replica stops leading
                finally:
                    scheduler.shutdown(wait=False)

            health = HealthServer(metrics, ready)
            try:  # the client is closed also when the health port cannot be listened on
                if watch_settings.health_port >= 0:
                    await health.start(watch_settings.health_host, watch_settings.health_port)
                async with _stopping_on_signals(sink.stopping, sink.hurry) as stop, _clock(clock_url) as clock:
                    await run_worker(api_client=api_client, sink=sink, settings=watch_settings, stop=stop,
                                     clock=clock, identity=identity, elect=leader_election,
                                     metrics=metrics, while_leading=[catch_up, *([report_jobs] if jobs else [])])
            finally:
                await health.stop()
                await api_client.close()

        run_command(main)

    @app.command()
    def record(
        output: Annotated[Path, typer.Option(
            "--output", "-o", parser=cli.output_path, help="File to write (JSON Lines in the recorded format "
            "that replay reads: one {observedAt, type, object} per line).")],
        kubeconfig: KubeconfigOpt = None,
        context: ContextOpt = None,
        duration_s: Annotated[float | None, typer.Option("--duration", parser=cli.finite_float(gt=0),
                                                         help="Stop after this many seconds, a finite number "
                                                         "above 0 (default: until Ctrl-C / SIGTERM).")] = None,
        clock_url: ClockOpt = None,
        append: Annotated[bool, typer.Option(
            "--append", help="Go on with an --output that holds a recording already (a restarted recorder); "
            "without it such a file is refused, never emptied.")] = False,
    ) -> None:
        """Record the live list/watch streams of the watched kinds to a file that `dra-ledger replay` reads.

        Exit code 2, before the cluster is contacted, for an ``--output`` that cannot be written (a directory, or
        in a folder that does not exist or is not writable), one that holds a recording already without
        ``--append``, or a ``--duration`` not above 0. With ``--append`` the new lines follow the old ones, on a line
        of their own should the old recording end inside a line (a recorder killed while writing it).
        """
        check_output(output, append=append)
        watch_settings = cli.read_settings(WatchSettings)  # a bad LEDGER_WATCH_* value: one line, exit code 2
        configure_logging()

        async def main() -> None:
            api_client = await api_client_for(kubeconfig, context)
            try:  # closed however the recording ends, opening the file included
                with output.open("a" if append else "w", encoding="utf-8") as out:
                    if append and _ends_inside_a_line(output):
                        out.write("\n")  # the cut line stays a broken line of its own: replay reports it
                    sink = RecordSink(out)
                    async with _stopping_on_signals() as stop, _clock(clock_url) as clock:
                        if duration_s is not None:
                            asyncio.get_running_loop().call_later(duration_s, stop.set)
                        await run_worker(api_client=api_client, sink=sink, settings=watch_settings, stop=stop,
                                         clock=clock, elect=False)
            finally:
                await api_client.close()
            typer.echo(f"recorded {sink.lines} lines to {output}", err=True)

        run_command(main)

    @app.command("fake-apiserver")
    def fake_apiserver(
        history: Annotated[Path, typer.Option("--history", help="Recorded history to serve (the JSON Lines "
                                                    "that record and simulate write).")],
        port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                          help="Port on 127.0.0.1 (0: a free one).")] = 8080,
        host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
        speed: Annotated[float, typer.Option("--speed", parser=cli.finite_float(ge=0), help="Play the history "
                                             "this many times faster than recorded (a finite number, at least 0); "
                                             "0: all of it at once.")] = 0.0,
        paused: Annotated[bool, typer.Option("--paused", help="Play only on POST /fake/advance.")] = False,
        serve: Annotated[str, typer.Option("--serve", help="resource.k8s.io versions served, comma-separated.")]
        = "v1,v1beta2,v1beta1",
    ) -> None:
        """Serve list/watch of a recorded history like a Kubernetes API server (tests and demos).

        Exit code 2 for a ``--speed`` below 0 or not finite (NaN, inf), an unknown ``--serve`` version or a
        history that is not a readable file; lines of the history that cannot be read are counted and the first
        few named on stderr (they are not served).
        """
        versions = served_versions(serve)
        if history.is_dir():
            typer.echo(f"error: {history} is a directory; give a history file (JSON Lines)", err=True)
            raise typer.Exit(2)
        if not history.is_file():
            typer.echo(f"error: no such file: {history}", err=True)
            raise typer.Exit(2)
        configure_logging()
        try:
            lines = list(read_history(history))
        except OSError as e:
            typer.echo(f"error: cannot read {history}: {e.strerror or e}", err=True)
            raise typer.Exit(2) from e
        report_broken(lines)

        async def main() -> None:
            server = FakeApiServer(lines, served={"resource.k8s.io": versions})
            url = await server.start(host, port)
            typer.echo(f"fake API server at {url} ({server.remaining} lines; GET /fake/clock, "
                       "POST /fake/advance?count=N|until=T|all=1, /fake/expire, /fake/faults)", err=True)
            if not paused:
                server.start_playing(speed=speed)
            try:
                async with _stopping_on_signals() as stop:
                    await stop.wait()
            finally:
                await server.stop()

        run_command(main)
