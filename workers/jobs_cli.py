"""``dra-ledger jobs``: run the report jobs alone (entry point ``dra_ledger.commands`` -> ``jobs``).

``dra-ledger watch`` starts the same scheduler beside the watches; this command is for a deployment
that runs the jobs as their own process (``compose.yaml`` service ``jobs``), or once from cron
(``--once``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from ledger import cli, services
from ledger.config import LedgerConfig, load_config
from ledger.errors import LedgerError
from ledger.interrupts import Terminated, sigterm_calls
from ledger.recorded import parse_query_time
from ledger.settings import Settings
from ledger.store.database import LedgerDatabase
from workers.jobs import JobSettings, build_scheduler, run_occupancy_counts, run_rollups, run_snapshots
from workers.logs import configure_logging


async def _run_forever(settings: Settings, config_path: Path | None, cluster: str | None,
                       job_settings: JobSettings) -> None:
    db = services.open_ledger(settings)
    config = load_config(config_path)
    scheduler = build_scheduler(db, config=config, settings=job_settings, cluster=cluster)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not every platform lets asyncio handle signals
            loop.add_signal_handler(sig, stop.set)
    scheduler.start()
    try:
        await stop.wait()
    finally:
        scheduler.shutdown(wait=False)


ROLLUP_KEPT = ("the rollup hours committed so far are kept; run `dra-ledger jobs --once` again to roll up the rest "
               "(it resumes from the last rolled hour)")
"""What an interrupted or failed ``jobs --once`` keeps: each rollup chunk commits on its own
(:func:`ledger.services.rollup_chunks`)."""

ROLLUP_PROGRESS_MIN_HOURS = 1000
"""A ``--once`` run rolling up at least this many hours shows a progress bar on a terminal (as ``replay``
does for long files); the hourly run, an hour or two, shows none."""


@contextlib.contextmanager
def _rollup_progress() -> Iterator[Callable[[services.RollupChunk], None]]:
    """A callback for :func:`run_rollups` that draws a bar of hours rolled up (:func:`ledger.cli.progress_bar`)."""
    with cli.progress_bar("rollup hours", min_total=ROLLUP_PROGRESS_MIN_HOURS) as update:
        yield lambda chunk: update(chunk.done_hours, chunk.total_hours)


async def _run_once(db: LedgerDatabase, config: LedgerConfig, cluster: str | None,
                    rollup_from: datetime | None, progress: Callable[[services.RollupChunk], None],
                    rolled_up: Callable[[], None]) -> dict[str, int]:
    # SIGTERM (a CronJob's deadline, a pod stopped) cancels the run as asyncio.run's Ctrl-C does: between rollup
    # chunks, the chunk in flight committing first; then it is raised as Terminated, said by interrupt_said.
    task, loop = asyncio.current_task(), asyncio.get_running_loop()

    def cancel() -> None:
        if task is not None:
            task.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wakes the loop from its wait, as asyncio.run does for Ctrl-C

    with sigterm_calls(cancel) as terminated:
        try:
            hours = await run_rollups(db, cluster=cluster, start=rollup_from, progress=progress)
            rolled_up()
            counts = await run_snapshots(db, config=config, cluster=cluster)
            written = await run_occupancy_counts(db, cluster=cluster)
        except asyncio.CancelledError:
            if terminated():
                raise Terminated from None
            raise
    return {"hours": hours, **counts, "occupancyCountRows": sum(written.values())}


def register(app: typer.Typer) -> None:
    """Add the ``jobs`` command to the ``dra-ledger`` application."""

    @app.command()
    def jobs(
        once: Annotated[bool, typer.Option("--once", help="Run each job once and exit (for cron).")] = False,
        config: cli.ConfigOpt = None,
        cluster: Annotated[str | None, typer.Option(
            "--cluster", callback=cli.refuse_bad_cluster(leaving_out="to run the jobs for every cluster",
                                                           envvar=False),
            help="Only this cluster (default: all); an empty name is refused.")] = None,
        rollup_from: Annotated[str | None, typer.Option(
            "--rollup-from", help="With --once: recompute the hourly rollups from this instant (RFC 3339), e.g. "
            "after `dra-ledger rebuild`.")] = None,
        url: cli.UrlOpt = None,
        data_dir: cli.DataDirOpt = None,
    ) -> None:
        """Run the report jobs: hourly usage rollups, idle/quota/pending snapshots every N minutes, and the
        occupancy counts every minute.

        Without a database URL the jobs use the embedded ledger in ``--data-dir`` (``LEDGER_DATA_DIR``, else
        the default one); a data dir where no ledger was ever made is refused with exit code 2 before any
        server starts: the jobs only read and summarise a ledger.
        A bad ``LEDGER_*`` setting is exit code 2 too.
        """
        if rollup_from is not None and not once:
            # The scheduler rolls up from the last rolled hour on its own: without --once the option was ignored
            # and the jobs started, silent, as if it had been taken.
            raise typer.BadParameter("only with --once (the scheduled rollup resumes from the last rolled hour)",
                                     param_hint="--rollup-from")
        start: datetime | None = None
        if rollup_from is not None:
            # Read before anything starts, and named: an empty value rolled up from the last rolled hour, as if left
            # out, and a bad one said "not an RFC 3339 time" without saying which option.
            try:
                start = parse_query_time(rollup_from)
            except LedgerError as e:
                raise typer.BadParameter(str(e), param_hint="--rollup-from") from e
        settings = cli.settings_from(url, data_dir)
        # Read (and refused, naming the variable) before anything starts, with --once too, which runs each job
        # once whatever the schedules: a bad LEDGER_JOBS_* value was a pydantic traceback when the scheduler was built.
        job_settings = cli.read_settings(JobSettings)
        if not settings.database_url:
            cli.require_embedded_ledger(settings.data_dir)
        # One line and exit code 2 for a refused schema, a bad file or a database that cannot be reached, as the
        # other commands say it (cli.reported_errors), never a traceback.
        with cli.reported_errors():
            if once:
                db = services.open_ledger(settings)
                loaded = load_config(config)
                if cluster is not None and not services.has_events(db, cluster):
                    # Nothing to do, and nothing done: --rollup-from made the rollup "recompute" its hours for nobody.
                    typer.echo(f"warning: the ledger holds no event of cluster {cluster!r}: nothing to roll up or "
                               "count", err=True)
                    counts = dict.fromkeys(["hours", "idleClaims", "quotaRows", "pendingClasses",
                                            "occupancyCountRows"], 0)
                else:
                    committed: datetime | None = None  # the end of the last rollup chunk committed
                    done = False  # every hour rolled up; the snapshots and occupancy counts follow

                    def rolled_up() -> None:
                        nonlocal done
                        done = True

                    def kept() -> str:
                        if done:
                            return ("interrupted after every hour was rolled up: the snapshots (idle claims, quotas, "
                                    "pending demand) and occupancy counts not taken yet are taken by the next run of "
                                    "the jobs")
                        # A plain run resumes from the last rolled hour; one recomputing from --rollup-from must be
                        # told where to go on, since the last rolled hour may lie past the hours not reached yet.
                        if start is None:
                            return f"interrupted: {ROLLUP_KEPT}"
                        resume = (committed or start).strftime("%Y-%m-%dT%H:%M:%SZ")
                        return ("interrupted: the rollup hours committed so far are kept; run `dra-ledger jobs --once "
                                f"--rollup-from {resume}` to recompute the rest (without --rollup-from it would "
                                "resume from the last rolled hour, past them)")

                    # Ctrl-C: asyncio.run cancels the run between rollup chunks and lets the chunk in flight commit,
                    # then raises KeyboardInterrupt; SIGTERM does the same (_run_once). A lost connection or a
                    # timeout: what was kept is noted under the error.
                    with cli.interrupt_said(kept), _rollup_progress() as bar:
                        def progress(chunk: services.RollupChunk) -> None:
                            nonlocal committed
                            committed = chunk.end
                            bar(chunk)

                        counts = asyncio.run(_run_once(db, loaded, cluster, start, progress, rolled_up))
                typer.echo(f"rolled up {counts['hours']} hour(s); snapshots: {counts['idleClaims']} idle claims, "
                           f"{counts['quotaRows']} quota rows, {counts['pendingClasses']} pending classes; "
                           f"{counts['occupancyCountRows']} occupancy count rows")
            else:
                # A service's log, as `watch` writes it: each run of a job and what it did, with the time. Without
                # it the process wrote nothing but bare warnings (its rollups and snapshots, and its stop, unseen).
                configure_logging()
                asyncio.run(_run_forever(settings, config, cluster, job_settings))
