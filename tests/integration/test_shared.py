"""Shared usage on real objects: consumable capacity with shareID, and partitionable devices (KEP-4815).

The expected splits are worked out by hand from the fixture files in ``../shared/fixtures/real/``:

- DeviceNetwork (``devicenetwork_*``): device ``my-network-macvlan-dummy0`` allows multiple
  allocations and publishes ``devicenetwork.io/maxVirtualInterfaces: 65535``; the real claim consumed
  ``"1"`` (shareID ca26c4ae-…). A second claim like it (another shareID, team ``net``) makes two
  allocations, each charged 1/65535 of the device. Both devices of the pool consume counter set
  ``dummy0`` (``mutual-exclusion: 65536``, defined in the other slice): macvlan takes 1, so 65535 stay
  free and the host-device (which needs all 65536) is not allocatable.
- cni-dra-driver (``cni-dra-driver_*``): device ``eth0`` (``maxVirtualDevices: 65535``), two shares
  whose results state no ``consumedCapacity`` -> split equally, 1/2 each.
- KEP-4815 (``kep4815_*``): ``gpu-0`` (40Gi) and four 10Gi partitions consume counter set
  ``gpu-0-counter-set`` (memory 40Gi). Partitions 0 and 1 allocated -> 20Gi in use, 20Gi free, each
  partition is 10/40 = 0.25 of the parent, gpu-0 is not allocatable, and occupancy counts the
  hardware once (1 device, 1 allocated).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from ledger import services
from ledger.projections import counter_sets, queries
from ledger.quantities import parse_quantity
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests.factories import at, history, namespace, rv, stamp, uid
from tests.paths import HISTORIES, REAL

T = at(30)


def real(name: str) -> Any:
    """A fixture object as loaded (Any: tests poke into it freely)."""
    loaded = yaml.safe_load((REAL / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def early_namespace(name: str, team: str | None) -> JSONObject:
    """A Namespace created before the fixtures' objects (2026-08), so its team applies to them."""
    obj = namespace(name, team)
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    meta["creationTimestamp"] = "2025-01-01T00:00:00Z"
    return obj


def share_of(claim: Any, *, name: str, ns: str, share_id: str, consumed: dict[str, str] | None) -> Any:
    """Another claim of the same real shape: new name, namespace, uid, pod and shareID."""
    other = copy.deepcopy(claim)
    meta, status = other["metadata"], other["status"]
    pod, pod_uid = f"{name}-pod", uid("pod")
    meta.update({"name": name, "namespace": ns, "uid": uid("claim"), "resourceVersion": rv(),
                 "ownerReferences": [{"apiVersion": "v1", "controller": True, "kind": "Pod", "name": pod,
                                      "uid": pod_uid}]})
    results = status["allocation"]["devices"]["results"]
    for result in results:
        result["shareID"] = share_id
        if consumed is None:
            result.pop("consumedCapacity", None)
        else:
            result["consumedCapacity"] = consumed
    status.pop("devices", None)
    status["reservedFor"] = [{"name": pod, "resource": "pods", "uid": pod_uid}]
    return other


