"""Report jobs that run at the same time write what one run writes.

A user trial ran two ``dra-ledger jobs --once`` at once (and ``compose.yaml`` ran the jobs in ``watch`` and in a
``jobs`` service): each run deleted an hour's rollup rows, found none of the other's uncommitted ones, and inserted
its own, so ``usage_rollups`` held two copies and usage was billed twice. The rollup chunk, the report snapshots and
the catch-up batch that forgets rolled hours now take transaction-level advisory locks
(:mod:`ledger.store.locks`).

The overlap is forced, never left to timing: the first writer to reach the point after its DELETE is held there,
inside its transaction, until the other writer is at the same point (nothing serialises them) or waits for a lock
in the database (something does) or is done (:class:`Overlap`). Either way both transactions were open at once, and
the tables must hold exactly what a single run writes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, text

from ledger import services
from ledger.projections import queries, rollups
from ledger.recorded import parse_time
from ledger.simulate import FleetSpec, write_history
from ledger.testing.handle import LedgerHandle
from tests.integration.test_quotas import SEED_CONFIG
from tests.paths import HISTORIES

T = TypeVar("T")
FLEET = FleetSpec(nodes=4, gpus_per_node=4, hours=6.0, seed=1)
"""The user trial's fleet, smaller: 16 GPUs over 6 hours."""
WINDOW = (FLEET.start, FLEET.start + timedelta(hours=6))
"""The hours rolled up (6 whole hours, one chunk) and the usage window asked."""
ROLLED = {"usage_rollups": "cluster, hour, team, namespace, device_class, model, node, driver",
          "usage_rollups_by_team": "cluster, hour, team, namespace, device_class, model, driver"}
"""Key columns of each rollup table (``computed_at`` differs between runs, and ``device_seconds`` is compared to
the microsecond: sums of floats in another order differ in the last bits)."""
SNAPSHOT_TABLES = ("idle_claim_snapshots", "quota_usage_snapshots", "pending_demand_snapshots")
SEED_FROM, SEED_TO = parse_time("2026-11-02T09:00:00Z"), parse_time("2026-11-02T12:00:00Z")
GUARD_POLLS = 1200
"""Polls of :class:`Overlap` (every 50 ms, so one minute) before it gives up: only against a hang, never the
outcome (a run that never comes, never waits and never ends is a failure of its own)."""


class Overlap:
    """Holds the first caller of :meth:`arrive` until the other writer arrived, waits for a lock, or is done.

    Later callers pass at once. ``overlapped`` is set when the hold ended for one of those reasons (not the guard).
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._mutex = threading.Lock()
        self._arrivals = 0
        self._second = threading.Event()
        self.first_inside = threading.Event()
        """Set once the first writer is held (its transaction open, its DELETE done)."""
        self.other_done = threading.Event()
        """Set by the test when the other writer has returned or failed."""
        self.overlapped = False

    def arrive(self) -> None:
        with self._mutex:
            self._arrivals += 1
            first = self._arrivals == 1
        if not first:
            self._second.set()
            return
        self.first_inside.set()
        for _ in range(GUARD_POLLS):
            if self._second.is_set() or self.other_done.is_set() or self._someone_waits_for_a_lock():
                self.overlapped = True
                return
            self._second.wait(0.05)

    def _someone_waits_for_a_lock(self) -> bool:
        # Advisory locks and row locks alike (a row lock wait is on a transactionid, which pg_locks files under no
        # database): any backend of this test's database blocked on a heavyweight lock.
        with self._engine.connect() as conn:
            return bool(conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar_one())


def run_both(overlap: Overlap, first: Callable[[], T], second: Callable[[], T], *,
             second_after_first_inside: bool = False) -> tuple[T, T]:
    """Run ``first`` and ``second`` on two threads; each one ending sets ``overlap.other_done`` for the other.

    ``second_after_first_inside``: start ``second`` only once ``first`` is held inside its transaction.
    """
    def ending(job: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            try:
                return job()
            finally:
                overlap.other_done.set()
        return run

    with ThreadPoolExecutor(max_workers=2) as pool:
        one: Future[T] = pool.submit(ending(first))
        if second_after_first_inside:
            while not overlap.first_inside.wait(0.05):
                if one.done():
                    break
        two: Future[T] = pool.submit(ending(second))
        results = one.result(), two.result()
    assert overlap.overlapped, "the two transactions never overlapped"
    return results


def rollup_rows(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of both rollup tables: key columns and device-seconds rounded to the microsecond, sorted."""
    with engine.connect() as conn:
        return {table: sorted((*r[:-1], round(float(r[-1]), 6)) for r in conn.execute(text(
            f"SELECT {key}, device_seconds FROM {table}"))) for table, key in ROLLED.items()}


def row_counts(engine: Engine, tables: Sequence[str]) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in tables}


def total_device_hours(body: Any) -> float:
    return round(sum(float(r["deviceHours"]) for r in body["rows"]), 6)


