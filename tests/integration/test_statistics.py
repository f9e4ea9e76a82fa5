"""After a bulk load (a large replay, a rebuild) the ledger analyzes its tables itself.

The planner has no statistics of rows written since the last ANALYZE; autovacuum analyzes later, or never where
it is off. With none, a replayed 1,000-node day listed a DeviceClass's devices in 23 s instead of 2.4 s.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from ledger import services
from ledger.store import postgres
from ledger.store.database import LedgerDatabase
from ledger.store.postgres import Analyzed
from ledger.store.tables import metadata
from ledger.testing.handle import LedgerHandle
from tests.factories import uid
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
    assert analyzes(seen) == [f"ANALYZE {table}" for table in sorted(metadata.tables)]  # one table a statement
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
    assert len(analyzes(seen)) == len(metadata.tables)
    estimate, rows = estimated_and_counted(ledger, "device_allocations")
    assert rows > 0 and estimate == rows


def test_tables_the_role_may_not_analyze_are_skipped_not_asked(ledger: LedgerHandle) -> None:
    # A role that owns no table nor the database (as SECURITY.md's ledger_app): PostgreSQL would only warn and skip
    # each table, and nothing would say the statistics were not refreshed.
    ledger.replay(SEED_LAB)
    role = uid("stats").replace("-", "_")
    with ledger.engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
    engine = create_engine(ledger.engine.url.set(username=role))
    try:
        with statements_run(engine) as seen:
            done = LedgerDatabase(engine=engine).analyze()
        assert (done.analyzed, done.skipped) == ((), tuple(sorted(metadata.tables)))
        assert analyzes(seen) == []
        # The owner analyzes them all.
        assert ledger.db.analyze() == Analyzed(analyzed=tuple(sorted(metadata.tables)), skipped=())
    finally:
        engine.dispose()
        with ledger.engine.begin() as conn:
            conn.execute(text(f"DROP ROLE {role}"))


def test_a_table_locked_by_another_session_is_given_up_in_bounded_time_and_the_rest_analyzed(
        ledger: LedgerHandle, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger.replay(SEED_LAB)
    monkeypatch.setattr(postgres, "ANALYZE_LOCK_TIMEOUT", "100ms")  # 10 s by default
    # Another session holds the lock ANALYZE needs on `events` (as a manual VACUUM or ANALYZE would).
    with ledger.engine.connect() as holder:
        holder.execute(text("LOCK TABLE events IN SHARE UPDATE EXCLUSIVE MODE"))
        with caplog.at_level("WARNING", logger="ledger.services"):
            done = services.refresh_statistics(ledger.db)
        holder.rollback()
    assert done is not None
    assert [table for table, _ in done.failed] == ["events"]
    assert done.failed[0][1] == "canceling statement due to lock timeout"
    assert done.analyzed == tuple(t for t in sorted(metadata.tables) if t != "events")
    [warning] = [r.getMessage() for r in caplog.records if r.name == "ledger.services" and r.levelname == "WARNING"]
    assert warning == ("statistics of table events left to autovacuum: ANALYZE failed: canceling statement due to "
                       "lock timeout")
    # Tables on either side of `events` in name order were analyzed.
    for table in ("device_allocations", "observations"):
        estimate, rows = estimated_and_counted(ledger, table)
        assert rows > 0 and estimate == rows, table
    # The connection goes back to its pool without the lock timeout (a pool of one: the same connection).
    single = create_engine(ledger.engine.url, pool_size=1, max_overflow=0)
    try:
        assert LedgerDatabase(engine=single).analyze().failed == ()
        with single.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "0"
    finally:
        single.dispose()


def test_any_catch_up_of_a_bulk_load_analyzes_and_says_what_it_did(ledger: LedgerHandle,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker or `serve` that finds many events unapplied (an outage, a replay that left the catch-up to them).
    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", 10)
    report = services.replay_files(ledger.db, [SEED_LAB], cluster=ledger.cluster, catch_up=False)
    told: list[tuple[Analyzed, float]] = []
    with statements_run(ledger.engine) as seen:
        applied = services.catch_up(ledger.db, statistics=lambda done, seconds: told.append((done, seconds)))

    assert applied == report.events >= 10
    assert analyzes(seen) == [f"ANALYZE {table}" for table in sorted(metadata.tables)]
    [(done, seconds)] = told
    assert done.analyzed == tuple(sorted(metadata.tables)) and seconds >= 0
    # Caught up, the next catch-up applies nothing and analyzes nothing.
    with statements_run(ledger.engine) as again:
        assert services.catch_up(ledger.db) == 0
    assert analyzes(again) == []


def test_replay_on_the_command_line_says_how_many_tables_it_analyzed(ledger: LedgerHandle,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.cli import app

    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", 10)
    url = ledger.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(app, ["replay", str(SEED_LAB), "--database-url", url, "--cluster", ledger.cluster])

    assert result.exit_code == 0, result.output
    assert f"statistics: {len(metadata.tables)} tables analyzed for the query planner in " in result.output


def test_catch_ups_count_toward_the_threshold_together_as_a_worker_catching_up_a_backlog_does(
        ledger: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    # A watch worker applies a backlog in many passes, one a second: none alone reached the threshold.
    db = ledger.db  # one database object, as a worker holds one
    first = services.replay_files(db, [SEED_LAB], cluster=ledger.cluster, catch_up=False).events
    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", first + 1)
    with statements_run(ledger.engine) as seen:
        assert services.catch_up(db) == first
    assert analyzes(seen) == [] and db.unanalyzed_events == first
    second = services.replay_files(db, [SEED_LAB], cluster=f"{ledger.cluster}-2", catch_up=False).events
    with statements_run(ledger.engine) as seen:
        assert services.catch_up(db) == second
    assert analyzes(seen) == [f"ANALYZE {table}" for table in sorted(metadata.tables)]
    assert db.unanalyzed_events == 0  # counted again from here


def test_the_jobs_catch_up_analyzes_a_backlog_too(ledger: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", 10)
    db = ledger.db
    services.replay_files(db, [SEED_LAB], cluster=ledger.cluster, catch_up=False)
    with statements_run(ledger.engine) as seen:
        services.refresh_occupancy_counts(db)  # what `dra-ledger jobs` runs first
    assert analyzes(seen) == [f"ANALYZE {table}" for table in sorted(metadata.tables)]


def test_a_refresh_without_a_listener_logs_what_it_did(ledger: LedgerHandle, caplog: pytest.LogCaptureFixture) -> None:
    ledger.replay(SEED_LAB)
    with caplog.at_level("INFO", logger="ledger.services"):
        services.refresh_statistics(ledger.db)
    [line] = [r.getMessage() for r in caplog.records if r.name == "ledger.services"]
    assert line.startswith(f"statistics: {len(metadata.tables)} tables analyzed in ")
    assert line.endswith(" s, 0 left to autovacuum (not this role's to analyze)")
