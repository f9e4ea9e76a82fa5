"""Alembic owns the schema: the migrations build exactly ``ledger.store.tables`` and undo cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from ledger.store import schema
from ledger.store.tables import metadata


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
