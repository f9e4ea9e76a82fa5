"""An API read (or the report snapshot job) that starts while a rebuild holds the read models waits for the rebuild's
commit and answers from the rebuilt rows: never from the tables its ``TRUNCATE`` emptied, and never deadlocking with
it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from api.app import create_app
from api.limits import REBUILD_WAIT_S
from ledger import services
from ledger.config import DEFAULT
from ledger.errors import ReadModelsRebuilding
from ledger.projections import runner
from ledger.recorded import parse_time
from ledger.store.database import LedgerDatabase
from ledger.testing.handle import LedgerHandle
from ledger.types import GlobalPosition

AT = "2026-11-02T09:30:00Z"  # the seed lab: 8 GPUs, 6 allocated (seed-lab.expected.json)
T = TypeVar("T")
WAIT_S = 60.0
"""How long the test waits for a request before it calls it stuck (each takes well under a second alone)."""


def _seen_within_wait(conn: Connection, count: str, params: dict[str, str] | None = None) -> bool:
    """Whether the query ``count`` (a ``SELECT count(*)`` over ``pg_stat_activity`` or ``pg_locks``) gives more than
    0 within :data:`WAIT_S`, asked again every 0.05 s."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        seen = conn.execute(text(count), params or {}).scalar_one()
        conn.rollback()  # pg_stat_activity is read once per transaction
        if seen:
            return True
        time.sleep(0.05)
    return False


def _wait_until_blocked_on_a_lock(conn: Connection) -> bool:
    """Whether another session of this database is waiting for a lock within :data:`WAIT_S`."""
    return _seen_within_wait(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'")


def test_occupancy_requested_during_a_rebuild_waits_for_its_commit_and_answers_the_rebuilt_rows(
        seeded: LedgerHandle, client: TestClient[Litestar]) -> None:
    answers: list[Any] = []

    def request() -> None:
        response = client.get("/v1/occupancy", params={"at": AT, "cluster": seeded.cluster})
        answers.append((response.status_code, response.json()))

    # What a rebuild does in its one transaction: the tables emptied, then filled again from the events, committed
    # later (the same rows here, so the right answer is the seed lab's).
    with seeded.engine.connect() as rebuild, seeded.engine.connect() as watcher:
        rebuild.execute(text("CREATE TEMPORARY TABLE kept ON COMMIT DROP AS SELECT * FROM device_inventory"))
        rebuild.execute(text("TRUNCATE device_inventory"))
        rebuild.execute(text("INSERT INTO device_inventory OVERRIDING SYSTEM VALUE SELECT * FROM kept"))
        thread = threading.Thread(target=request, daemon=True)
        thread.start()
        blocked = _wait_until_blocked_on_a_lock(watcher)
        rebuild.commit()
    thread.join(WAIT_S)

    assert blocked
    [(status, body)] = answers
    assert status == 200, body
    # A snapshot taken before the commit (by reading the checkpoints first) saw device_inventory empty after it.
    assert (body["totals"]["devices"], body["totals"]["allocated"], len(body["devices"])) == (8, 6, 8)
    assert sum(len(d["allocations"]) for d in body["devices"]) == 6


ENDPOINTS = ["/v1/occupancy", "/v1/shared", "/v1/reports/idle-claims", "/v1/pending", "/v1/claims", "/v1/quotas",
             "/v1/usage"]


def _beside_a_rebuild(ledger: LedgerHandle, work: Callable[[], T]) -> T:
    """Run ``work`` in a thread while another session rebuilds the read models as a rebuild's ``TRUNCATE`` locks
    them: it holds the first table, waits until ``work`` waits for a lock, then takes the rest, fills every table
    again with the same rows and commits. A reader that had read a later table first and waited for the first
    deadlocked with it, and PostgreSQL aborted one of the two."""
    done: list[T] = []
    tables = runner.table_names()
    with ledger.engine.connect() as rebuild, ledger.engine.connect() as watcher:
        for table in tables:
            rebuild.execute(text(f"CREATE TEMPORARY TABLE kept_{table} ON COMMIT DROP AS SELECT * FROM {table}"))
        rebuild.execute(text(f"TRUNCATE {tables[0]}"))
        thread = threading.Thread(target=lambda: done.append(work()), daemon=True)
        thread.start()
        blocked = _wait_until_blocked_on_a_lock(watcher)
        rebuild.execute(text(f"TRUNCATE {', '.join(tables[1:])}"))
        for table in tables:
            rebuild.execute(text(f"INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT * FROM kept_{table}"))
        rebuild.commit()
    thread.join(WAIT_S)
    assert blocked
    [result] = done
    return result


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_request_that_reads_several_read_models_during_a_rebuild_waits_and_never_deadlocks_with_it(
        seeded: LedgerHandle, client: TestClient[Litestar], path: str) -> None:
    params = ({"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"} if path == "/v1/usage"
              else {"at": AT})
    before = client.get(path, params=params)
    assert before.status_code == 200, before.text

    during = _beside_a_rebuild(seeded, lambda: client.get(path, params=params))

    assert during.status_code == 200, during.text
    assert during.json() == before.json()


def test_the_report_snapshot_job_during_a_rebuild_waits_and_never_deadlocks_with_it(seeded: LedgerHandle) -> None:
    at = parse_time(AT)
    before = services.take_report_snapshots(seeded.db, at=at, config=DEFAULT)
    assert before["idleClaims"] + before["quotaRows"] + before["pendingClasses"] > 0

    during = _beside_a_rebuild(seeded, lambda: services.take_report_snapshots(seeded.db, at=at, config=DEFAULT))

    assert during == before  # idempotent per instant: the same rows again


def test_a_query_that_takes_a_plain_reading_connection_waits_for_a_rebuild_and_never_deadlocks_with_it(
        seeded: LedgerHandle) -> None:
    def read_last_table_then_first() -> tuple[int, int]:
        # The order that deadlocked: a table the rebuild truncates last, then the one it holds first.
        last, first = runner.table_names()[-1], runner.table_names()[0]
        with seeded.db.reading() as conn:
            return (conn.execute(text(f"SELECT count(*) FROM {last}")).scalar_one(),
                    conn.execute(text(f"SELECT count(*) FROM {first}")).scalar_one())

    before = read_last_table_then_first()
    assert before[0] > 0 and before[1] > 0

    assert _beside_a_rebuild(seeded, read_last_table_then_first) == before


def test_reads_of_the_event_store_and_the_checkpoints_do_not_wait_for_a_rebuild(seeded: LedgerHandle) -> None:
    head = len(seeded.rows("events"))
    lags: list[dict[str, int]] = []
    counts: list[int] = []

    def read() -> None:
        lags.append(services.projection_lag(seeded.db))
        counts.append(services.events_to_apply(seeded.db))
        counts.append(len(seeded.db.read_all(after=GlobalPosition(0), limit=head + 1)))

    with seeded.engine.connect() as rebuild:
        rebuild.execute(text(f"TRUNCATE {', '.join(runner.table_names())}"))
        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        thread.join(WAIT_S)  # answered while the rebuild still holds every read model
        rebuild.rollback()
    assert [set(lag.values()) for lag in lags] == [{0}]
    assert counts == [0, head]


WINDOW = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}
READ_MODEL_REQUESTS = [*[(path, WINDOW if path == "/v1/usage" else {"at": AT}) for path in ENDPOINTS],
                       ("/v1/claims/ml-serve/shared-gpu/history", {}),
                       ("/v1/devices/gpu.example.com/lab-node/gpu-1/timeline", WINDOW)]


