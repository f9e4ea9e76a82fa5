"""Scheduled jobs (APScheduler 3 ``AsyncIOScheduler``): hourly usage rollups, report snapshots, occupancy counts.

Three jobs, each ``max_instances=1`` (a slow run is never overlapped by the next) and ``coalesce=True``
(runs missed while the process was busy or down collapse into one):

- ``usage-rollups``, every hour at minute ``rollup_minute``: :func:`ledger.services.rollup_usage`
  recomputes the last rolled hour and every whole hour after it (tables ``usage_rollups``, view
  ``reporting.team_usage_hourly``, and ``usage_rollups_by_team``, which ``GET /v1/usage`` reads);
- ``occupancy-counts``, every ``counts_interval_s``: :func:`ledger.services.refresh_occupancy_counts`
  computes the occupancy totals from where events last changed them (table ``occupancy_counts``; live
  events lower the coverage to about now, so this keeps "now" and the recent past on the counts);
- ``report-snapshots``, every ``snapshot_interval_s``: :func:`ledger.services.take_report_snapshots`
  stores the idle-claim report, quota usage and pending demand (views ``reporting.idle_claims``,
  ``reporting.quota_usage``, ``reporting.pending_demand``).

The database work is synchronous (SQLAlchemy Core), so each job runs it in a worker thread
(:func:`in_thread`) and the event loop stays free for the watches that share it; cancelling a job (Ctrl-C,
SIGTERM, the scheduler's shutdown) cancels the statement its thread runs. A failing run is logged by APScheduler and the
next tick tries again (projections and rollups are idempotent). ``dra-ledger watch`` starts this
scheduler beside the watches; ``dra-ledger jobs`` runs it alone (``workers/jobs_cli.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ledger import services
from ledger.config import LedgerConfig
from ledger.errors import Unavailable
from ledger.store.database import LedgerDatabase
from ledger.threads import in_thread

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)


class JobSettings(BaseSettings):
    """Schedules of the report jobs; ``LEDGER_JOBS_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="LEDGER_JOBS_", extra="ignore")

    rollup_minute: int = Field(default=5, ge=0, le=59)
    """Minute of each hour at which the hourly rollup runs; 5 leaves the watches 5 minutes to record
    the end of the previous hour before it is rolled up (a later event is absorbed by the next run,
    which recomputes the last rolled hour)."""
    snapshot_interval_s: int = Field(default=300, ge=10)
    """Seconds between report snapshots (idle claims, quota usage, pending demand), s; 5 minutes is
    finer than the idle thresholds (30 minutes by default)."""
    counts_interval_s: int = Field(default=60, ge=5)
    """Seconds between occupancy-count refreshes, s; a refresh after a minute of live events reads only the
    intervals open since then, and instants after the last refresh are aggregated from the intervals."""
    misfire_grace_s: int = Field(default=600, ge=1)
    """A run late by up to this many seconds still runs (once, coalesced), s."""


async def run_rollups(db: LedgerDatabase, *, cluster: str | None = None, clock: Clock = utc_now,
                      start: datetime | None = None,
                      progress: Callable[[services.RollupChunk], None] | None = None) -> int:
    """Recompute the hourly usage rollups up to the current hour; returns the hours recomputed.

    ``start`` (default: the last rolled hour) recomputes from an earlier hour, e.g. after a rebuild. The
    hours are rolled up in bounded chunks (:func:`ledger.services.rollup_chunks`), each run in a worker
    thread and committed on its own; ``progress`` is called on the event loop after each. Cancelling the
    task (the scheduler's shutdown, Ctrl-C under ``asyncio.run``) cancels the chunk in flight (:func:`in_thread`):
    it rolls back unless it committed first, none is started after it, and the next run resumes from the last
    rolled hour.
    """
    chunks = services.rollup_chunks(db, end=clock(), start=start, cluster=cluster)
    hours = 0
    # One chunk per thread hop: an await between chunks is where a cancellation lands. The generator holds
    # no transaction while suspended, and only one thread advances it at a time (each hop is awaited).
    while (chunk := await in_thread(next, chunks, None)) is not None:
        hours = chunk.done_hours
        if progress is not None:
            progress(chunk)
    log.info("usage rollups: %d hour(s) recomputed", hours)
    return hours


async def run_occupancy_counts(db: LedgerDatabase, *, cluster: str | None = None) -> dict[str, int]:
    """Compute the occupancy counts of every cluster not fully covered; returns rows written per cluster.

    See :func:`ledger.services.refresh_occupancy_counts` (table ``occupancy_counts``).
    """
    written = await in_thread(services.refresh_occupancy_counts, db, cluster=cluster)
    if written:
        log.info("occupancy counts: %s row(s) written per cluster", written)
    return written


