"""The occupancy counts (``ledger.projections.counts``) equal the totals aggregated from the intervals at
every instant where they change, on the seed lab and on a simulated fleet; late events and a pod's first
phase forget what they change; a refresh covers again; the lookup reads one index entry."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, text

from ledger import services
from ledger.projections import counts, queries
from ledger.projections.base import clusters
from ledger.simulate import write_history
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests.factories import at as minutes_after_t0
from tests.factories import claim, dig, gpu, history, namespace, pod, resource_slice, stamp, uid
from tests.integration.test_simulate import SMALL
from tests.paths import HISTORIES

Totals = dict[str, int]


def aggregated(conn: Connection, at: datetime, cluster: str | None) -> Totals:
    """The totals at ``at`` from the intervals (the statement ``queries.occupancy_totals`` falls back to),
    and the devices held at ``at`` that no inventory row covers then."""
    scope = queries.OccupancyScope(cluster=cluster)
    row = conn.execute(text(queries.occupancy_totals_statement(scope)), {"at": at, **scope.params()}).one()
    off_slice = conn.execute(text(
        "SELECT count(DISTINCT (a.cluster, a.driver, a.pool, a.device)) FROM device_allocations a "
        "WHERE a.valid @> :at AND (CAST(:c AS text) IS NULL OR a.cluster = :c) AND NOT EXISTS (SELECT 1 "
        " FROM device_inventory i WHERE i.cluster = a.cluster AND i.driver = a.driver AND i.pool = a.pool "
        " AND i.device = a.device AND i.valid @> :at)"), {"at": at, "c": cluster}).scalar_one()
    return {"devices": row.devices, "allocated": row.allocated, "shared": row.shared, "off_slice": off_slice}


def steps(conn: Connection, cluster: str) -> list[tuple[datetime, Totals]]:
    """The stored step function of ``cluster`` (the row at ``-infinity`` left out)."""
    return [(r.at, {"devices": r.devices, "allocated": r.allocated, "shared": r.shared, "off_slice": r.off_slice})
            for r in conn.execute(text(
        "SELECT at, devices, allocated, shared, off_slice FROM occupancy_counts WHERE cluster = :c AND isfinite(at) "
        "ORDER BY at"), {"c": cluster})]


def probes(conn: Connection, cluster: str, rows: list[tuple[datetime, Totals]]) -> list[datetime]:
    """Each stored change instant, the microsecond before it and the middle of each step; and every bound of
    the four source tables' intervals and the microsecond before it (a change the counts missed is there)."""
    out: set[datetime] = set()
    for i, (at, _) in enumerate(rows):
        out |= {at, at - timedelta(microseconds=1)}
        if i + 1 < len(rows):
            out.add(at + (rows[i + 1][0] - at) / 2)
    bounds = " UNION ".join(
        f"SELECT lower(valid) AS t FROM {table} WHERE cluster = :c UNION SELECT upper(valid) FROM {table} "
        "WHERE cluster = :c" for table in ("device_inventory", "device_allocations", "claim_consumers", "pod_phases"))
    for t in conn.execute(text(f"SELECT t FROM ({bounds}) b WHERE t IS NOT NULL"), {"c": cluster}).scalars():
        out |= {t, t - timedelta(microseconds=1)}
    return sorted(out)


def assert_counts_equal_the_aggregate(ledger: LedgerHandle, *, minimum_steps: int) -> int:
    """Refresh, then compare the counts with the aggregate at every probe; returns the probes checked."""
    services.refresh_occupancy_counts(ledger.db)
    checked = 0
    with ledger.engine.connect() as conn:
        rows = steps(conn, ledger.cluster)
        assert len(rows) >= minimum_steps
        for at in probes(conn, ledger.cluster, rows):
            want = aggregated(conn, at, ledger.cluster)
            assert counts.totals_at(conn, at, ledger.cluster) == want, at
            assert counts.totals_at(conn, at, None) == want, at  # one cluster: the sum over all is the same
            checked += 1
    return checked