@pytest.mark.parametrize(("path", "params"), READ_MODEL_REQUESTS)
def test_a_request_that_waits_longer_for_a_rebuild_than_the_api_allows_answers_503_with_retry_after(
        seeded: LedgerHandle, path: str, params: dict[str, str]) -> None:
    with TestClient(create_app(db=seeded.db, config=DEFAULT, rebuild_wait_s=0.2)) as client:
        with seeded.engine.connect() as rebuild:
            rebuild.execute(text(f"TRUNCATE {', '.join(runner.table_names())}"))
            during = client.get(path, params=params)
            # These read the event store and the checkpoints only: they answer at once.
            ready, audit_log = client.get("/readyz"), client.get("/v1/events", params={"limit": 5})
            metrics = client.get("/metrics")
            rebuild.rollback()
        after = client.get(path, params=params)

    assert during.status_code == 503, during.text
    assert during.headers["retry-after"] == "1"  # 0.2 s, in whole seconds, at least 1
    assert during.headers["content-type"].startswith("application/problem+json")
    problem = during.json()
    assert problem["status"] == 503
    assert problem["detail"].startswith("the read models are being rebuilt")
    assert "waited 0.2 s" in problem["detail"]
    assert ready.status_code == 200, ready.text
    assert (ready.json()["status"], ready.json()["rebuilding"]) == ("ready", True)  # ready: its 503s say why
    assert "dra_ledger_read_models_rebuilding 1.0" in metrics.text
    assert audit_log.status_code == 200 and len(audit_log.json()["events"]) == 5, audit_log.text
    assert after.status_code == 200, after.text