def test_consumable_capacity_shares_are_split_by_consumed_capacity(ledger: LedgerHandle, tmp_path: Path) -> None:
    claim = real("devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml")
    second = share_of(claim, name="demo-macvlan-2-my-network-macvlan-x", ns="netops",
                      share_id="0b6a5c1e-2f5d-4d0e-9a43-5d1e1f5f0001",
                      consumed={"devicenetwork.io/maxVirtualInterfaces": "1"})
    path = history(tmp_path / "devicenetwork.jsonl", [
        ("ADDED", early_namespace("default", None), 0), ("ADDED", early_namespace("netops", "net"), 0),
        ("ADDED", real("devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml"), 1),
        ("ADDED", real("devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml"), 1),
        ("ADDED", claim, 2), ("ADDED", second, 3)])
    assert not ledger.replay(path).rejected
    body: Any = services.shared(ledger.db, at=T, cluster=ledger.cluster)
    [device] = body["devices"]
    assert (device["device"], device["allowMultipleAllocations"], device["split"]) == \
        ("my-network-macvlan-dummy0", True, "consumedCapacity")
    shares = {(a["namespace"], a["shareID"]): a["fraction"] for a in device["allocations"]}
    assert shares == {("default", "ca26c4ae-4841-44c8-997e-d7fb961e1bea"): round(1 / 65535, 9),
                      ("netops", "0b6a5c1e-2f5d-4d0e-9a43-5d1e1f5f0001"): round(1 / 65535, 9)}
    assert {a["team"] for a in device["allocations"]} == {"default", "net"}
    [counter_set] = body["counterSets"]
    assert (counter_set["pool"], counter_set["counterSet"]) == ("kind-worker", "dummy0")
    # The device is held by two shares but consumes its counters once.
    assert counter_set["counters"] == {"mutual-exclusion": {"total": 65536, "inUse": 1, "free": 65535}}
    parts = {p["device"]: p for p in counter_set["partitions"]}
    assert parts["my-network-host-device-dummy0"]["allocatable"] is False  # needs all 65536
    assert parts["my-network-host-device-dummy0"]["consumes"] == {"mutual-exclusion": 65536}
    assert len(parts["my-network-macvlan-dummy0"]["allocations"]) == 2
    assert body["totals"] == {"sharedDevices": 1, "counterSets": 1, "sharedClaims": 0}
    occupancy: Any = ledger.occupancy(T)
    totals = occupancy["totals"]
    assert (totals["devices"], totals["allocated"], totals["shared"]) == (1, 1, 1)


def test_shares_without_consumed_capacity_are_split_equally(ledger: LedgerHandle, tmp_path: Path) -> None:
    template = real("devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml")
    spec = template["spec"]
    spec["devices"] = {"requests": [{"name": "nic", "exactly": {"deviceClassName": "network-interface",
                                                                "allocationMode": "ExactCount", "count": 1}}]}
    status = template["status"]
    status["allocation"]["devices"]["results"] = [
        {"request": "nic", "driver": "cni.dra.networking.x-k8s.io", "pool": "kind-worker", "device": "eth0"}]
    a = share_of(template, name="web-a-nic", ns="web", share_id="5d0c4c39-0000-4000-8000-00000000000a", consumed=None)
    b = share_of(template, name="db-b-nic", ns="db", share_id="5d0c4c39-0000-4000-8000-00000000000b", consumed=None)
    path = history(tmp_path / "cni.jsonl", [
        ("ADDED", early_namespace("web", "frontend"), 0), ("ADDED", early_namespace("db", "storage"), 0),
        ("ADDED", real("cni-dra-driver_deviceclass_network-interface_v1.yaml"), 0),
        ("ADDED", real("cni-dra-driver_resourceslice_eth0-consumable-capacity-metadata-gen71_v1.yaml"), 1),
        ("ADDED", a, 2), ("ADDED", b, 3)])
    assert not ledger.replay(path).rejected
    body: Any = services.shared(ledger.db, at=T, cluster=ledger.cluster)
    [device] = body["devices"]
    assert (device["driver"], device["device"], device["split"]) == ("cni.dra.networking.x-k8s.io", "eth0", "equal")
    assert {(x["team"], x["fraction"]) for x in device["allocations"]} == {("frontend", 0.5), ("storage", 0.5)}
    assert body["counterSets"] == []
    hours: Any = services.shared_usage(ledger.db, start=at(0), end=at(60), cluster=ledger.cluster)
    assert {(r["team"], r["deviceHours"]) for r in hours["rows"]} == {("frontend", 0.5), ("storage", 0.5)}


def _partition_claim(name: str, ns: str, device: str | None) -> JSONObject:
    obj: JSONObject = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": uid("claim"), "resourceVersion": rv(),
                         "creationTimestamp": "2026-11-02T09:05:00Z"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "partition.example.com", "allocationMode": "ExactCount", "count": 1}}]}},
            "status": {"allocation": {"allocationTimestamp": "2026-11-02T09:10:00Z", "devices": {"results": [
                {"request": "gpu", "driver": "resource-driver.example.com", "pool": "my-pool", "device": device}]}},
                "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": uid("pod")}]}}
    if device is None:
        del obj["status"]
    return obj


