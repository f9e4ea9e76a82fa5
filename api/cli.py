"""``dra-ledger serve`` (and the demo's API), registered through the ``dra_ledger.commands`` entry point."""

from __future__ import annotations

import ipaddress
import os
from typing import Annotated

import typer

from api.catch_up import DEFAULT_CATCH_UP_INTERVAL_S
from api.limits import DEFAULT_REPORT_SLOTS, MAX_REPORT_SLOTS, REPORT_WAIT_S
from ledger import cli, services
from ledger.cli_typer import whole_number_parser
from ledger.config import check_cluster_name, load_config
from ledger.embedded import require_port
from ledger.errors import Invalid, LedgerError
from ledger.settings import Settings
from ledger.store.postgres import SESSION_NAME

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = cli.DEMO_PORT
"""The API's default port (8472): unassigned by IANA, so it rarely collides with other local services."""
HTTP_PROTOCOL = "h11"
"""uvicorn's HTTP implementation, named rather than left to uvicorn's pick (httptools when installed): h11 refuses a
request head still incomplete once 16 KiB of it are buffered (``h11_max_incomplete_event_size``; a head that arrives
whole in one read of up to 64 KiB is taken), httptools takes heads of any size (a 300 MB header took minutes of CPU
and ~750 MB of memory), before any token is checked."""
MAX_WORKERS = 64
"""Most worker processes ``serve`` starts: each holds a connection pool (up to 15 connections, SQLAlchemy's
default), so 64 workers may open ~1,000, past PostgreSQL's default ``max_connections`` of 100 well before."""
COUNT_VARIABLES = ("LEDGER_API_WORKERS", "LEDGER_API_REPORT_SLOTS")
"""The environment variables of ``serve``'s ``--workers`` and ``--report-slots``, in that order."""
CATCH_UP_VARIABLE = "LEDGER_API_CATCH_UP_INTERVAL_S"
"""The environment variable of ``serve``'s ``--catch-up-interval``."""


MIN_CATCH_UP_INTERVAL_S = 0.1
"""Shortest ``--catch-up-interval`` above 0, in seconds: each tick is two queries (more than one a second per worker
where nothing is missing), and a value such as ``1e-9`` kept a core busy."""
MAX_CATCH_UP_INTERVAL_S = 3600.0
"""Longest ``--catch-up-interval``, in seconds: longer reads as a typo for 0 (never), which says so."""