def test_the_api_waits_for_the_read_models_only_on_its_own_copy_of_the_database(seeded: LedgerHandle) -> None:
    app = create_app(db=seeded.db, config=DEFAULT, rebuild_wait_s=3)
    served: LedgerDatabase = app.state.ledger.db
    assert (served.read_models_wait_s, served.engine) == (3, seeded.db.engine)
    assert seeded.db.read_models_wait_s is None  # the CLI's and the jobs' reads wait for a rebuild to end
    assert create_app(db=seeded.db, config=DEFAULT).state.ledger.db.read_models_wait_s == REBUILD_WAIT_S


def test_a_bounded_wait_for_the_read_models_leaves_the_read_itself_under_the_sessions_lock_timeout(
        seeded: LedgerHandle) -> None:
    bounded = replace(seeded.db, read_models_wait_s=0.2)
    with bounded.reading() as conn:
        in_read = conn.execute(text("SHOW lock_timeout")).scalar_one()
    with seeded.db.reading() as conn:
        session = conn.execute(text("SHOW lock_timeout")).scalar_one()
    assert in_read == session


def test_a_bounded_wait_for_the_read_models_raises_once_it_passes(seeded: LedgerHandle) -> None:
    bounded = replace(seeded.db, read_models_wait_s=0.3)
    with seeded.engine.connect() as rebuild:
        rebuild.execute(text(f"TRUNCATE {runner.table_names()[-1]}"))
        with pytest.raises(ReadModelsRebuilding, match=r"waited 0\.3 s for them") as raised, bounded.snapshot():
            pass
        rebuild.rollback()
    assert raised.value.retry_after_s == 1


def test_a_rebuild_lets_a_view_query_that_locks_out_of_order_pass_instead_of_deadlocking_with_it(
        seeded: LedgerHandle) -> None:
    # reporting.claim_consumers locks claim_consumers, then claims: the reverse of the rebuild's order. A rebuild
    # that took claims and then waited for claim_states (held by a long reader) met such a query holding
    # claim_consumers, and PostgreSQL aborted the query as a deadlock once the long reader let go.
    def grafana() -> int:
        with seeded.engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM reporting.claim_consumers")).scalar_one())

    before, rows = grafana(), seeded.snapshot()
    assert before > 0
    results: dict[str, object] = {}

    def run(name: str, work: Callable[[], object]) -> Callable[[], None]:
        def target() -> None:
            try:
                results[name] = work()
            except OperationalError as e:  # a deadlock's victim
                results[name] = e
        return target

    waited = threading.Event()
    with seeded.engine.connect() as long_reader:
        long_reader.execute(text("LOCK TABLE claim_states IN ACCESS SHARE MODE"))
        rebuild = threading.Thread(target=run("rebuild", lambda: services.rebuild(
            seeded.db, occupancy_counts=False, waiting=lambda _: waited.set())), daemon=True)
        rebuild.start()
        assert waited.wait(WAIT_S)  # the rebuild said it waits for the long reader
        query = threading.Thread(target=run("grafana", grafana), daemon=True)
        query.start()
        query.join(WAIT_S)  # answered while the long reader still keeps the rebuild out
        answered_first = "grafana" in results and "rebuild" not in results
        long_reader.rollback()
        rebuild.join(WAIT_S)

    assert answered_first, results
    assert results == {"grafana": before, "rebuild": len(seeded.rows("events"))}
    assert seeded.snapshot() == rows