def _kep4815(ledger: LedgerHandle, tmp_path: Path) -> None:
    klass: JSONObject = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": "partition.example.com", "uid": uid("class"), "resourceVersion": rv()},
                         "spec": {"selectors": [{"cel": {
                             "expression": "device.driver == 'resource-driver.example.com'"}}]}}
    path = history(tmp_path / "kep4815.jsonl", [
        ("ADDED", early_namespace("ml-train", "vision"), 0), ("ADDED", early_namespace("ml-serve", "nlp"), 0),
        ("ADDED", klass, 0),
        ("ADDED", real("kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml"), 1),
        ("ADDED", real("kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml"), 1),
        ("ADDED", _partition_claim("p0", "ml-train", "gpu-0-partition-0"), 10),
        ("ADDED", _partition_claim("p1", "ml-serve", "gpu-0-partition-1"), 10),
        ("ADDED", _partition_claim("waiting", "ml-train", None), 12)])
    assert not ledger.replay(path).rejected


def test_partitionable_devices_show_as_partitions_of_one_parent(ledger: LedgerHandle, tmp_path: Path) -> None:
    _kep4815(ledger, tmp_path)
    body: Any = services.shared(ledger.db, at=T, cluster=ledger.cluster)
    assert body["devices"] == []  # no device is held twice
    [counter_set] = body["counterSets"]
    gi = int(parse_quantity("1Gi"))
    assert (counter_set["pool"], counter_set["counterSet"]) == ("my-pool", "gpu-0-counter-set")
    assert counter_set["counters"] == {"memory": {"total": 40 * gi, "inUse": 20 * gi, "free": 20 * gi}}
    assert counter_set["conflict"] is False
    parts = {p["device"]: p for p in counter_set["partitions"]}
    assert list(parts) == ["gpu-0", "gpu-0-partition-0", "gpu-0-partition-1", "gpu-0-partition-2",
                           "gpu-0-partition-3"]
    assert parts["gpu-0-partition-0"]["allocations"] == [
        {"namespace": "ml-train", "claim": "p0", "team": "vision", "fraction": 0.25}]
    assert parts["gpu-0-partition-1"]["allocations"] == [
        {"namespace": "ml-serve", "claim": "p1", "team": "nlp", "fraction": 0.25}]
    assert {d: p["allocatable"] for d, p in parts.items()} == {
        "gpu-0": False, "gpu-0-partition-0": False, "gpu-0-partition-1": False, "gpu-0-partition-2": True,
        "gpu-0-partition-3": True}
    totals: Any = ledger.occupancy(T)["totals"]
    assert (totals["devices"], totals["allocated"], totals["free"]) == (1, 1, 0)


def test_a_counter_set_allocated_past_its_hardware_is_flagged_as_a_conflict(ledger: LedgerHandle,
                                                                           tmp_path: Path) -> None:
    _kep4815(ledger, tmp_path)
    # A scheduler or driver bug: the whole GPU (all 40Gi) allocated while partitions 0 and 1 hold 20Gi of it.
    whole: Any = _partition_claim("whole", "ml-serve", "gpu-0")
    whole["status"]["allocation"]["allocationTimestamp"] = stamp(20)  # partitions 0 and 1 hold theirs from 10
    path = history(tmp_path / "whole.jsonl", [("ADDED", whole, 20)])
    assert not ledger.replay(path).rejected

    body: Any = services.shared(ledger.db, at=at(25), cluster=ledger.cluster)

    [counter_set] = body["counterSets"]
    gi = int(parse_quantity("1Gi"))
    assert counter_set["counters"] == {"memory": {"total": 40 * gi, "inUse": 60 * gi, "free": 0}}  # 10+10+40
    assert counter_set["conflict"] is True
    assert body["totals"]["counterSets"] == 1
    before: Any = services.shared(ledger.db, at=at(15), cluster=ledger.cluster)  # partitions 0 and 1 alone
    assert before["counterSets"][0]["counters"]["memory"]["inUse"] == 20 * gi
    assert before["counterSets"][0]["conflict"] is False


