"""The fleet simulator is deterministic and its histories replay to what it says it generated; the
set-based projections give the rows of event-at-a-time application; interval queries use GiST."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from ledger import services
from ledger.projections import queries, runner
from ledger.simulate import FleetSpec, SimulationSummary, simulate, write_history
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests.paths import HISTORIES, REAL

SMALL = FleetSpec(nodes=6, gpus_per_node=4, hours=6, seed=7, mig_node_fraction=0.5, restarts_per_node_day=6.0,
                  relabels=1, idle_fraction=0.1, pending_fraction=0.05)
"""Every behaviour at least once in a few hundred lines: MIG, restarts, a relabel, idle and pending claims."""


def _digest(spec: FleetSpec) -> str:
    return hashlib.sha256("\n".join(simulate(spec)).encode()).hexdigest()


def test_the_same_seed_gives_the_same_bytes_and_another_seed_another_history() -> None:
    assert _digest(SMALL) == _digest(SMALL)
    assert _digest(SMALL) != _digest(dataclasses.replace(SMALL, seed=8))


def test_the_small_fleet_exercises_every_behaviour() -> None:
    summary = SimulationSummary()
    for _ in simulate(SMALL, summary):
        pass
    assert summary.restarts >= 1 and summary.idle_claims >= 1 and summary.pending_claims >= 1
    assert {"deployment", "job", "shared", "extended", "mig", "nic", "multi"} <= set(summary.kinds)


def test_a_driver_restart_deletes_the_very_slice_it_published_before() -> None:
    added: set[str] = set()
    deleted: list[str] = []
    for text_line in simulate(SMALL):
        line = json.loads(text_line)
        obj = line["object"]
        if obj["kind"] == "ResourceSlice":
            (added.add if line["type"] == "ADDED" else deleted.append)(obj["metadata"]["uid"])
    assert deleted  # SMALL restarts drivers
    assert [uid for uid in deleted if uid not in added] == []


def test_a_simulated_history_replays_to_the_devices_and_allocations_it_reports(ledger: LedgerHandle,
                                                                               tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    summary = write_history(SMALL, path)
    report = ledger.replay(path)
    assert report.rejected == [] and report.lines == summary.lines
    with ledger.engine.connect() as conn:
        devices = conn.execute(text("SELECT count(DISTINCT (driver, pool, device)) FROM device_inventory")).scalar()
        allocations = conn.execute(text(
            "SELECT count(DISTINCT (claim_uid, driver, pool, device, coalesce(share_id, ''))) "
            "FROM device_allocations")).scalar()
        claims = conn.execute(text("SELECT count(*) FROM claims")).scalar()
        conflicts = conn.execute(text("SELECT count(*) FROM device_allocations WHERE conflict")).scalar()
    assert (devices, allocations, claims) == (summary.devices, summary.allocations, summary.claims)
    assert conflicts == 0  # the simulated scheduler never double-books a device


def test_set_based_projections_give_the_rows_of_one_event_at_a_time(ledger: LedgerHandle, tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    write_history(SMALL, path)
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    for fixture in sorted(REAL.glob("*.yaml")):
        ledger.replay(fixture)
    ledger.replay(path)
    live = ledger.snapshot()  # caught up in batches of 2000 by the set-based path
    runner.rebuild(ledger.engine, set_based=False)
    assert ledger.snapshot() == live
    runner.rebuild(ledger.engine, whole_history=False, batch_size=7)  # batch boundaries everywhere: same rows
    assert ledger.snapshot() == live
    runner.rebuild(ledger.engine)  # each table built once from the whole history: same rows
    assert ledger.snapshot() == live


def _plan(ledger: LedgerHandle, sql: str, params: dict[str, object], *, ordered: bool = False,
          by_condition: bool = False) -> str:
    with ledger.engine.begin() as conn:
        conn.execute(text("ANALYZE"))
        # A small table is cheapest to scan whole; forbid that so the plan shows whether the index
        # *can* serve the predicate (a query rewritten past the index would fall back to a seq scan).
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        if ordered:
            # Likewise sorting a few rows is cheap; forbid it so the plan shows whether an index *can*
            # deliver the rows in page order (a query it cannot serve keeps its Sort node).
            conn.execute(text("SET LOCAL enable_sort = off"))
            conn.execute(text("SET LOCAL enable_bitmapscan = off"))
        if by_condition:
            # Only bitmap scans, which need an index condition: a full walk of another index cannot stand
            # in for the interval index, so the plan names the index that serves ``valid @> T``.
            conn.execute(text("SET LOCAL enable_indexscan = off"))
            conn.execute(text("SET LOCAL enable_indexonlyscan = off"))
        return "\n".join(str(r[0]) for r in conn.execute(text(f"EXPLAIN {sql}"), params))


def _sorts_everything(plan: str) -> bool:
    """Whether the plan has a full Sort node (an Incremental Sort of presorted index order is bounded)."""
    return any(line.strip().removeprefix("->").strip().startswith("Sort  (") for line in plan.splitlines())


def test_occupancy_and_usage_queries_use_the_interval_indexes(ledger: LedgerHandle, tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    write_history(SMALL, path)
    ledger.replay(path)
    at = SMALL.start + timedelta(hours=2)
    # The very statements ledger.projections.queries.occupancy and .usage run, with their parameters.
    scope = queries.OccupancyScope(cluster="default")
    params: dict[str, object] = {"at": at, "n": 101, **scope.params()}
    everywhere = queries.OccupancyScope()  # no cluster: no key-index condition competes with the interval
    totals = _plan(ledger, queries.occupancy_totals_statement(everywhere), {"at": at, **everywhere.params()},
                   by_condition=True)
    teams = queries.OccupancyScope(teams=frozenset({"team-0"}))
    team_totals = _plan(ledger, queries.occupancy_totals_statement(teams), {"at": at, **teams.params()},
                        by_condition=True)
    listed, off_slice = queries.occupancy_page_statements(scope, after=None)
    first_page = _plan(ledger, listed, params, ordered=True)
    off_page = _plan(ledger, off_slice, params, ordered=True)
    usage = _plan(ledger, "SELECT driver, pool, device FROM device_allocations WHERE NOT admin_access "
                          "AND NOT isempty(valid) AND valid && tstzrange(:start, :end, '[)') AND cluster = :cluster",
                  {"start": datetime(2026, 10, 2, tzinfo=UTC), "end": at, "cluster": "default"})
    # Totals over every device at T: the GiST interval indexes find the rows containing T.
    assert "device_inventory_valid_gist" in totals, totals
    assert "device_allocations_valid_gist" in totals, totals
    assert "claim_consumers_valid_gist" in totals, totals
    assert "device_allocations_valid_gist" in team_totals, team_totals
    # A page walks the device key order (btree) and stops after LIMIT rows: no sort of every device.
    assert "device_inventory_key_idx" in first_page and not _sorts_everything(first_page), first_page
    # Off-slice devices: allocations read through an index, each probed in the inventory by its key.
    assert "Seq Scan" not in off_page and "device_inventory_key_idx" in off_page, off_page
    assert "device_allocations_valid_gist" in usage, usage


def test_settled_occupancy_answers_as_the_query_and_follows_the_checkpoints(ledger: LedgerHandle,
                                                                             tmp_path: Path) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    later = datetime(2030, 1, 1, tzinfo=UTC)

    def settled_page(at: datetime) -> JSONObject:
        return services.occupancy_settled(ledger.db, at=at, limit=queries.OCCUPANCY_MAX_LIMIT).body

    first = settled_page(later)
    assert first == ledger.occupancy(later) | {"at": first["at"]}
    again = settled_page(later + timedelta(hours=1))  # from memory
    assert again == first | {"at": "2030-01-01T01:00:00Z"}
    before = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)  # inside the history: computed, never cached
    assert settled_page(before) == ledger.occupancy(before)
    path = tmp_path / "fleet.jsonl"
    write_history(SMALL, path)
    ledger.replay(path)  # the checkpoints move: the cached page is stale and must not be served
    assert settled_page(later) == ledger.occupancy(later)


def test_an_ingest_batch_looks_up_and_inserts_its_keys_in_time_order(ledger: LedgerHandle, tmp_path: Path) -> None:
    # An ingest batch's duplicate check and its inserts must follow the receive time, so that a batch reads the
    # last pages of the observation and event-id indexes, not one page per line anywhere in them (hashes).
    from sqlalchemy import event

    from ledger.store import postgres as pg

    path = tmp_path / "fleet.jsonl"
    write_history(SMALL, path)
    ledger.replay(path)
    with ledger.engine.connect() as conn:
        keys = [(r.observed_at, r.digest) for r in conn.execute(text(
            "SELECT observed_at, digest FROM observations ORDER BY observation_id DESC LIMIT 50"))]
        ids = [r.event_id for r in conn.execute(text("SELECT event_id FROM events ORDER BY global_position"))]
    assert len(ids) > 100 and all(t is not None for t, _ in keys)
    # Event ids begin with the receive time: in append order, each id's first 48 bits are at least the last's.
    prefixes = [i.bytes[:6] for i in ids]
    assert prefixes == sorted(prefixes) and len(set(prefixes)) > 10

    statements: list[tuple[str, object]] = []

    def capture(conn: object, cursor: object, statement: str, parameters: object, context: object,
                executemany: bool) -> None:
        statements.append((statement, parameters))

    event.listen(ledger.engine, "before_cursor_execute", capture)
    try:
        with ledger.engine.connect() as conn:
            found = pg.known_digests(conn, ledger.cluster, keys)
    finally:
        event.remove(ledger.engine, "before_cursor_execute", capture)
    assert found == {d: None for _, d in keys}
    [(sql, params)] = statements
    with ledger.engine.begin() as conn:
        conn.execute(text("ANALYZE observations"))
        conn.execute(text("SET LOCAL enable_seqscan = off"))  # a small table is cheapest to scan whole
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(str(r[0]) for r in cursor.fetchall())
    assert "observations_cluster_observed_at_digest_key" in plan, plan
    # Each key is one probe of the unique key, the receive time ahead of the digest in its index condition.
    conditions = [line for line in plan.splitlines() if "Index Cond" in line]
    assert any("observed_at = k.observed_at" in c and "digest = k.digest" in c for c in conditions), plan