@pytest.fixture()
def fleet(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    """The simulated fleet, replayed and caught up (so a run's own catch-up finds nothing to apply)."""
    write_history(FLEET, tmp_path / "fleet.jsonl")
    assert not ledger.replay(tmp_path / "fleet.jsonl").rejected
    services.catch_up(ledger.db)
    return ledger


def test_two_rollup_runs_at_once_leave_exactly_the_rows_of_one_run(fleet: LedgerHandle,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Expected values from one run alone, and its usage checked against the live intervals (no rollup read).
    assert services.rollup_usage(fleet.db, end=WINDOW[1]) == 6
    single = rollup_rows(fleet.engine)
    counts = row_counts(fleet.engine, list(ROLLED))
    usage = services.usage(fleet.db, start=WINDOW[0], end=WINDOW[1], group_by="team")
    assert usage == fleet.usage(*WINDOW, group_by="team")
    assert counts["usage_rollups"] > 6 and total_device_hours(usage) > 0
    with fleet.engine.begin() as conn:
        rollups.forget_all_rolled_hours(conn)

    overlap = Overlap(fleet.engine)
    forget_hours = rollups._forget_hours

    def forget_then_hold(*args: Any, **kwargs: Any) -> None:
        forget_hours(*args, **kwargs)
        overlap.arrive()  # the hour's old rows deleted, the new ones not yet inserted

    monkeypatch.setattr(rollups, "_forget_hours", forget_then_hold)

    def run() -> int:
        return services.rollup_usage(fleet.db, end=WINDOW[1])

    hours = run_both(overlap, run, run)

    assert hours == (6, 6)  # the run that waited did not fail: it rolled the same hours up again
    assert row_counts(fleet.engine, list(ROLLED)) == counts
    assert rollup_rows(fleet.engine) == single
    assert services.usage(fleet.db, start=WINDOW[0], end=WINDOW[1], group_by="team") == usage
    with fleet.engine.connect() as conn:
        reporting = conn.execute(text(
            "SELECT coalesce(sum(device_hours), 0) FROM reporting.team_usage_hourly WHERE hour >= :a AND hour < :b"),
            {"a": WINDOW[0], "b": WINDOW[1]}).scalar_one()
    assert float(reporting) == pytest.approx(total_device_hours(usage), abs=1e-4)  # rows rounded to 6 places


def test_two_snapshot_runs_at_the_same_instant_store_one_snapshot(ledger: LedgerHandle,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The seed lab at 12:07 holds 1 idle claim, 2 quota rows and 1 class with pending demand (test_reporting).
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    services.catch_up(ledger.db)
    taken = parse_time("2026-11-02T12:07:00Z")
    expected = {"idleClaims": 1, "quotaRows": 2, "pendingClasses": 1}
    overlap = Overlap(ledger.engine)
    idle_claims = queries.idle_claims

    def hold_then_report(*args: Any, **kwargs: Any) -> Any:
        overlap.arrive()  # the instant's old rows deleted, none inserted yet
        return idle_claims(*args, **kwargs)

    monkeypatch.setattr(queries, "idle_claims", hold_then_report)

    def run() -> dict[str, int]:
        return services.take_report_snapshots(ledger.db, at=taken, config=SEED_CONFIG)

    assert run_both(overlap, run, run) == (expected, expected)
    assert row_counts(ledger.engine, SNAPSHOT_TABLES) == dict(zip(SNAPSHOT_TABLES, (1, 2, 1), strict=True))


def test_a_late_event_applied_while_its_hours_are_rolled_up_forgets_what_the_rollup_writes(
        ledger: LedgerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The watch applies events (and forgets the rolled hours they change) while the jobs roll hours up, in one
    # process or two. Here the rollup of 09:00-12:00 has read the intervals and not yet written them when
    # pick-seven's DELETED, recorded late (observed 10:15), is applied: the hours 10:00 and 11:00 it changes
    # must not stay rolled with the GPU still held (test_reporting has the same late event without the race).
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    services.catch_up(ledger.db)
    late = json.loads((HISTORIES / "seed-lab.jsonl").read_text().splitlines()[11])  # pick-seven allocated
    late.update(type="DELETED", observedAt="2026-11-02T10:15:00Z")
    (tmp_path / "late.jsonl").write_text(json.dumps(late) + "\n")
    overlap = Overlap(ledger.engine)
    live_seconds = rollups.live_seconds

    def read_then_hold(*args: Any, **kwargs: Any) -> rollups.Seconds:
        seconds = live_seconds(*args, **kwargs)
        overlap.arrive()
        return seconds

    monkeypatch.setattr(rollups, "live_seconds", read_then_hold)

    def roll_up() -> int:
        return services.rollup_usage(ledger.db, start=SEED_FROM, end=SEED_TO)

    def apply_late_event() -> int:
        return ledger.replay(tmp_path / "late.jsonl").events

    hours, events = run_both(overlap, roll_up, apply_late_event, second_after_first_inside=True)
    monkeypatch.undo()

    assert hours == 3 and events > 0
    with ledger.engine.connect() as conn:
        stale = conn.execute(text("SELECT DISTINCT hour FROM usage_rollups WHERE hour >= :h ORDER BY hour"),
                             {"h": parse_time("2026-11-02T10:00:00Z")}).scalars().all()
    assert stale == []  # forgotten after the rollup committed them
    assert services.usage(ledger.db, start=SEED_FROM, end=SEED_TO, group_by="team") == \
        ledger.usage(SEED_FROM, SEED_TO, group_by="team")