def _catch_up_interval(text: str) -> float:
    """The ``--catch-up-interval`` parser: 0 (none), or a finite number of seconds from
    :data:`MIN_CATCH_UP_INTERVAL_S` to :data:`MAX_CATCH_UP_INTERVAL_S`.

    Raises:
        typer.BadParameter: anything else (exit code 2), with the range.
    """
    value = cli.finite_float(ge=0, le=MAX_CATCH_UP_INTERVAL_S)(text)
    if 0 < value < MIN_CATCH_UP_INTERVAL_S:
        raise typer.BadParameter(f"{value:g} s is too short: 0 for none, else {MIN_CATCH_UP_INTERVAL_S:g} to "
                                 f"{MAX_CATCH_UP_INTERVAL_S:g} seconds")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_api(settings: Settings, *, host: str, port: int, allow_open: bool, cluster: str | None = None,
              workers: int = 1, report_slots: int = DEFAULT_REPORT_SLOTS,
              catch_up_interval_s: float = DEFAULT_CATCH_UP_INTERVAL_S) -> None:
    """Serve the REST API with uvicorn until interrupted.

    ``workers``: processes answering on ``host:port`` (uvicorn's workers, each with its own connection pool and
    settled-occupancy memory). One process runs the API's Python on one core at a time (the interpreter lock);
    each worker adds a core's worth. With more than one, everything below is checked in this process first
    (so a bad setting is one error, not one per worker); the workers then build the same app from
    :data:`api.app.WORKER_SPEC_ENV`, and uvicorn replaces a worker that dies. ``report_slots``: whole-fleet
    reports each process computes at once (:class:`api.deps.ReportSlots`). ``catch_up_interval_s``: seconds between
    two catch-ups of the read models while serving, in each process (:mod:`api.catch_up`; 0: only the one before
    the server listens).

    Raises:
        LedgerError: ``host`` is empty or blank, or cannot be listened on (:func:`ledger.embedded.require_port`;
            checked before the configuration is read, so a host that does not resolve or is not this machine's
            is named whatever the tokens); the configuration is invalid, ``cluster`` is empty (``--cluster ""``)
            or no cluster name (:func:`ledger.config.check_cluster_name`; :class:`ledger.errors.Invalid`), or no
            token is configured and ``host`` is not loopback while ``allow_open`` is false.
    """
    import uvicorn

    from api.app import WORKER_SPEC_ENV, WorkerSpec, create_app
    from api.deps import ReportSlots
    from api.server import LifespanEndsOnCancel

    if cluster == "":
        raise LedgerError("--cluster is empty; leave it out to serve every cluster")
    if cluster is not None:
        try:
            check_cluster_name(cluster)
        except Invalid as e:
            raise Invalid(f"--cluster: {e}") from e
    if not host.strip():
        # uvicorn would listen on every interface for an empty host: said, never guessed.
        raise LedgerError("--host is empty; give an address or name of this machine (default 127.0.0.1; 0.0.0.0 "
                          "for every IPv4 interface)")
    # Before the configuration and its tokens: a host that does not resolve, or is not this machine's, cannot be
    # served on whatever the tokens, and the refusal to serve without tokens read as if a token would have done.
    require_port(host, port)
    config = load_config(settings.config)
    # The tokenEnv variables before the database: a missing or shared token is named whatever the database says.
    try:
        config.api.secrets()
    except Invalid as e:
        raise Invalid(f"{settings.config}: {e}" if settings.config is not None else str(e)) from e
    if not config.api.tokens and not _is_loopback(host) and not allow_open:
        raise LedgerError(
            f"no API tokens are configured: refusing to serve on {host}; configure [[api.tokens]] "
            "in the configuration file or pass --allow-unauthenticated"
        )
    db = services.open_ledger(settings)
    # Said, with its progress: a ledger far behind took ~40 s before listening, silent; and so is what was kept when
    # it stops there.
    cli.catch_up_read_models(db, when="before the server listened")
    if cluster is not None and not services.has_events(db, cluster):
        # Served anyway (the workers may not have recorded it yet), but a mistyped name answers like an empty cluster.
        typer.echo(f"warning: the ledger holds no event of cluster {cluster!r} yet: every answer will be empty "
                   "until something is recorded under that name", err=True)
    for warning in services.quota_cluster_warnings(db, config):
        typer.echo(warning, err=True)
    app = create_app(db=db, config=config, cluster=cluster, reports=ReportSlots(report_slots),
                     catch_up_interval_s=catch_up_interval_s)
    served = "" if workers == 1 else f", {workers} worker processes"
    where = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in a URL (RFC 3986)
    typer.echo(f"dra-ledger API on http://{where}:{port}/v1 (OpenAPI at http://{where}:{port}/schema){served}",
               err=True)
    if workers == 1:
        uvicorn.run(LifespanEndsOnCancel(app), host=host, port=port, log_level="info", http=HTTP_PROTOCOL)
        return
    # uvicorn starts workers from an import string (a fresh interpreter each): hand them what this process
    # checked, the configuration as read here (not its path: a worker started later, after the file changed,
    # would hold other tokens than its siblings), through the environment they inherit.
    # JSON carries every value a LedgerConfig takes (its numbers are finite; a test round-trips deploy/ledger.toml).
    os.environ[WORKER_SPEC_ENV] = WorkerSpec(database_url=db.url, cluster=cluster, report_slots=report_slots,
                                             config=config.model_dump_json(by_alias=True),
                                             session_name=SESSION_NAME.get(),
                                             catch_up_interval_s=catch_up_interval_s).to_json()
    db.dispose()
    uvicorn.run("api.server:worker_app", factory=True, workers=workers, host=host, port=port,
                log_level="info", http=HTTP_PROTOCOL)


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the CLI and make ``demo`` serve the API after it prints the ledger."""

    @app.command()
    def serve(
        host: Annotated[str, typer.Option(help="Address to bind; loopback unless told otherwise.")] = DEFAULT_HOST,
        port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port (1-65535).")] = DEFAULT_PORT,
        allow_unauthenticated: Annotated[
            bool, typer.Option("--allow-unauthenticated", help="Serve without tokens on a non-loopback address.")
        ] = False,
        config: cli.ConfigOpt = None,
        cluster: Annotated[str | None, typer.Option(help="Answer for this cluster only.")] = None,
        workers: Annotated[int, typer.Option(
            # min/max for --help; the parser checks the range (a parser= replaces Typer's own check).
            min=1, max=MAX_WORKERS, envvar=COUNT_VARIABLES[0], parser=whole_number_parser(1, MAX_WORKERS),
            help="Processes answering requests on the port; each uses up to one core (set it to the cores the "
                 "API may use).")] = 1,
        report_slots: Annotated[int, typer.Option(
            min=1, max=MAX_REPORT_SLOTS, envvar=COUNT_VARIABLES[1],
            parser=whole_number_parser(1, MAX_REPORT_SLOTS),
            help="Whole-fleet reports (quotas, shared, pending, idle claims) each process computes at once; more "
                 f"requests wait, up to {REPORT_WAIT_S:g} s, then get 503.")] = DEFAULT_REPORT_SLOTS,
        catch_up_interval_s: Annotated[float, typer.Option(
            "--catch-up-interval", envvar=CATCH_UP_VARIABLE, parser=_catch_up_interval,
            help="Seconds between two catch-ups of the read models while serving (0.1 to 3600), so that events "
                 "recorded without a watch worker (a replay cut short) reach the answers; 0: only the one before "
                 "listening.")
        ] = DEFAULT_CATCH_UP_INTERVAL_S,
        url: cli.UrlOpt = None,
        data_dir: cli.DataDirOpt = None,
    ) -> None:
        """Serve the read-only REST API (/v1, OpenAPI at /schema)."""
        for variable in (*COUNT_VARIABLES, CATCH_UP_VARIABLE):
            # Click reads a set but empty variable as unset, and never hands it to the parser: refused here, as
            # every empty LEDGER_ setting is (Settings refuses the others when settings_from reads them).
            if variable in os.environ and not os.environ[variable].strip():
                raise typer.BadParameter(f"{variable} is set but empty; unset it for its default")
        settings = cli.settings_from(url, data_dir)
        if config is not None:
            settings = settings.model_copy(update={"config": config})
        with cli.reported_errors():  # one line and exit code 2 (a database it cannot use, too), no traceback
            serve_api(settings, host=host, port=port, allow_open=allow_unauthenticated, cluster=cluster,
                      workers=workers, report_slots=report_slots, catch_up_interval_s=catch_up_interval_s)

    def serve_demo(settings: Settings, port: int) -> None:
        typer.echo(
            f"Serving the API for the demo ledger; try: curl -s "
            f"'http://{DEFAULT_HOST}:{port}/v1/occupancy?at=2026-11-02T09:30:00Z'  (Ctrl-C stops)",
            err=True,
        )
        serve_api(settings, host=DEFAULT_HOST, port=port, allow_open=False, cluster=cli.DEMO_CLUSTER)

    cli.DEMO_FOLLOWUPS.append(serve_demo)