def test_the_counts_equal_the_aggregate_at_every_change_of_the_seed_lab(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    # The seed lab shares a GPU between claims, has a claim with two consumers and MIG partitions.
    assert assert_counts_equal_the_aggregate(ledger, minimum_steps=8) > 20
    with ledger.engine.connect() as conn:
        kinds = conn.execute(text("SELECT max(devices), max(allocated), max(shared) FROM occupancy_counts")).one()
    assert all(k > 0 for k in kinds)  # every total moved at least once, so every kind was compared


def test_the_counts_equal_the_aggregate_on_a_simulated_fleet(ledger: LedgerHandle, tmp_path: Path) -> None:
    # MIG counter sets, driver restarts, shared and multi-consumer claims, extended resources, idle claims.
    write_history(SMALL, tmp_path / "fleet.jsonl")
    ledger.replay(tmp_path / "fleet.jsonl")
    assert assert_counts_equal_the_aggregate(ledger, minimum_steps=100) > 300
    with ledger.engine.connect() as conn:
        rows = steps(conn, ledger.cluster)
    # Where the counts say no device is off-slice, a page skips looking for them: it must list the same.
    none = [at for at, totals in rows if totals["off_slice"] == 0 and totals["allocated"] > 0]
    assert_pages_equal_the_aggregate_path(ledger, none[:: max(1, len(none) // 8)][:8])


def assert_pages_equal_the_aggregate_path(ledger: LedgerHandle, instants: list[datetime]) -> list[JSONObject]:
    """Whole occupancy bodies at ``instants`` with the counts covering them equal those without; returns them."""
    with ledger.engine.connect() as conn:
        counted = [queries.occupancy_all(conn, at=at, cluster=ledger.cluster) for at in instants]
        conn.execute(text("UPDATE occupancy_count_coverage SET valid_before = '-infinity'"))  # aggregate only
        for at, body in zip(instants, counted, strict=True):
            assert queries.occupancy_all(conn, at=at, cluster=ledger.cluster) == body, at
        conn.rollback()
    return counted


def test_a_device_held_while_its_slice_is_gone_is_counted_and_listed_off_slice(ledger: LedgerHandle,
                                                                              tmp_path: Path) -> None:
    # gpu-0 is held from minute 5; its driver withdraws the slice at minute 20 and publishes it again at 30.
    slice_uid, claim_uid = uid("slice"), uid("claim")
    published = resource_slice(name="s", devices=[gpu("gpu-0"), gpu("gpu-1")], slice_uid=slice_uid)
    again = resource_slice(name="s", devices=[gpu("gpu-0"), gpu("gpu-1")], generation=2)
    dig(again, "metadata")["creationTimestamp"] = stamp(30)
    ledger.replay(history(tmp_path / "restart.jsonl", [
        ("ADDED", published, 0), ("ADDED", claim(name="one", claim_uid=claim_uid, results=["gpu-0"]), 5),
        ("DELETED", published, 20), ("ADDED", again, 30)]))
    services.refresh_occupancy_counts(ledger.db)
    gone, back = minutes_after_t0(25), minutes_after_t0(35)
    with ledger.engine.connect() as conn:
        assert counts.totals_at(conn, gone, ledger.cluster) == {"devices": 1, "allocated": 1, "shared": 0,
                                                                 "off_slice": 1}
        assert counts.totals_at(conn, back, ledger.cluster) == {"devices": 2, "allocated": 1, "shared": 0,
                                                                 "off_slice": 0}
        assert counts.totals_at(conn, gone, ledger.cluster) == aggregated(conn, gone, ledger.cluster)
    at_gone, at_back = assert_pages_equal_the_aggregate_path(ledger, [gone, back])
    assert listed(at_gone) == [("gpu-0", True)]
    assert listed(at_back) == [("gpu-0", False), ("gpu-1", False)]


def test_a_device_held_off_slice_only_by_admin_access_is_listed_but_neither_counted_nor_free(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # gpu-1 is held by "train" and gpu-2 by the adminAccess claim "monitor" from minute 5; the slice
    # publishing both is deleted at minute 20. Afterwards gpu-1 is held off-slice (a device, allocated)
    # and gpu-2 is in no inventory and occupied by nobody: listed with its holder, but not a device, so
    # not free either (DESIGN §5: adminAccess never occupies; §11.4: only held devices count off-slice).
    published = resource_slice(name="s", devices=[gpu("gpu-1"), gpu("gpu-2")], slice_uid=uid("slice"))
    monitor = claim(name="monitor", claim_uid=uid("claim"), results=["gpu-2"], allocated_at=5)
    results = dig(monitor, "status", "allocation", "devices")["results"]
    assert isinstance(results, list) and isinstance(results[0], dict)
    results[0]["adminAccess"] = True
    ledger.replay(history(tmp_path / "admin.jsonl", [
        ("ADDED", namespace("ml", "vision"), 0), ("ADDED", published, 0),
        ("ADDED", claim(name="train", claim_uid=uid("claim"), results=["gpu-1"], allocated_at=5), 5),
        ("ADDED", monitor, 5), ("DELETED", published, 20)]))
    on, gone = minutes_after_t0(10), minutes_after_t0(25)
    # By hand. Minute 10: 2 devices in the inventory, gpu-1 allocated -> 2 / 1 / free 1. Minute 25: no
    # inventory; gpu-1 held off-slice by train counts, gpu-2 held by monitor alone does not -> 1 / 1 / free 0.
    before = {"devices": 2, "allocated": 1, "free": 1, "shared": 0}
    after = {"devices": 1, "allocated": 1, "free": 0, "shared": 0}
    aggregate_only: Any = ledger.occupancy(gone)  # counts not refreshed yet: the aggregate answers
    assert aggregate_only["totals"] == after
    services.refresh_occupancy_counts(ledger.db)
    with ledger.engine.connect() as conn:
        assert counts.totals_at(conn, on, ledger.cluster) == {"devices": 2, "allocated": 1, "shared": 0,
                                                               "off_slice": 0}
        # off_slice still counts both held devices: it tells a page to look for them, and both are listed.
        assert counts.totals_at(conn, gone, ledger.cluster) == {"devices": 1, "allocated": 1, "shared": 0,
                                                                 "off_slice": 2}
        assert counts.totals_at(conn, gone, ledger.cluster) == aggregated(conn, gone, ledger.cluster)
        # A team-limited token (team "vision" holds both claims) gets the same totals.
        scoped = queries.occupancy_all(conn, at=gone, cluster=ledger.cluster, teams=["vision"])
        assert scoped["totals"] == after
    at_on, at_gone = assert_pages_equal_the_aggregate_path(ledger, [on, gone])
    assert at_on["totals"] == before and at_gone["totals"] == after
    assert listed(at_gone) == [("gpu-1", True), ("gpu-2", True)]
    body: Any = at_gone
    assert [(a["claim"], a["adminAccess"]) for a in body["devices"][1]["allocations"]] == [("monitor", True)]


def listed(body: JSONObject) -> list[tuple[object, object]]:
    """(device, offSlice) of every device an occupancy body lists."""
    devices = body["devices"]
    assert isinstance(devices, list)
    return [(d["device"], d["offSlice"]) for d in devices if isinstance(d, dict)]


def test_a_late_event_forgets_the_counts_from_its_time_and_a_refresh_covers_again(ledger: LedgerHandle,
                                                                                  tmp_path: Path) -> None:
    seed = HISTORIES / "seed-lab.jsonl"
    ledger.replay(seed)
    services.refresh_occupancy_counts(ledger.db)
    # pick-seven holds its GPU from 09:05 on; a DELETED of it recorded late, observed at 10:15.
    late = json.loads(seed.read_text().splitlines()[11])
    late.update(type="DELETED", observedAt="2026-11-02T10:15:00Z")
    (tmp_path / "late.jsonl").write_text(json.dumps(late) + "\n")
    ledger.replay(tmp_path / "late.jsonl")
    released = datetime.fromisoformat("2026-11-02T10:15:00+00:00")
    with ledger.engine.connect() as conn:
        valid_before = conn.execute(text("SELECT valid_before FROM occupancy_count_coverage WHERE cluster = :c"),
                                    {"c": ledger.cluster}).scalar_one()
        assert valid_before == released
        assert conn.execute(text("SELECT count(*) FROM occupancy_counts WHERE at >= :t"), {"t": released}).scalar() == 0
        before, after = released - timedelta(minutes=5), released + timedelta(minutes=5)
        assert counts.totals_at(conn, before, ledger.cluster) == aggregated(conn, before, ledger.cluster)
        assert counts.totals_at(conn, after, ledger.cluster) is None  # not covered: the aggregate answers
        held_after = aggregated(conn, after, ledger.cluster)
        assert held_after["allocated"] == aggregated(conn, before, ledger.cluster)["allocated"] - 1
    assert services.refresh_occupancy_counts(ledger.db)[ledger.cluster] > 0
    with ledger.engine.connect() as conn:
        assert counts.totals_at(conn, after, ledger.cluster) == held_after
    assert_counts_equal_the_aggregate(ledger, minimum_steps=8)


def test_a_pods_first_phase_recorded_late_forgets_its_consumers_whole_reservation(ledger: LedgerHandle,
                                                                                  tmp_path: Path) -> None:
    # One GPU held by a claim reserved for two pods from minute 10. Neither pod is known at first, so both
    # consumers are live and the GPU is shared. At minute 40 the first pod's phase arrives (created at
    # minute 30): a pod known to the ledger is live only in a recorded phase, so before minute 30 it was
    # not, and the GPU was not shared from minute 10 on: earlier than the pod event itself.
    claim_uid, first, second = uid("claim"), uid("pod"), uid("pod")
    held = claim(name="pair", claim_uid=claim_uid, results=["gpu-0"])
    reserved = claim(name="pair", claim_uid=claim_uid, results=["gpu-0"], reserved=[("a", first), ("b", second)])
    ledger.replay(history(tmp_path / "first.jsonl", [
        ("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0), ("ADDED", held, 5),
        ("MODIFIED", reserved, 10)]))
    services.refresh_occupancy_counts(ledger.db)
    at = minutes_after_t0(20)
    with ledger.engine.connect() as conn:
        assert counts.totals_at(conn, at, ledger.cluster) == {"devices": 1, "allocated": 1, "shared": 1, "off_slice": 0}
    late_pod = pod(name="a", pod_uid=first, claim_name="pair")
    dig(late_pod, "metadata")["creationTimestamp"] = stamp(30)
    ledger.replay(history(tmp_path / "pod.jsonl", [("ADDED", late_pod, 40)]))
    with ledger.engine.connect() as conn:
        assert aggregated(conn, at, ledger.cluster) == {"devices": 1, "allocated": 1, "shared": 0, "off_slice": 0}
        assert counts.totals_at(conn, at, ledger.cluster) is None  # forgotten from minute 10, not 30
    services.refresh_occupancy_counts(ledger.db)
    with ledger.engine.connect() as conn:
        assert counts.totals_at(conn, at, ledger.cluster) == {"devices": 1, "allocated": 1, "shared": 0, "off_slice": 0}
    # A later phase of the same pod changes liveness only from its own time on: coverage stays before it.
    done = pod(name="a", pod_uid=first, claim_name="pair", phase="Succeeded")
    dig(done, "metadata")["creationTimestamp"] = stamp(30)
    ledger.replay(history(tmp_path / "done.jsonl", [("MODIFIED", done, 50)]))
    with ledger.engine.connect() as conn:
        valid_before = conn.execute(text("SELECT valid_before FROM occupancy_count_coverage")).scalar_one()
        assert valid_before == minutes_after_t0(50)
        assert counts.totals_at(conn, at, ledger.cluster) == aggregated(conn, at, ledger.cluster)


def test_a_rebuild_forgets_the_counts_and_computes_them_again(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    services.refresh_occupancy_counts(ledger.db)
    with ledger.engine.connect() as conn:
        before = steps(conn, ledger.cluster)
    services.rebuild(ledger.db, occupancy_counts=False)
    with ledger.engine.connect() as conn:  # the read models were replaced: nothing is answered from old counts
        assert conn.execute(text("SELECT count(*) FROM occupancy_counts")).scalar_one() == 0
        assert conn.execute(text("SELECT valid_before = '-infinity' FROM occupancy_count_coverage")).scalar_one()
    services.rebuild(ledger.db)
    with ledger.engine.connect() as conn:
        assert steps(conn, ledger.cluster) == before
        assert conn.execute(text("SELECT valid_before = 'infinity' FROM occupancy_count_coverage")).scalar_one()


def test_totals_at_any_instant_read_one_entry_of_the_counts_index(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    services.refresh_occupancy_counts(ledger.db)
    with ledger.engine.begin() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))  # a tiny table: make the plan show the index
        plan = "\n".join(str(r[0]) for r in conn.execute(text("EXPLAIN " + counts.TOTALS_AT_SQL),
                                                          {"at": datetime.now(UTC), "cluster": ledger.cluster}))
    assert "Index Scan Backward using occupancy_counts_pkey" in plan, plan


def test_totals_over_all_clusters_need_every_cluster_covered_and_sum_them(ledger: LedgerHandle) -> None:
    other = LedgerHandle(engine=ledger.engine, cluster="other")
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    other.replay(HISTORIES / "seed-lab.jsonl")
    at = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
    with ledger.engine.connect() as conn:
        assert clusters(conn) == ["default", "other"]  # the skip scan of the events' cluster index finds both
    services.refresh_occupancy_counts(ledger.db, cluster=ledger.cluster)
    with ledger.engine.connect() as conn:
        one = counts.totals_at(conn, at, ledger.cluster)
        assert one == aggregated(conn, at, ledger.cluster)
        assert counts.totals_at(conn, at, None) is None  # "other" is not covered: the aggregate answers
    assert services.refresh_occupancy_counts(ledger.db) == {"other": stored_rows(ledger, "other")}
    with ledger.engine.connect() as conn:
        both = counts.totals_at(conn, at, None)
        assert both == aggregated(conn, at, None)
    assert one is not None and both == {k: 2 * v for k, v in one.items()}  # the same lab twice
    assert one["devices"] == 8  # seed-lab.expected.json: 8 GPUs on the one node


def stored_rows(ledger: LedgerHandle, cluster: str) -> int:
    """How many ``occupancy_counts`` rows ``cluster`` has (the one at ``-infinity`` included)."""
    with ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM occupancy_counts WHERE cluster = :c"),
                                {"c": cluster}).scalar_one())


def test_a_cluster_the_ledger_holds_nothing_of_gets_no_counts_and_no_coverage_row(ledger: LedgerHandle) -> None:
    # `jobs --once --cluster nope` left a coverage row (and "1 occupancy count rows") for a mistyped name.
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    assert services.has_events(ledger.db, ledger.cluster)
    assert not services.has_events(ledger.db, "nope")

    assert services.refresh_occupancy_counts(ledger.db, cluster="nope") == {}
    first = services.refresh_occupancy_counts(ledger.db, cluster=ledger.cluster)
    assert list(first) == [ledger.cluster] and first[ledger.cluster] > 0
    assert services.refresh_occupancy_counts(ledger.db, cluster=ledger.cluster) == {}  # covered: nothing to do
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT cluster FROM occupancy_count_coverage ORDER BY cluster")).scalars().all() \
            == [ledger.cluster]