async def run_snapshots(db: LedgerDatabase, *, config: LedgerConfig, cluster: str | None = None,
                        clock: Clock = utc_now) -> dict[str, int]:
    """Store the idle-claim, quota and pending-demand snapshots at the current time; returns row counts."""
    at = clock()
    counts = await in_thread(services.take_report_snapshots, db, at=at, config=config, cluster=cluster)
    log.info("report snapshots at %s: %s", at.isoformat(), counts)
    return counts


def _said_when_stopped(job: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    """``job`` as a scheduled job: cancelled because the process stops, it logs one line of its own (info); stopped
    because the database cannot be reached, one line too (a warning naming the error); either way it lets the
    exception go on to APScheduler, whose record of it :class:`SaidJobFilter` drops."""

    @functools.wraps(job)
    async def run(**kwargs: Any) -> object:
        try:
            return await job(**kwargs)
        except asyncio.CancelledError:
            log.info("job %s stopped with the process: what it had not committed rolled back", job.__name__)
            raise
        except Unavailable as e:
            log.warning("job %s failed: %s; the next run tries again", job.__name__, e)
            raise

    return run


class SaidJobFilter(logging.Filter):
    """Drops APScheduler's "raised an exception" record of a job whose exception is ``asyncio.CancelledError`` or
    :class:`ledger.errors.Unavailable`: the job said what happened itself (:func:`_said_when_stopped`).

    Why: ``asyncio.run`` cancels the jobs still running as ``jobs`` or ``watch`` stops, and APScheduler logged that
    cancel as the job's failure, with a traceback; returning instead of raising made it log the run as "executed
    successfully". A database outage logged a full traceback at every run of every job until it was over. Decided by
    the exception's type, on the executor's logger only: every other failure of a job is logged as before.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for a record carrying a ``CancelledError`` or an ``Unavailable``."""
        return not (record.exc_info is not None
                    and isinstance(record.exc_info[1], asyncio.CancelledError | Unavailable))


EXECUTOR_LOG = "apscheduler.executors.default"
"""The logger of APScheduler's default executor, which runs the jobs (:class:`SaidJobFilter` sits on it)."""


def build_scheduler(db: LedgerDatabase, *, config: LedgerConfig, settings: JobSettings | None = None,
                    cluster: str | None = None, clock: Clock = utc_now) -> AsyncIOScheduler:
    """Return an ``AsyncIOScheduler`` (not started) holding the ``usage-rollups``, ``report-snapshots`` and
    ``occupancy-counts`` jobs.

    Args:
        db: the ledger database (schema at head).
        config: the configuration file (idle thresholds, ``deviceClassMappings``, quotas).
        settings: schedules (default: :class:`JobSettings` from the environment).
        cluster: limit the jobs to one cluster (``None``: every cluster in the ledger).
        clock: the time source (tests pass a fixed clock).

    Returns:
        The scheduler, in UTC; call ``start()`` inside a running event loop and ``shutdown()`` to stop.
    """
    settings = settings or JobSettings()
    executor_log = logging.getLogger(EXECUTOR_LOG)
    if not any(isinstance(f, SaidJobFilter) for f in executor_log.filters):
        executor_log.addFilter(SaidJobFilter())
    run_rollups_, run_snapshots_, run_occupancy_counts_ = (
        _said_when_stopped(job) for job in (run_rollups, run_snapshots, run_occupancy_counts))
    scheduler = AsyncIOScheduler(timezone=UTC, job_defaults={
        "max_instances": 1, "coalesce": True, "misfire_grace_time": settings.misfire_grace_s})
    scheduler.add_job(run_rollups_, CronTrigger(minute=settings.rollup_minute, timezone=UTC), id="usage-rollups",
                      name="hourly usage rollups", kwargs={"db": db, "cluster": cluster, "clock": clock},
                      max_instances=1, coalesce=True, replace_existing=True)
    scheduler.add_job(run_snapshots_, IntervalTrigger(seconds=settings.snapshot_interval_s, timezone=UTC),
                      id="report-snapshots", name="idle-claim, quota and pending-demand snapshots",
                      kwargs={"db": db, "config": config, "cluster": cluster, "clock": clock},
                      max_instances=1, coalesce=True, replace_existing=True)
    scheduler.add_job(run_occupancy_counts_, IntervalTrigger(seconds=settings.counts_interval_s, timezone=UTC),
                      id="occupancy-counts", name="occupancy counts", kwargs={"db": db, "cluster": cluster},
                      max_instances=1, coalesce=True, replace_existing=True)
    return scheduler
