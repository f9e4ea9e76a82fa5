"""The fleet simulator is deterministic and its histories replay to what it says it generated; the
set-based projections give the rows of event-at-a-time application; interval queries use GiST."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
from sqlalchemy import text

from ledger import services
from ledger.projections import queries, runner
from ledger.simulate import FleetSpec, SimulationSummary, simulate, write_history
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests.paths import HISTORIES, REAL
from tests.statements import statements_run

SMALL = FleetSpec(nodes=6, gpus_per_node=4, hours=6, seed=7, mig_node_fraction=0.5, restarts_per_node_day=6.0,
                  relabels=1, idle_fraction=0.1, pending_fraction=0.05)
"""Every behaviour at least once in a few hundred lines: MIG, restarts, a relabel, idle and pending claims."""

MIG_12 = FleetSpec(nodes=4, gpus_per_node=12, hours=3, seed=1, mig_node_fraction=0.5, restarts_per_node_day=6.0)
"""Nodes 0 and 1 (round(4 x 0.5)) have MIG partitions on 12 GPUs: 12 counter sets a node, more than one
ResourceSlice may define (8), so each such pool is 1 slice of devices + 2 of counters (8 + 4)."""


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


def _slice_lines(spec: FleetSpec) -> list[tuple[str, Any]]:
    """(watch event type, object) of every ResourceSlice line of the history of ``spec``, in order."""
    lines = (json.loads(t) for t in simulate(spec))
    return [(line["type"], line["object"]) for line in lines if line["object"]["kind"] == "ResourceSlice"]


def test_no_simulated_slice_sets_both_devices_and_shared_counters() -> None:
    # resource.k8s.io/v1 (validation.go: "only one of `sharedCounters` or `devices` is allowed"; at most 8
    # counter sets a slice, 64 devices when they consume counters) refuses such a slice since Kubernetes 1.35.
    for spec in (SMALL, MIG_12):
        slices = _slice_lines(spec)
        assert any("sharedCounters" in obj["spec"] for _, obj in slices)
        for _, obj in slices:
            name, body = obj["metadata"]["name"], obj["spec"]
            assert not ("devices" in body and "sharedCounters" in body), name
            assert len(body.get("sharedCounters", [])) <= 8, name
            assert len(body.get("devices", [])) <= 64, name


def test_every_pool_generation_is_its_resource_slice_count_of_slices_and_defines_the_counters_consumed() -> None:
    slices = _slice_lines(MIG_12)
    by_generation: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
    live: dict[str, Any] = {}
    for kind, obj in slices:
        pool = obj["spec"]["pool"]
        if kind == "ADDED":
            by_generation[(obj["spec"]["driver"], pool["name"], pool["generation"])].append(obj["spec"])
            live[obj["metadata"]["uid"]] = obj
        else:
            assert kind == "DELETED" and live.pop(obj["metadata"]["uid"])["spec"]["pool"] == pool
    mig_pools = {"node-00000", "node-00001"}
    assert any(gen > 1 for driver, pool, gen in by_generation if pool in mig_pools)  # a MIG node restarted
    for (driver, pool, generation), specs in by_generation.items():
        expected = 3 if driver == "gpu.example.com" and pool in mig_pools else 1
        assert [s["pool"]["resourceSliceCount"] for s in specs] == [expected] * expected, (pool, generation)
        defined = [c["name"] for s in specs for c in s.get("sharedCounters", [])]
        consumed = {c["counterSet"] for s in specs for d in s.get("devices", []) for c in d.get("consumesCounters", [])}
        wanted = {f"gpu-{i}-counters" for i in range(12)} if expected == 3 else set()
        assert sorted(defined) == sorted(wanted) and consumed == wanted, (pool, generation)
    # A restart deletes every slice of the old generation: at the end each pool is one whole generation.
    pools_at_end: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for obj in live.values():
        pools_at_end[(obj["spec"]["driver"], obj["spec"]["pool"]["name"])].append(obj["spec"]["pool"])
    for key, pools in pools_at_end.items():
        assert len({p["generation"] for p in pools}) == 1 and len(pools) == pools[0]["resourceSliceCount"], key
    for _, obj in slices:  # the schemas of the oldest and newest servers resource.k8s.io/v1 is served by
        for version in ("1.34.0", "1.37.0"):
            kubernetes_validate.validate(obj, version, strict=True)


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


def test_counters_in_slices_of_their_own_count_each_gpu_once_with_its_partitions(ledger: LedgerHandle,
                                                                                  tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    summary = write_history(MIG_12, path)
    report = ledger.replay(path)
    assert report.rejected == [] and report.lines == summary.lines
    with ledger.engine.connect() as conn:
        devices = conn.execute(text("SELECT count(DISTINCT (driver, pool, device)) FROM device_inventory")).scalar()
    # 4 nodes x 12 GPUs, 2 of them with 4 partitions a GPU, and a NIC a node: 48 + 96 + 4.
    assert devices == summary.devices == 148
    # Restarts republish the devices first, then the counters: no device ever leaves its pool.
    assert ledger.events(["DeviceWithdrawn"]) == []
    end = MIG_12.start + timedelta(hours=MIG_12.hours)
    pools: list[Any] = [e.payload for e in ledger.events(["PoolGenerationObserved"])
                        if e.payload["driver"] == "gpu.example.com"]
    last = {str(p["pool"]): p for p in pools}  # the latest observation of each pool
    assert {p: (o["resourceSliceCount"], o["slices"], o["complete"], len(o["sharedCounters"]))
            for p, o in last.items()} == {"node-00000": (3, 3, True, 12), "node-00001": (3, 3, True, 12),
                                          "node-00002": (1, 1, True, 0), "node-00003": (1, 1, True, 0)}
    body: Any = services.shared(ledger.db, at=end, cluster=ledger.cluster)
    sets = {(c["pool"], c["counterSet"]): c for c in body["counterSets"]}
    assert sorted(sets) == sorted((f"node-0000{n}", f"gpu-{i}-counters") for n in (0, 1) for i in range(12))
    for c in sets.values():
        # The GPU (80Gi) and its 4 partitions (20Gi each) consume one counter set defined in another slice.
        assert [p["device"] for p in c["partitions"]] == [c["counterSet"].removesuffix("-counters")] + [
            c["counterSet"].replace("counters", f"mig-{j}") for j in range(4)]
        memory = c["counters"]["memory"]
        assert memory["total"] == 80 * 2**30 and memory["inUse"] + memory["free"] == memory["total"]
    # Totals count a partitioned GPU once: 48 GPUs and 4 NICs.
    occupancy: Any = ledger.occupancy(end)
    assert occupancy["totals"]["devices"] == 52


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


def test_the_claims_listing_walks_its_key_index_and_finds_live_claims_by_the_interval_index(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    path = tmp_path / "fleet.jsonl"
    write_history(SMALL, path)
    ledger.replay(path)
    params: dict[str, object] = {"at": SMALL.start + timedelta(hours=2), "chunk": 101, "cluster": "default",
                                 "k_cluster": "default", "k_namespace": "team-0", "k_name": "a", "k_uid": ""}
    # Every claim and the deleted ones: a page walks index claims_listing_idx from the previous page's last key
    # (an index condition, not a filter) and stops after LIMIT rows, so page 800 costs what page 1 does.
    for state in ("all", "deleted"):
        for after in (False, True):
            plan = _plan(ledger, queries.claims_listing_statement(state, cluster=True, after=after),
                         {**params, "state": state}, ordered=True)
            # Right under the LIMIT, no sort between: the index gives the page order (``all`` looks up each
            # claim's state in a subplan that sorts only that claim's intervals).
            assert plan.splitlines()[1].strip().startswith("->  Index Scan using claims_listing_idx"), plan
            assert ("Index Cond: ((ROW(cluster, namespace, name, uid) > ROW(" in plan) == after, plan
    # Pending and allocated claims: the claims alive at T, found through the GiST index of claim_states.
    for state in ("pending", "allocated"):
        plan = _plan(ledger, queries.claims_listing_statement(state, cluster=True, after=True),
                     {**params, "state": state}, by_condition=True)
        assert "claim_states_valid_gist" in plan, plan


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


def test_an_autocommit_read_runs_each_statement_on_its_own_and_hands_back_a_transactional_connection(
        ledger: LedgerHandle) -> None:
    # The settled occupancy's checkpoint read runs without BEGIN/ROLLBACK; the pool must not keep that mode.
    xid = text("SELECT pg_current_xact_id()::text")
    with ledger.db.reading(autocommit=True) as conn:
        first, second = conn.execute(xid).scalar(), conn.execute(xid).scalar()
        assert first != second  # a transaction per statement
    with ledger.db.reading() as conn:
        first, second = conn.execute(xid).scalar(), conn.execute(xid).scalar()
        assert first == second  # one transaction for the connection's statements, as before


def test_an_ingest_batch_looks_up_and_inserts_its_keys_in_time_order(ledger: LedgerHandle, tmp_path: Path) -> None:
    # An ingest batch's duplicate check and its inserts must follow the receive time, so that a batch reads the
    # last pages of the observation and event-id indexes, not one page per line anywhere in them (hashes).
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

    with statements_run(ledger.engine) as statements, ledger.engine.connect() as conn:
        found = pg.known_digests(conn, ledger.cluster, keys)
    assert found == {d: None for _, d in keys}
    # The keys are stored, so no key is newer than the newest stored observation: they are looked up.
    [(newest, _), (sql, params)] = statements
    assert "max(observed_at)" in newest
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