def test_occupancy_flags_the_allocated_devices_of_a_counter_set_allocated_past_its_hardware(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    _kep4815(ledger, tmp_path)
    whole: Any = _partition_claim("whole", "ml-serve", "gpu-0")
    whole["status"]["allocation"]["allocationTimestamp"] = stamp(20)
    assert not ledger.replay(history(tmp_path / "whole.jsonl", [("ADDED", whole, 20)])).rejected

    def flags(minute: int) -> dict[str, bool]:
        body: Any = ledger.occupancy(at(minute))
        return {d["device"]: d["counterSetConflict"] for d in body["devices"]}

    # From minute 20 gpu-0 (40Gi) and partitions 0 and 1 (10Gi each) take 60Gi of a 40Gi set: the three allocated
    # devices are flagged; the free partitions 2 and 3 hold nothing to flag.
    assert flags(25) == {"gpu-0": True, "gpu-0-partition-0": True, "gpu-0-partition-1": True,
                         "gpu-0-partition-2": False, "gpu-0-partition-3": False}
    # Before it, partitions 0 and 1 take 20Gi of 40Gi: no conflict.
    assert not any(flags(15).values())
    # Each allocation's own conflict flag stays about two allocations of one device: none here.
    later: Any = ledger.occupancy(at(25))
    assert all(not a["conflict"] for d in later["devices"] for a in d["allocations"])


def test_occupancy_names_the_devices_holding_the_counters_a_free_partition_needs(ledger: LedgerHandle,
                                                                                tmp_path: Path) -> None:
    _kep4815(ledger, tmp_path)

    def held_by(minute: int) -> dict[str, list[str]]:
        body: Any = ledger.occupancy(at(minute))
        return {d["device"]: d["counterSetHeldBy"] for d in body["devices"]}

    # Minute 15: partitions 0 and 1 take 20Gi of the 40Gi set; 2 and 3 (10Gi each) still fit, gpu-0 (40Gi) does not.
    assert held_by(15) == {"gpu-0": ["gpu-0-partition-0", "gpu-0-partition-1"], "gpu-0-partition-0": [],
                           "gpu-0-partition-1": [], "gpu-0-partition-2": [], "gpu-0-partition-3": []}
    # Minute 5: nothing is allocated, every device fits.
    assert not any(held_by(5).values())
    whole: Any = _partition_claim("whole", "ml-serve", "gpu-0")
    whole["status"]["allocation"]["allocationTimestamp"] = stamp(20)
    assert not ledger.replay(history(tmp_path / "whole.jsonl", [("ADDED", whole, 20)])).rejected
    # Minute 25: gpu-0 is allocated whole as well: the free partitions 2 and 3 are held by all three.
    holders = ["gpu-0", "gpu-0-partition-0", "gpu-0-partition-1"]
    assert held_by(25) == {"gpu-0": [], "gpu-0-partition-0": [], "gpu-0-partition-1": [],
                           "gpu-0-partition-2": holders, "gpu-0-partition-3": holders}


def test_held_counters_are_named_beside_an_admin_access_holder_but_never_to_a_team_limited_token(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    _kep4815(ledger, tmp_path)
    # An adminAccess claim of ml-train (vision) on gpu-0 from minute 20: it occupies nothing, so gpu-0 is still a
    # device whose 40Gi no longer fit beside partitions 0 and 1 (20Gi of the set's 40Gi).
    audit: Any = _partition_claim("audit", "ml-train", "gpu-0")
    audit["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    audit["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    audit["status"]["allocation"]["allocationTimestamp"] = stamp(20)
    assert not ledger.replay(history(tmp_path / "audit.jsonl", [("ADDED", audit, 20)])).rejected

    whole: Any = ledger.occupancy(at(25))
    gpu0 = next(d for d in whole["devices"] if d["device"] == "gpu-0")
    assert [(a["claim"], a["adminAccess"]) for a in gpu0["allocations"]] == [("audit", True)]
    assert gpu0["counterSetHeldBy"] == ["gpu-0-partition-0", "gpu-0-partition-1"]

    # A vision token lists gpu-0 (its adminAccess claim) and partition 0; partition 1 is nlp's, so its name is not
    # told, nor any other.
    with ledger.engine.connect() as conn:
        limited: Any = queries.occupancy_all(conn, at=at(25), cluster=ledger.cluster, teams=["vision"])
    assert {d["device"]: d["counterSetHeldBy"] for d in limited["devices"]} == {"gpu-0": [], "gpu-0-partition-0": []}


def test_a_counter_set_of_unknown_size_blocks_its_other_devices_in_shared_occupancy_and_pending_alike(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # The pool's counter slice (its sharedCounters) is never seen: nothing says how much of gpu-0-counter-set is
    # left once partition 0 takes some, so no other device of the set is offered anywhere.
    klass: JSONObject = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": "partition.example.com", "uid": uid("class"), "resourceVersion": rv()},
                         "spec": {"selectors": [{"cel": {
                             "expression": "device.driver == 'resource-driver.example.com'"}}]}}
    path = history(tmp_path / "unknown.jsonl", [
        ("ADDED", early_namespace("ml-train", "vision"), 0), ("ADDED", klass, 0),
        ("ADDED", real("kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml"), 1),
        ("ADDED", _partition_claim("p0", "ml-train", "gpu-0-partition-0"), 10),
        ("ADDED", _partition_claim("waiting", "ml-train", None), 12)])
    assert not ledger.replay(path).rejected

    body: Any = services.shared(ledger.db, at=T, cluster=ledger.cluster)
    [counter_set] = body["counterSets"]
    assert counter_set["counters"]["memory"]["total"] is None
    assert not any(p["allocatable"] for p in counter_set["partitions"])
    occupied: Any = ledger.occupancy(T)
    held_by = {d["device"]: d["counterSetHeldBy"] for d in occupied["devices"]}
    others = ["gpu-0", "gpu-0-partition-1", "gpu-0-partition-2", "gpu-0-partition-3"]
    assert held_by == {"gpu-0-partition-0": [], **{d: ["gpu-0-partition-0"] for d in others}}
    pending: Any = services.pending(ledger.db, at=T, cluster=ledger.cluster)
    assert pending["classes"][0]["free"] == 0


def test_pending_demand_counts_only_partitions_that_still_fit(ledger: LedgerHandle, tmp_path: Path) -> None:
    _kep4815(ledger, tmp_path)
    body: Any = services.pending(ledger.db, at=T, cluster=ledger.cluster)
    # partitions 2 and 3 fit in the 20Gi left; gpu-0 (40Gi) does not; 0 and 1 are held.
    assert body["classes"] == [{"cluster": ledger.cluster, "deviceClass": "partition.example.com", "claims": 1,
                                "requested": 1, "free": 2}]
    [claim] = body["claims"]
    assert (claim["name"], claim["team"], claim["requests"][0]["free"]) == ("waiting", "vision", 2)


def test_seed_lab_shared_claim_splits_its_hours_between_its_two_pods(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    body: Any = services.shared(ledger.db, at=parse_time("2026-11-02T09:30:00Z"), cluster=ledger.cluster)
    assert body["claims"] == [{"cluster": ledger.cluster, "namespace": "ml-serve", "name": "shared-gpu", "team": "nlp",
                               "devices": ["gpu.example.com/lab-node/gpu-1"],
                               "consumers": [{"resource": "pods", "name": "serve-a", "fraction": 0.5},
                                             {"resource": "pods", "name": "serve-b", "fraction": 0.5}]}]
    assert body["devices"] == [] and body["counterSets"] == []
    later: Any = services.shared(ledger.db, at=parse_time("2026-11-02T10:40:00Z"), cluster=ledger.cluster)
    assert later["claims"] == []


def test_shared_device_hours_are_charged_by_consumed_capacity_or_equally(ledger: LedgerHandle, tmp_path: Path) -> None:
    claim = real("devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml")
    second = share_of(claim, name="demo-macvlan-2", ns="netops", share_id="0b6a5c1e-2f5d-4d0e-9a43-5d1e1f5f0001",
                      consumed={"devicenetwork.io/maxVirtualInterfaces": "3"})
    path = history(tmp_path / "devicenetwork.jsonl", [
        ("ADDED", early_namespace("default", None), 0), ("ADDED", early_namespace("netops", "net"), 0),
        ("ADDED", real("devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml"), 1),
        ("ADDED", real("devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml"), 1),
        ("ADDED", claim, 2), ("ADDED", second, 3)])
    assert not ledger.replay(path).rejected
    # Both shares are held through the whole hour: default pays 1/65535 of it, net 3/65535.
    body: Any = services.shared_usage(ledger.db, start=at(0), end=at(60), cluster=ledger.cluster)
    assert body["rows"] == [
        {"team": "default", "deviceClass": "devicenetwork", "driver": "devicenetwork.io",
         "deviceHours": round(1 / 65535, 6)},
        {"team": "net", "deviceClass": "devicenetwork", "driver": "devicenetwork.io",
         "deviceHours": round(3 / 65535, 6)}]
    assert body["devices"] == [{"cluster": ledger.cluster, "driver": "devicenetwork.io", "pool": "kind-worker",
                                "device": "my-network-macvlan-dummy0", "sharedHours": 1.0,
                                "billedDeviceHours": round(4 / 65535, 6)}]


def test_shared_counters_of_many_pools_are_each_pools_latest_at_or_before_the_instant(ledger: LedgerHandle,
                                                                                       tmp_path: Path) -> None:
    def counter_slice(pool: str, generation: int, memory: str) -> Any:
        body = real("kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml")
        body["metadata"].update({"name": f"{pool}-counters", "uid": uid("slice"), "resourceVersion": rv()})
        body["spec"]["pool"].update({"name": pool, "generation": generation, "resourceSliceCount": 1})
        body["spec"]["sharedCounters"][0]["counters"]["memory"]["value"] = memory
        return body

    # Pool a: 40Gi from minute 10, a driver restart publishes 80Gi at minute 20. Pool b: 16Gi from minute 15.
    path = history(tmp_path / "pools.jsonl", [("ADDED", counter_slice("a", 1, "40Gi"), 10),
                                              ("ADDED", counter_slice("b", 1, "16Gi"), 15),
                                              ("MODIFIED", counter_slice("a", 2, "80Gi"), 20)])
    assert not ledger.replay(path).rejected
    driver, c = "resource-driver.example.com", ledger.cluster
    a, b, never, elsewhere = (c, driver, "a"), (c, driver, "b"), (c, driver, "never"), ("other", driver, "a")

    def memory(at_minutes: float) -> dict[tuple[str, str, str], list[str]]:
        with ledger.db.reading() as conn:
            found: Any = counter_sets.shared_counters_of(conn, [b, a, never, a, elsewhere], at(at_minutes))
        return {k: [s["counters"]["memory"]["value"] for s in v] for k, v in found.items()}

    assert memory(5) == {a: [], b: [], never: [], elsewhere: []}  # nothing published yet
    assert memory(12) == {a: ["40Gi"], b: [], never: [], elsewhere: []}
    assert memory(20) == {a: ["80Gi"], b: ["16Gi"], never: [], elsewhere: []}  # at the instant itself
    with ledger.db.reading() as conn:
        assert counter_sets.shared_counters_of(conn, [], at(20)) == {}
        # Asked one at a time (a pool not given up front), the same totals: 80Gi in bytes.
        totals = counter_sets.CounterSetTotals(conn, at(20), pools=[b])
        assert totals.of(c, driver, "a", "gpu-0-counter-set") == {"memory": 80 * parse_quantity("1Gi")}
        assert totals.of(c, driver, "b", "gpu-0-counter-set") == {"memory": 16 * parse_quantity("1Gi")}


def test_every_shared_entry_names_its_cluster_so_two_clusters_answered_together_stay_apart(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # The seed lab recorded as two clusters, and the real KEP-4815 partitions in the handle's own.
    for cluster in ("lab-a", "lab-b"):
        assert not services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=cluster).rejected
    _kep4815(ledger, tmp_path)
    body: Any = services.shared(ledger.db, at=parse_time("2026-11-02T09:30:00Z"))
    assert [(c["cluster"], c["namespace"], c["name"]) for c in body["claims"]] == [
        ("lab-a", "ml-serve", "shared-gpu"), ("lab-b", "ml-serve", "shared-gpu")]  # in (cluster, namespace, name)
    assert [(s["cluster"], s["pool"], s["counterSet"]) for s in body["counterSets"]] == [
        (ledger.cluster, "my-pool", "gpu-0-counter-set")]
    one: Any = services.shared(ledger.db, at=parse_time("2026-11-02T09:30:00Z"), cluster="lab-b")
    assert [(c["cluster"], c["name"]) for c in one["claims"]] == [("lab-b", "shared-gpu")]
