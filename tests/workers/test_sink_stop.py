"""A watch worker's append transaction at a stop (SIGTERM, Ctrl-C, the Lease lost): it gets
``LEDGER_WATCH_STOP_GRACE_S`` to commit, then its statements are cancelled and it rolls back with its resourceVersion
checkpoint; delivered again, its events are recorded once. It used to wait for its thread without end: one
waiting for a lock held elsewhere kept the worker from stopping, and from handing the Lease on, until the lock came
free."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from ledger import services
from ledger.recorded import WatchLine
from ledger.testing.handle import LedgerHandle
from tests.locks import GUARD_S, held, someone_waits_for_a_lock
from tests.workers.harness import CLUSTER, WAIT_S, ClaimSource, assert_same_ledger, eventually, seed_lab
from workers.k8s.client import WatchEvent
from workers.sink import LedgerSink

HOLD = "LOCK TABLE events IN ACCESS EXCLUSIVE MODE"
"""What the second write waits for: every append reads and writes table ``events``."""
SOURCE = ClaimSource()


def claim_events() -> list[WatchEvent]:
    """Seed-lab's lines 31 and 35 (train-0's claim released, shared-gpu losing a consumer), each a change of a claim
    the first 30 lines recorded, as watch events with resourceVersions 100 and 101. (Not the first two claim lines
    delivered again: an older version of a claim whose allocation was released since emits nothing now, so the
    second write would append no event and wait for no lock.)"""
    at = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)
    lines = seed_lab()
    claims = [lines[31], lines[35]]
    assert all(isinstance(x, WatchLine) and x.object.get("kind") == "ResourceClaim" for x in claims)
    return [WatchEvent(type=x.type, object=x.object, resource_version=str(100 + i), received_at=at)
            for i, x in enumerate(claims) if isinstance(x, WatchLine)]


def ledgers(ledger_factory: Callable[[], LedgerHandle]) -> tuple[LedgerHandle, LedgerHandle]:
    """Two ledgers holding the first 30 seed-lab lines; the second has both claim events recorded by a sink that
    was never stopped, the first only the first of them (resourceVersion 100)."""
    live, clean = ledger_factory(), ledger_factory()
    events = claim_events()
    for handle in (live, clean):
        services.ingest(handle.db, seed_lab()[:30], cluster=CLUSTER)

    async def record(handle: LedgerHandle, count: int) -> None:
        sink = LedgerSink(handle.db, cluster=CLUSTER)
        for i in range(count):
            await sink.observed(SOURCE, events[i:i + 1], events[i].resource_version)  # type: ignore[arg-type]

    asyncio.run(record(clean, 2))
    asyncio.run(record(live, 1))
    return live, clean


def said(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    """What the sink logged at ``level`` and above."""
    return [r.getMessage() for r in caplog.records if r.name == "workers.sink" and r.levelno >= level]


def stored(handle: LedgerHandle) -> str:
    return services.load_watch_checkpoints(handle.db, CLUSTER)["ResourceClaim"].resource_version


async def waiting_write(sink: LedgerSink, handle: LedgerHandle) -> asyncio.Task[None]:
    """Start recording the second claim event and return once its transaction waits for :data:`HOLD`."""
    second = claim_events()[1:]
    task = asyncio.ensure_future(sink.observed(SOURCE, second, "101"))  # type: ignore[arg-type]  # a stand-in
    await eventually(lambda: someone_waits_for_a_lock(handle.engine), "the write waiting for table events")
    assert not task.done()
    return task


async def ended(task: asyncio.Task[None]) -> None:
    """Await the cancelled ``task``; a write still waiting after :data:`WAIT_S` fails the test, not hangs it."""
    finished, _ = await asyncio.wait([task], timeout=WAIT_S)
    assert task in finished, "the cancelled write still waits for the lock"
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_write_waiting_for_a_lock_rolls_back_after_the_grace_and_is_recorded_once_when_delivered_again(
        ledger_factory: Callable[[], LedgerHandle], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workers.sink")
    live, clean = ledgers(ledger_factory)
    sink = LedgerSink(live.db, cluster=CLUSTER, stop_grace_s=0.2)

    async def scenario() -> None:
        with held(live.engine, HOLD) as released:
            task = await waiting_write(sink, live)
            sink.stopping("SIGTERM")  # as `watch` says the first signal, before the stop cancels the write
            task.cancel()
            await ended(task)
            let_go_first = released.is_set()
        assert not let_go_first  # the cancel ended the write, not the holder's release
        assert stored(live) == "100"  # rolled back with the events it covers
        assert live.snapshot() != clean.snapshot()
        await sink.observed(SOURCE, claim_events()[1:], "101")  # type: ignore[arg-type]  # delivered again
        assert stored(live) == "101"

    asyncio.run(scenario())
    assert_same_ledger(live, clean)
    assert said(caplog, logging.INFO) == [
        "stopping (SIGTERM): an append transaction in flight gets up to 0.2s to commit (LEDGER_WATCH_STOP_GRACE_S); "
        "a second signal cancels it at once",
        "the append transaction in flight is cancelled, as it has not committed within 0.2s of the stop "
        "(LEDGER_WATCH_STOP_GRACE_S); it rolls back, and its watch events are recorded when they are delivered again"]


def test_a_write_that_can_commit_within_the_grace_commits(ledger_factory: Callable[[], LedgerHandle],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    live, clean = ledgers(ledger_factory)
    sink = LedgerSink(live.db, cluster=CLUSTER, stop_grace_s=GUARD_S)

    async def scenario() -> None:
        with held(live.engine, HOLD):
            task = await waiting_write(sink, live)
            task.cancel()
            await asyncio.sleep(0.3)  # the cancel has reached the write, which waits out its grace
            assert not task.done()
        await ended(task)  # the holder let go: the write committed, then the cancel went on
        assert stored(live) == "101"

    asyncio.run(scenario())
    assert_same_ledger(live, clean)
    assert said(caplog) == []


@pytest.mark.parametrize("again", ["cancel", "hurry"])
def test_a_second_cancel_or_a_second_signal_cuts_the_grace_short(ledger_factory: Callable[[], LedgerHandle],
                                                                  again: str) -> None:
    # A second signal reaches `watch` as a second call of its handler (sink.hurry), not as a second cancel.
    live, _ = ledgers(ledger_factory)
    sink = LedgerSink(live.db, cluster=CLUSTER, stop_grace_s=GUARD_S)

    async def scenario() -> None:
        with held(live.engine, HOLD) as released:
            task = await waiting_write(sink, live)
            task.cancel()
            await asyncio.sleep(0.3)
            assert not task.done()  # waiting out its grace
            if again == "cancel":
                task.cancel()
            else:
                sink.hurry()
            await ended(task)
            let_go_first = released.is_set()
        assert not let_go_first
        assert stored(live) == "100"

    asyncio.run(scenario())