def test_a_rebuild_kept_out_past_its_patience_waits_for_the_locks_and_completes(
        seeded: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "TRUNCATE_LOCK_PATIENCE_S", 0.3)
    rows = seeded.snapshot()
    applied: list[int] = []
    with seeded.engine.connect() as long_reader, seeded.engine.connect() as watcher:
        long_reader.execute(text("LOCK TABLE claim_states IN ACCESS SHARE MODE"))
        rebuild = threading.Thread(target=lambda: applied.append(services.rebuild(seeded.db, occupancy_counts=False)),
                                   daemon=True)
        rebuild.start()
        # Bounded attempts send "SET LOCAL lock_timeout ...; LOCK TABLE ...": the unbounded wait is a LOCK alone.
        waits_without_bound = _seen_within_wait(watcher, (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND query LIKE 'LOCK TABLE % IN ACCESS EXCLUSIVE MODE'"))
        long_reader.rollback()
        rebuild.join(WAIT_S)

    assert waits_without_bound
    assert applied == [len(seeded.rows("events"))]
    assert seeded.snapshot() == rows


def test_a_rebuild_chosen_as_a_deadlocks_victim_in_its_plain_wait_starts_over_and_completes(
        seeded: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past its patience the rebuild waits in line, holding the tables it got: a reader's statements that lock out of
    # order then close a cycle. Made its victim (the reader's deadlock_timeout is longer), it failed with "deadlock
    # detected"; now it rolls back to its savepoint, lets the reader finish, and takes the tables again.
    monkeypatch.setattr(runner, "TRUNCATE_LOCK_PATIENCE_S", 0.3)
    rows = seeded.snapshot()
    applied: list[object] = []

    def rebuild() -> None:
        try:
            applied.append(services.rebuild(seeded.db, occupancy_counts=False))
        except OperationalError as e:
            applied.append(e)

    def waiting_in_line(watcher: Connection, table: str) -> bool:
        return _seen_within_wait(watcher, (
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE NOT l.granted "
            "AND l.mode = 'AccessExclusiveLock' AND l.relation = CAST(:t AS regclass) "
            "AND a.query LIKE 'LOCK TABLE %'"), {"t": table})

    with seeded.engine.connect() as first, seeded.engine.connect() as reader, seeded.engine.connect() as watcher:
        first.execute(text("LOCK TABLE pod_phases IN ACCESS SHARE MODE"))  # keeps the rebuild out past its patience
        thread = threading.Thread(target=rebuild, daemon=True)
        thread.start()
        assert waiting_in_line(watcher, "pod_phases")  # holding the tables before it, device_inventory among them
        reader.execute(text("SET deadlock_timeout = '30s'"))  # the rebuild's check fires first: it is the victim
        consumers = reader.execute(text("SELECT count(*) FROM reporting.claim_consumers")).scalar_one()  # claims
        first.rollback()
        assert waiting_in_line(watcher, "claims")  # took pod_phases, now waits for the reader's claims
        units = reader.execute(text("SELECT count(*) FROM reporting.occupancy_units")).scalar_one()  # device_inventory
        reader.rollback()
        thread.join(WAIT_S)

    assert consumers > 0 and units > 0
    assert applied == [len(seeded.rows("events"))]
    assert seeded.snapshot() == rows


def test_once_a_request_found_a_rebuild_the_next_ones_answer_503_without_waiting_until_it_commits(
        seeded: LedgerHandle) -> None:
    app = create_app(db=seeded.db, config=DEFAULT, rebuild_wait_s=0.3)
    served: LedgerDatabase = app.state.ledger.db
    with TestClient(app) as client:
        with seeded.engine.connect() as rebuild:
            rebuild.execute(text(f"TRUNCATE {', '.join(runner.table_names())}"))
            first = client.get("/v1/claims", params={"at": AT})
            # A snapshot read (occupancy) and a plain one (shared) now ask pg_locks first and answer at once.
            then = [client.get(path, params={"at": AT}) for path in ("/v1/occupancy", "/v1/shared")]
            seen_during = served.rebuild_seen
            rebuild.rollback()
        after = client.get("/v1/occupancy", params={"at": AT})

    assert first.status_code == 503 and "this read waited 0.3 s for them" in first.json()["detail"]
    assert [r.status_code for r in then] == [503, 503]
    assert all(r.json()["detail"].startswith("the read models are still being rebuilt") for r in then)
    assert all(r.headers["retry-after"] == "1" for r in then)
    assert seen_during
    assert after.status_code == 200 and after.json()["totals"]["devices"] == 8
    assert not served.rebuild_seen  # the first read that found them free cleared it


def test_a_rebuild_waiting_in_line_for_its_first_table_counts_as_holding_the_read_models(
        seeded: LedgerHandle) -> None:
    # Behind a pg_dump (or any long reader) of its first table, a rebuild's LOCK holds nothing granted, yet every
    # read after it queues behind it: the API's fast 503 and /readyz must see it.
    first = runner.table_names()[0]
    with seeded.engine.connect() as dump, seeded.engine.connect() as rebuild, seeded.engine.connect() as watcher:
        dump.execute(text(f"LOCK TABLE {first} IN ACCESS SHARE MODE"))
        before = services.health(seeded.db).rebuilding
        thread = threading.Thread(target=lambda: rebuild.execute(text(f"LOCK TABLE {first} IN ACCESS EXCLUSIVE MODE")),
                                  daemon=True)
        thread.start()
        assert _wait_until_blocked_on_a_lock(watcher)
        in_line = services.health(seeded.db).rebuilding
        dump.rollback()
        thread.join(WAIT_S)
        rebuild.rollback()
    after = services.health(seeded.db).rebuilding

    assert (before, in_line, after) == (False, True, False)
