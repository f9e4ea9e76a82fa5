"""Alembic owns the schema: the migrations build exactly ``ledger.store.tables`` and undo cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from ledger import services
from ledger.recorded import parse_time
from ledger.store import schema
from ledger.store.tables import metadata
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES


def test_the_migrated_schema_matches_the_table_definitions(ledger_engine: Engine) -> None:
    with ledger_engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []
    assert schema.current_revision(ledger_engine) == schema.head_revision()


def test_every_revision_downgrades_to_an_empty_database_and_upgrades_again(ledger_engine: Engine) -> None:
    schema.downgrade(ledger_engine, "base")
    assert set(inspect(ledger_engine).get_table_names()) <= {"alembic_version"}
    schema.upgrade(ledger_engine)
    assert {t.name for t in metadata.sorted_tables} <= set(inspect(ledger_engine).get_table_names())


def test_upgrading_to_0005_fills_the_rollup_by_team_from_the_hours_already_rolled(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    assert services.rollup_usage(ledger.db, start=parse_time("2026-11-02T09:00:00Z"),
                                 end=parse_time("2026-11-02T12:00:00Z")) == 3
    written = ledger.rows("usage_rollups_by_team")
    assert {row[1] for row in written} == {r[1] for r in ledger.rows("usage_rollups")}  # the same hours
    schema.downgrade(ledger.engine, "0004")
    schema.upgrade(ledger.engine)
    assert ledger.rows("usage_rollups_by_team") == written
