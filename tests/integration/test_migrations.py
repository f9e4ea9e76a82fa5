"""Alembic owns the schema: the migrations build exactly ``ledger.store.tables`` and undo cleanly."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from ledger import services
from ledger.errors import Invalid
from ledger.recorded import parse_time, read_history
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
    schema.downgrade(ledger.engine, "0010")  # 0011's and 0012's downgrades would empty the rollups on the way down
    assert services.rollup_usage(ledger.db, start=parse_time("2026-11-02T09:00:00Z"),
                                 end=parse_time("2026-11-02T12:00:00Z")) == 3
    written = ledger.rows("usage_rollups_by_team")
    assert {row[1] for row in written} == {r[1] for r in ledger.rows("usage_rollups")}  # the same hours
    schema.downgrade(ledger.engine, "0004")
    schema.upgrade(ledger.engine, "0010")
    assert ledger.rows("usage_rollups_by_team") == written
    schema.upgrade(ledger.engine)


@pytest.mark.parametrize("below", ["0010", "0011"])
def test_upgrading_past_a_change_of_the_split_empties_the_rollups_and_the_next_run_rolls_every_hour_again(
        ledger: LedgerHandle, below: str) -> None:
    # The rolled hours were summed by an older split (0011: the equal split; 0012: a claim alone on a device billed
    # by its results' fractions); each deletes them so that the hourly job sums them again by the new one, from the
    # first allocation on (nothing rolled means it starts there).
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    end = parse_time("2026-11-02T12:00:00Z")
    assert services.rollup_usage(ledger.db, start=parse_time("2026-11-02T09:00:00Z"), end=end) == 3
    rolled = {t: [r[:-1] for r in ledger.rows(t)] for t in ("usage_rollups", "usage_rollups_by_team")}
    assert all(rolled.values())
    schema.downgrade(ledger.engine, below)
    assert {t: ledger.rows(t) for t in rolled} == {t: [] for t in rolled}  # the downgrade empties them too
    services.rollup_usage(ledger.db, start=parse_time("2026-11-02T09:00:00Z"), end=end)
    schema.upgrade(ledger.engine, f"{int(below) + 1:04d}")
    assert {t: ledger.rows(t) for t in rolled} == {t: [] for t in rolled}
    schema.upgrade(ledger.engine)
    assert sum(chunk.hours for chunk in services.rollup_chunks(ledger.db, end=end)) >= 3
    # The seed lab has no consumedCapacity shares, so the hours come back as they were (row ids and times aside).
    assert {t: [r[:-1] for r in ledger.rows(t)] for t in rolled} == rolled


def test_upgrading_to_0006_keeps_every_observation_and_its_duplicate_check(ledger: LedgerHandle) -> None:
    # The observations' unique key gains the receive time; rows stored under the old key must still be found
    # by the duplicate check, so that a history replayed again records nothing twice.
    history = HISTORIES / "seed-lab.jsonl"
    ledger.replay(history)  # at the head: the append's binary COPY writes the head's column types only
    schema.downgrade(ledger.engine, "0005")
    stored = ledger.rows("observations")
    schema.upgrade(ledger.engine)
    assert ledger.rows("observations") == stored
    again = services.ingest(ledger.db, read_history(history), cluster=ledger.cluster)
    assert (again.recorded, again.duplicates) == (0, len(stored))
    assert ledger.rows("observations") == stored
    with ledger.engine.connect() as conn:
        keys = {c["name"]: c["column_names"] for c in inspect(conn).get_unique_constraints("observations")}
    assert keys == {"observations_cluster_observed_at_digest_key": ["cluster", "observed_at", "digest"]}


def test_upgrading_to_0013_stores_every_body_and_source_as_json_text_of_the_same_values(ledger: LedgerHandle) -> None:
    # 0013 turns observations.body and events.source from jsonb into json: the values must come through as they
    # were, both ways (rows written at the head, taken down to 0012 and up again), and a history replayed again
    # must still record nothing twice.
    history = HISTORIES / "seed-lab.jsonl"
    ledger.replay(history)
    observations, events = ledger.rows("observations"), ledger.events()

    def types() -> set[str]:
        with ledger.engine.connect() as conn:
            return set(conn.execute(text(
                "SELECT DISTINCT format('%s.%s %s', c.table_name, c.column_name, c.data_type) "
                "FROM information_schema.columns c WHERE (c.table_name, c.column_name) IN "
                "(('observations', 'body'), ('events', 'source'))")).scalars())

    assert types() == {"observations.body json", "events.source json"}
    schema.downgrade(ledger.engine, "0012")
    assert types() == {"observations.body jsonb", "events.source jsonb"}
    assert (ledger.rows("observations"), ledger.events()) == (observations, events)
    schema.upgrade(ledger.engine)
    assert types() == {"observations.body json", "events.source json"}
    assert (ledger.rows("observations"), ledger.events()) == (observations, events)
    again = services.ingest(ledger.db, read_history(history), cluster=ledger.cluster)
    assert (again.recorded, again.duplicates) == (0, len(observations))


def test_an_upgrade_refuses_a_server_older_than_the_schema_needs(ledger_engine: Engine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # No PostgreSQL 14 here: raise the bar past the server under test instead, and check nothing was migrated.
    schema.downgrade(ledger_engine, "0005")
    monkeypatch.setattr(schema, "OLDEST_SERVER", 990000)
    with pytest.raises(Invalid, match=r"runs PostgreSQL \d+.*; the ledger needs PostgreSQL 99 or later"):
        schema.upgrade(ledger_engine)
    assert schema.current_revision(ledger_engine) == "0005"
