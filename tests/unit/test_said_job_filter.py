"""APScheduler's record of a job cancelled as the process stops, or stopped by a database outage, is dropped (the job
said so itself, in one line); every other record of its executor passes (``workers.jobs.SaidJobFilter``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from ledger.errors import StoreUnavailable, Unavailable
from workers.jobs import EXECUTOR_LOG, SaidJobFilter


def _record(error: BaseException | None) -> logging.LogRecord:
    exc_info = None if error is None else (type(error), error, None)
    return logging.LogRecord(EXECUTOR_LOG, logging.ERROR, __file__, 1, 'Job "%s" raised an exception',
                             ("occupancy counts",), exc_info)


def test_a_cancelled_job_is_dropped_and_a_failed_job_or_a_plain_line_is_kept() -> None:
    kept = SaidJobFilter()
    assert kept.filter(_record(asyncio.CancelledError())) is False
    assert kept.filter(_record(Unavailable("database unavailable: connection refused"))) is False
    assert kept.filter(_record(StoreUnavailable("database unavailable: connection refused"))) is False
    assert kept.filter(_record(ValueError("a projection refused an event"))) is True
    assert kept.filter(_record(KeyboardInterrupt())) is True
    assert kept.filter(_record(None)) is True


def test_a_job_in_a_database_outage_says_so_in_one_warning_and_apscheduler_logs_no_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    from datetime import UTC, datetime

    from sqlalchemy import create_engine

    from ledger.config import LedgerConfig
    from ledger.store.database import LedgerDatabase
    from workers.jobs import build_scheduler

    # Port 1 on loopback: connection refused at once, as in an outage. Each run of each job logged a full traceback.
    db = LedgerDatabase(engine=create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))

    async def one_run() -> None:
        scheduler = build_scheduler(db, config=LedgerConfig())
        scheduler.start()
        try:
            job = scheduler.get_job("occupancy-counts")
            assert job is not None
            job.modify(next_run_time=datetime.now(UTC))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if any(r.name == "workers.jobs" for r in caplog.records):
                    break
            await asyncio.sleep(0.1)  # APScheduler's own record of the run follows the job's
        finally:
            scheduler.shutdown(wait=False)

    with caplog.at_level(logging.INFO):
        asyncio.run(one_run())
    said = [r for r in caplog.records if r.name == "workers.jobs"]
    head = "job run_occupancy_counts failed: database unavailable"
    assert [(r.levelname, r.getMessage()[:len(head)]) for r in said] == [("WARNING", head)]
    assert said[0].getMessage().endswith("; the next run tries again")
    assert [r for r in caplog.records if r.exc_info] == []
