"""After a bulk load (a large replay, a rebuild) the ledger analyzes its tables itself.

The planner has no statistics of rows written since the last ANALYZE; autovacuum analyzes later, or never where
it is off. With none, a replayed 1,000-node day listed a DeviceClass's devices in 23 s instead of 2.4 s.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from ledger import services
from ledger.store.tables import metadata
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES
from tests.statements import statements_run

SEED_LAB = HISTORIES / "seed-lab.jsonl"


def analyzes(seen: list[tuple[str, object]]) -> list[str]:
    return [statement for statement, _ in seen if statement.startswith("ANALYZE")]


def estimated_and_counted(ledger: LedgerHandle, table: str) -> tuple[float, int]:
    """(``pg_class.reltuples``: -1 until the table is first analyzed or vacuumed; its rows counted)."""
    with ledger.engine.connect() as conn:
        estimate = conn.execute(text("SELECT reltuples FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                                {"t": table}).scalar_one()
        rows = conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
    return float(estimate), int(rows)


def test_a_replay_that_applies_many_events_analyzes_every_ledger_table(ledger: LedgerHandle,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", 10)  # the seed lab's ~150 events count as many
    with statements_run(ledger.engine) as seen:
        report = ledger.replay(SEED_LAB)

    assert report.events >= 10
    [statement] = analyzes(seen)
    assert statement == "ANALYZE " + ", ".join(sorted(metadata.tables))
    # ANALYZE of a small table reads every row: the estimate is the count.
    for table in ("events", "device_inventory", "device_allocations", "claims"):
        estimate, rows = estimated_and_counted(ledger, table)
        assert rows > 0 and estimate == rows, table


def test_a_replay_of_fewer_events_leaves_the_statistics_to_autovacuum(ledger: LedgerHandle) -> None:
    with statements_run(ledger.engine) as seen:
        report = ledger.replay(SEED_LAB)

    assert 0 < report.events < services.ANALYZE_AFTER_EVENTS
    assert analyzes(seen) == []


def test_a_rebuild_analyzes_the_read_models_it_swapped_in(ledger: LedgerHandle) -> None:
    ledger.replay(SEED_LAB)
    with statements_run(ledger.engine) as seen:
        applied = services.rebuild(ledger.db)

    assert applied > 0
    assert len(analyzes(seen)) == 1
    estimate, rows = estimated_and_counted(ledger, "device_allocations")
    assert rows > 0 and estimate == rows
