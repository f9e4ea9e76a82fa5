"""APScheduler's record of a job cancelled as the process stops is dropped; every other record of its executor
passes (``workers.jobs.CancelledJobFilter``)."""

from __future__ import annotations

import asyncio
import logging

from workers.jobs import EXECUTOR_LOG, CancelledJobFilter


def _record(error: BaseException | None) -> logging.LogRecord:
    exc_info = None if error is None else (type(error), error, None)
    return logging.LogRecord(EXECUTOR_LOG, logging.ERROR, __file__, 1, 'Job "%s" raised an exception',
                             ("occupancy counts",), exc_info)


def test_a_cancelled_job_is_dropped_and_a_failed_job_or_a_plain_line_is_kept() -> None:
    kept = CancelledJobFilter()
    assert kept.filter(_record(asyncio.CancelledError())) is False
    assert kept.filter(_record(ValueError("a projection refused an event"))) is True
    assert kept.filter(_record(KeyboardInterrupt())) is True
    assert kept.filter(_record(None)) is True
