"""Work a coroutine hands to a thread (``ledger.threads.in_thread``) stops when the coroutine is cancelled: the
statement the thread waits in is cancelled, its connection is not pooled again, and the work's own error handling
takes the cancel for no failure of its own."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from ledger import services
from ledger.config import LedgerConfig
from ledger.store.cancel import StatementCancel, ThreadCancelled
from ledger.testing.handle import LedgerHandle
from ledger.threads import in_thread
from tests.locks import GUARD_S, held, someone_waits_for_a_lock
from tests.paths import HISTORIES
from workers.jobs import EXECUTOR_LOG, build_scheduler


async def cancelled_once_waiting(engine: Engine, work: Callable[[], object]) -> None:
    """Run ``work`` under :func:`in_thread`, cancel it once a session waits for a lock, and await its end."""
    task = asyncio.ensure_future(in_thread(work))
    deadline = time.monotonic() + GUARD_S
    while not await asyncio.to_thread(someone_waits_for_a_lock, engine) and time.monotonic() < deadline:
        assert not task.done(), task.result()
        await asyncio.sleep(0.05)
    task.cancel()
    await task


def test_a_cancelled_coroutine_cancels_the_statement_its_thread_waits_in(ledger: LedgerHandle) -> None:
    engine = ledger.engine
    seen: list[object] = []

    def count_claims() -> int:
        with engine.connect() as conn:
            seen.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
            try:
                return int(conn.execute(text("SELECT count(*) FROM claims")).scalar_one())
            except BaseException as e:
                seen.append(type(e))
                raise

    with held(engine, "LOCK TABLE claims IN ACCESS EXCLUSIVE MODE") as released:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(cancelled_once_waiting(engine, count_claims))
        let_go_first = released.is_set()
    assert not let_go_first  # the cancel ended the wait, not the holder's release
    pid, raised = seen
    assert raised is ThreadCancelled
    # A cancel request may still be on its way to that session: it was closed, never handed back to the pool.
    with engine.connect() as conn:
        assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline and _session_exists(engine, pid):
        time.sleep(0.05)
    assert not _session_exists(engine, pid)


def _session_exists(engine: Engine, pid: object) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid})
                    .scalar_one())


def test_a_cancelled_analyze_is_no_failure_of_its_own_and_the_tables_after_it_are_left(
        ledger: LedgerHandle, caplog: pytest.LogCaptureFixture) -> None:
    # refresh_statistics takes a refused ANALYZE for that table's failure: it logged "ANALYZE failed: canceling
    # statement due to user request" and went on to the next tables, cancelled one by one.
    assert not ledger.replay(HISTORIES / "seed-lab.jsonl").rejected
    caplog.set_level(logging.INFO)
    with held(ledger.engine, "LOCK TABLE claims IN ACCESS EXCLUSIVE MODE") as released:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(cancelled_once_waiting(ledger.engine, lambda: services.refresh_statistics(ledger.db)))
        let_go_first = released.is_set()
    assert not let_go_first
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not [r for r in caplog.records if "statistics:" in r.getMessage()]  # it never said what it did


def test_work_that_polls_between_statements_is_refused_its_next_statement(ledger: LedgerHandle) -> None:
    # A cancel request that reaches a connection between two statements is dropped: work that runs a short
    # statement now and then (a rebuild polling pg_locks for its patience) went on to its end.
    polls = 600  # 0.1 s apart: a minute, were nothing to stop it
    seen: list[object] = []
    started = threading.Event()

    async def main() -> None:
        task = asyncio.ensure_future(in_thread(_polling(ledger, polls, seen, started)))
        assert await asyncio.to_thread(started.wait, GUARD_S)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert seen[-1] is ThreadCancelled
    assert len(seen) - 1 < polls


def _polling(ledger: LedgerHandle, polls: int, seen: list[object], started: threading.Event) -> Callable[[], None]:
    """Work that runs ``SELECT 1`` every 0.1 s, ``polls`` times, noting each in ``seen`` and how it ended."""
    def poll() -> None:
        with ledger.engine.connect() as conn:
            try:
                for _ in range(polls):
                    conn.execute(text("SELECT 1"))
                    seen.append(1)
                    started.set()
                    time.sleep(0.1)
            except BaseException as e:
                seen.append(type(e))
                raise

    return poll


def test_work_left_running_when_the_event_loop_ends_is_stopped_not_waited_for(ledger: LedgerHandle) -> None:
    # asyncio.run cancels every task still running when its main coroutine returns (a forced exit of serve, jobs or
    # watch: serve stopped by two Ctrl-C 20 ms apart during its catch-up). That cancel also reached the task that
    # wrapped the thread; in_thread took it for the thread's end before it sent any cancel request, and asyncio.run
    # then waited for the thread, which applied the whole backlog for minutes while the process ignored signals.
    polls, seen, started = 100, list[object](), threading.Event()
    running: list[asyncio.Task[None]] = []

    async def main() -> None:
        running.append(asyncio.ensure_future(in_thread(_polling(ledger, polls, seen, started))))
        assert await asyncio.to_thread(started.wait, GUARD_S)

    asyncio.run(main())
    assert running[0].cancelled()
    assert seen[-1] is ThreadCancelled
    assert len(seen) - 1 < polls


def test_work_not_cancelled_by_its_caller_raises_a_cancelled_statement_as_the_database_error(
        ledger: LedgerHandle) -> None:
    # A statement_timeout is SQLSTATE 57014 too: under run() but never requested, it stays the database's error.
    def timed_out() -> None:
        with ledger.engine.connect() as conn:
            conn.execute(text("SET statement_timeout = 50"))
            conn.execute(text("SELECT pg_sleep(5)"))

    with pytest.raises(OperationalError, match="statement timeout"):
        StatementCancel().run(timed_out)


def test_in_thread_returns_what_the_work_returns_and_raises_what_it_raises(ledger: LedgerHandle) -> None:
    def claims_counted() -> int:
        with ledger.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM claims")).scalar_one())

    def refused() -> None:
        with ledger.engine.connect() as conn:
            conn.execute(text("SELECT 1/0"))

    assert not ledger.replay(HISTORIES / "seed-lab.jsonl").rejected
    with ledger.engine.connect() as conn:
        claims = int(conn.execute(text("SELECT count(*) FROM claims")).scalar_one())
    assert claims > 0
    assert asyncio.run(in_thread(claims_counted)) == claims
    with pytest.raises(Exception, match="division by zero"):
        asyncio.run(in_thread(refused))


def test_a_scheduled_job_waiting_for_a_lock_stops_with_the_process_with_one_line_and_no_traceback(
        ledger: LedgerHandle, caplog: pytest.LogCaptureFixture) -> None:
    # `jobs` and `watch` stop by returning from their main coroutine; asyncio.run then cancels the jobs still
    # running. The occupancy-counts job waited for its table without end, and APScheduler logged the cancel as the
    # job's failure, with a traceback.
    assert not ledger.replay(HISTORIES / "seed-lab.jsonl").rejected
    caplog.set_level(logging.INFO)

    async def main() -> None:
        scheduler = build_scheduler(ledger.db, config=LedgerConfig())
        scheduler.start()
        try:
            job = scheduler.get_job("occupancy-counts")
            assert job is not None
            job.modify(next_run_time=datetime.now(UTC))
            deadline = time.monotonic() + GUARD_S
            while not await asyncio.to_thread(someone_waits_for_a_lock, ledger.engine):
                assert time.monotonic() < deadline, "the job never waited for occupancy_counts"
                await asyncio.sleep(0.05)
        finally:
            scheduler.shutdown(wait=False)

    with held(ledger.engine, "LOCK TABLE occupancy_counts IN ACCESS EXCLUSIVE MODE") as released:
        asyncio.run(main())
        let_go_first = released.is_set()
    assert not let_go_first
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [r.getMessage() for r in caplog.records if "stopped with the process" in r.getMessage()] == [
        "job run_occupancy_counts stopped with the process: what it had not committed rolled back"]
    # Nor was the run said to have gone well (a job that returned after the cancel was "executed successfully").
    assert not [r for r in caplog.records if r.name == EXECUTOR_LOG and "executed successfully" in r.getMessage()]
