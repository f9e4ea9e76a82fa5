"""Every real DRA object in ``../shared/fixtures/real/`` replays as ADDED, and the odd ones give the devices
and allocations a person reading the YAML would expect.

Expected values are worked out by hand from the YAML files (see the README there for where each comes
from); the comment above each assertion says how. ``AT`` is the receive time given to the replay (the
files are ``kubectl get`` output or manifests, which carry no receive time) and the instant queried.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ledger.store.postgres import make_engine
from ledger.testing.handle import LedgerHandle
from ledger.testing.pg import create_database, drop_database
from tests.paths import REAL

AT = datetime(2027, 1, 1, tzinfo=UTC)
"""After every creationTimestamp / allocationTimestamp / managedFields time in the files (the latest is
2026-08-26T13:18:23Z, the devicenetwork claim), so everything recorded is in force at ``AT``."""

FILES = sorted(REAL.glob("*.yaml"))

# File -> (objects in it, events they translate to), counted in the YAML: a ResourceSlice gives one
# PoolGenerationObserved plus one DevicePublished per `spec.devices[]` entry (a counter-only slice: none);
# a ResourceClaim gives ClaimCreated, ClaimDeletionRequested if `deletionTimestamp` is set, ClaimAllocated if
# `status.allocation` is set, and one ClaimReserved per `status.reservedFor[]` entry; a DeviceClass gives
# DeviceClassDefined; a Pod gives PodPhaseChanged (no status = Pending); a ResourceClaimTemplate gives nothing.
POOL, PUBLISHED, CREATED, ALLOCATED, RESERVED = (
    "PoolGenerationObserved", "DevicePublished", "ClaimCreated", "ClaimAllocated", "ClaimReserved")
CLASS, POD = "DeviceClassDefined", "PodPhaseChanged"
EXPECTED_EVENTS: dict[str, tuple[int, dict[str, int]]] = {
    "cni-dra-driver_deviceclass_network-interface_v1.yaml": (1, {CLASS: 1}),
    "cni-dra-driver_resourceslice_eth0-consumable-capacity-metadata-gen71_v1.yaml": (1, {POOL: 1, PUBLISHED: 1}),
    # allocated (1 result), reservedFor 1 pod
    "devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml":
        (1, {CREATED: 1, ALLOCATED: 1, RESERVED: 1}),
    # macvlan + host-device
    "devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml": (1, {POOL: 1, PUBLISHED: 2}),
    # sharedCounters only, no devices
    "devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml": (1, {POOL: 1}),
    # a manifest: no status, and no namespace (lands in `default`, as `kubectl apply` would put it)
    "dra-driver-cpu_resourceclaim_pending-2-capacity-requests-distinctattribute-numa_v1.yaml": (1, {CREATED: 1}),
    "dranet-gke_deviceclass_dranet_v1beta1.yaml": (1, {CLASS: 1}),
    # 8 results but the author cut the output before reservedFor
    "dranet-gke_resourceclaim_allocationmode-all-8nics_v1beta1.yaml": (1, {CREATED: 1, ALLOCATED: 1}),
    "dranet-gke_resourceclaimtemplate_count-8-rdma-nics_v1beta1.yaml": (1, {}),
    "example-driver_pod_claim-from-template-no-status_v1.yaml": (1, {POD: 1}),
    "example-driver_pod_extended-resource-limit-implicit-deviceclass-name_v1.yaml": (1, {POD: 1}),
    "example-driver_resourceclaim_pending-capacity-requests-memory-compute_v1.yaml": (1, {CREATED: 1}),
    "example-driver_resourceclaimtemplate_adminaccess-allocationmode-all_v1.yaml": (1, {}),
    "example-driver_resourceclaimtemplate_firstavailable-3-subrequests_v1.yaml": (1, {}),
    "example-driver_resourceclaimtemplate_toleration-noexecute_v1.yaml": (1, {}),
    # gpu-0..gpu-7, in either version
    "example-driver_resourceslice-list_8gpus-basic-wrapper-same-uid-as-v1_v1beta1.yaml": (1, {POOL: 1, PUBLISHED: 8}),
    "example-driver_resourceslice-list_8gpus_v1.yaml": (1, {POOL: 1, PUBLISHED: 8}),
    # accel0, accel1
    "google-tpu_resourceslice-list_2-tpus-duplicate-uuid-no-owner_v1beta1.yaml": (1, {POOL: 1, PUBLISHED: 2}),
    # deletionTimestamp + allocation + 1 reservedFor entry (a non-pod consumer)
    "k8s-api-testdata_resourceclaim_every-field_v1.yaml":
        (1, {CREATED: 1, "ClaimDeletionRequested": 1, ALLOCATED: 1, RESERVED: 1}),
    "k8s-api-testdata_resourceslice_every-field_v1.yaml": (1, {POOL: 1, PUBLISHED: 1}),
    "k8s-website-examples_resourceclaim_some-gpu-manifest-odd-indentation-no-eol_v1.yaml": (1, {CREATED: 1}),
    "k8s-website-tutorial_resourceclaim-list_some-gpu-allocated-reserved_v1beta2.yaml":
        (1, {CREATED: 1, ALLOCATED: 1, RESERVED: 1}),
    "kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml": (1, {POOL: 1}),
    # gpu-0 + 4 partitions
    "kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml": (1, {POOL: 1, PUBLISHED: 5}),
    "kep5004_deviceclass_extendedresourcename-example.com-gpu_v1beta1.yaml": (1, {CLASS: 1}),
    "kubevirt-vep_pod_resourceclaimstatuses-template-claim_v1.yaml": (1, {POD: 1}),
    "kubevirt-vep_resourceclaim_from-template-allocated-pgpu0_v1.yaml": (1, {CREATED: 1, ALLOCATED: 1, RESERVED: 1}),
    "kueue_resourceclaimtemplate_capacity-request-qualified-name-4Gi_v1.yaml": (1, {}),
    "nvidia-gpu_deviceclass_mig-1g12gb-extendedresourcename_v1.yaml": (1, {CLASS: 1}),
    "nvidia-gpu_pod_extended-resource-limit-mig-1g12gb_v1.yaml": (1, {POD: 1}),
    "nvidia-gpu_resourceclaim_extended-resource-claim-mig-1g12gb-scheduler-generated_v1.yaml":
        (1, {CREATED: 1, ALLOCATED: 1, RESERVED: 1}),
    "nvidia-gpu_resourceclaimtemplate_4-mig-requests-matchattribute-parentuuid_v1beta1.yaml": (1, {}),
    # 8 slices (4 nodes x 2 drivers) = 8 pools; devices: 4 x gpu-0 + 4 x (channel-0, daemon-0) = 12
    "vks-v1.35_resourceslice-list_gpu-and-compute-domain-4nodes_v1.yaml": (8, {POOL: 8, PUBLISHED: 12}),
    "vks-v1.36_resourceclaim-list_from-template-allocated-reserved_v1.yaml":
        (1, {CREATED: 1, ALLOCATED: 1, RESERVED: 1}),
    # 2 slices, one gpu-0 each
    "vks-v1.36_resourceslice-list_vgpu-2nodes_v1.yaml": (2, {POOL: 2, PUBLISHED: 2}),
}

EXAMPLE_V1 = REAL / "example-driver_resourceslice-list_8gpus_v1.yaml"
EXAMPLE_V1BETA1 = REAL / "example-driver_resourceslice-list_8gpus-basic-wrapper-same-uid-as-v1_v1beta1.yaml"
NET_SLICE0 = REAL / "devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml"
NET_SLICE1 = REAL / "devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml"
NET_CLAIM = REAL / "devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml"


@pytest.fixture()
def second_ledger(ledger_server: str, ledger_template: str) -> Iterator[LedgerHandle]:
    """Another fresh ledger for the same test, to compare two replays."""
    name = f"ledger_t_{uuid.uuid4().hex[:12]}"
    engine = make_engine(create_database(ledger_server, name, template=ledger_template))
    try:
        yield LedgerHandle(engine=engine)
    finally:
        engine.dispose()
        drop_database(ledger_server, name)


def replay_cleanly(ledger: LedgerHandle, *paths: Path) -> None:
    """Replay ``paths`` as ADDED at ``AT`` and check nothing was rejected."""
    report = ledger.replay(*paths, at=AT)
    assert [(r.origin, r.reason) for r in report.rejected] == []


def device_names(body: Any) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of every device of an occupancy body, in body order."""
    return [(d["driver"], d["pool"], d["device"]) for d in body["devices"]]


def payloads(ledger: LedgerHandle, event_type: str) -> list[Any]:
    """Payloads of the stored events of one type, in global position order (``Any``: read as JSON)."""
    return [e.payload for e in ledger.events([event_type])]


def pool_observations(ledger: LedgerHandle) -> list[tuple[int, int, int, bool]]:
    """(generation, resourceSliceCount, slices seen, complete) of every PoolGenerationObserved, in order."""
    return [(p["generation"], p["resourceSliceCount"], p["slices"], p["complete"]) for p in payloads(ledger, POOL)]


# --- every file ---------------------------------------------------------------------------------


def test_the_expected_table_names_exactly_the_files_present() -> None:
    assert sorted(EXPECTED_EVENTS) == [p.name for p in FILES]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_real_file_is_ingested_as_added_without_a_rejection(ledger: LedgerHandle, path: Path) -> None:
    objects, expected = EXPECTED_EVENTS[path.name]
    report = ledger.replay(path, at=AT)

    assert [(r.origin, r.reason) for r in report.rejected] == []
    assert (report.lines, report.recorded, report.duplicates) == (objects, objects, 0)
    assert dict(Counter(e.type for e in ledger.events())) == expected
    assert report.events == sum(expected.values())
    occupancy: Any = ledger.occupancy(AT)
    assert occupancy["totals"]["free"] >= 0
    assert occupancy["totals"]["allocated"] <= occupancy["totals"]["devices"]


def test_all_files_together_give_the_hand_counted_totals(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, *FILES)
    body: Any = ledger.occupancy(AT)

    # Hardware units on slices: example-driver 8 (the v1 and v1beta1 files are one slice, same uid) +
    # vks-v1.35 12 + vks-v1.36 2 + cni eth0 1 + devicenetwork 1 (2 devices, one counter set) + tpu 2 +
    # kep4815 1 (5 devices, one counter set) + k8s-api-testdata 1 = 28. Held off-slice (no slice of their
    # pool in the corpus) by a non-adminAccess allocation: dranet 8 + nvidia MIG 1 + tutorial gpu-4 1 +
    # kubevirt pgpu-0 1 = 11 (k8s-api-testdata deviceValue, held by adminAccess alone, is listed but is no
    # device: adminAccess never occupies). Allocated: those 11, plus vks-v1.36 gpu-0 and the devicenetwork
    # macvlan = 13.
    assert body["totals"] == {"devices": 39, "allocated": 13, "free": 26, "shared": 0}


def test_resource_claim_templates_are_accepted_and_record_nothing(ledger: LedgerHandle) -> None:
    templates = [p for p in FILES if "_resourceclaimtemplate_" in p.name]
    report = ledger.replay(*templates, at=AT)

    # 4 v1 + 2 v1beta1 templates (README "Counts"); adminAccess + allocationMode All among them.
    assert (len(templates), report.recorded, report.rejected, report.events) == (6, 6, [], 0)
    assert ledger.events() == []


# --- ResourceSlices -----------------------------------------------------------------------------

EXAMPLE_UUIDS = [  # spec.devices[i].attributes.uuid in both example-driver files, gpu-0 .. gpu-7
    "gpu-18db0e85-99e9-c746-8531-ffeb86328b39", "gpu-93d37703-997c-c46f-a531-755e3e0dc2ac",
    "gpu-ee3e4b55-fcda-44b8-0605-64b7a9967744", "gpu-9ede7e32-5825-a11b-fa3d-bab6d47e0243",
    "gpu-e7b42cb1-4fd8-91b2-bc77-352a0c1f5747", "gpu-f11773a1-5bfb-e48b-3d98-1beb5baaf08e",
    "gpu-0159f35e-99ee-b2b5-74f1-9d18df3f22ac", "gpu-657bd2e7-f5c2-a7f2-fbaa-0d1cdc32f81b",
]
EXAMPLE_POOL = "dra-example-driver-cluster-worker"
EXAMPLE_DEVICES = [  # what the YAML says of gpu-i, in the v1 shape (v1beta1 wraps the same in `basic:`)
    {"device": f"gpu-{i}", "driver": "gpu.example.com", "pool": EXAMPLE_POOL, "node": EXAMPLE_POOL,
     "attributes": {"driverVersion": {"version": "1.0.0"}, "index": {"int": i},
                    "model": {"string": "LATEST-GPU-MODEL"}, "uuid": {"string": EXAMPLE_UUIDS[i]}},
     "capacity": {"memory": {"value": "80Gi"}}, "allowMultipleAllocations": False, "consumesCounters": [],
     "taints": []}
    for i in range(8)
]


def published_devices(ledger: LedgerHandle) -> list[dict[str, Any]]:
    """DevicePublished payloads without the slice name, sorted by device."""
    out = [{k: v for k, v in p.items() if k != "sliceName"} for p in payloads(ledger, PUBLISHED)]
    return sorted(out, key=lambda d: str(d["device"]))


def test_v1_and_v1beta1_example_driver_slices_give_identical_inventory(
        ledger: LedgerHandle, second_ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, EXAMPLE_V1)
    replay_cleanly(second_ledger, EXAMPLE_V1BETA1)

    # Both files are the same slice (uid d13fd8bd-…): 8 devices gpu-0..gpu-7 in pool (= node)
    # dra-example-driver-cluster-worker, each with the 4 attributes and 80Gi of memory listed above.
    assert published_devices(ledger) == EXAMPLE_DEVICES
    assert published_devices(second_ledger) == EXAMPLE_DEVICES
    # ... and the read model rows are the same, column for column (row_id aside).
    assert [r[1:] for r in ledger.rows("device_inventory")] == [r[1:] for r in second_ledger.rows("device_inventory")]
    v1: Any = ledger.occupancy(AT)
    assert v1 == second_ledger.occupancy(AT)
    assert v1["totals"] == {"devices": 8, "allocated": 0, "free": 8, "shared": 0}
    assert {d["model"] for d in v1["devices"]} == {"LATEST-GPU-MODEL"}
    # pool.generation 0 (metadata.generation 1): generation 0 is a real generation, and 1 slice of 1 is complete.
    assert pool_observations(ledger) == [(0, 1, 1, True)]


def test_the_v1beta1_slice_replayed_after_the_v1_one_changes_nothing(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, EXAMPLE_V1)
    report = ledger.replay(EXAMPLE_V1BETA1, at=AT)

    # Same object in another API version: normalised to the same v1 view, so no transition to record.
    assert (report.recorded, report.events, report.rejected) == (1, 0, [])


def test_vks_nodes_all_called_gpu_0_stay_distinct_devices_by_pool(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "vks-v1.35_resourceslice-list_gpu-and-compute-domain-4nodes_v1.yaml")
    body: Any = ledger.occupancy(AT)

    nodes = ["test-ai-0-node-pool-40c-kn48j-7n6h9-gvhpn", "test-ai-0-node-pool-4c-zdfrn-rnkzj-gcxqf",
             "test-ai-0-node-pool-4c-zdfrn-rnkzj-lrj4k", "test-ai-0-node-pool-4c-zdfrn-rnkzj-w78x4"]
    # Each node has a gpu.nvidia.com slice with one device gpu-0 and a compute-domain.nvidia.com slice with
    # channel-0 and daemon-0; both drivers name the pool after the node. Identity is driver+pool+device, so
    # four gpu-0 and eight compute-domain devices: 12, none merged.
    assert device_names(body) == (
        [("compute-domain.nvidia.com", n, d) for n in nodes for d in ("channel-0", "daemon-0")]
        + [("gpu.nvidia.com", n, "gpu-0") for n in nodes])
    assert body["totals"] == {"devices": 12, "allocated": 0, "free": 12, "shared": 0}
    gpus: Any = ledger.occupancy(AT, driver="gpu.nvidia.com")
    assert gpus["totals"]["devices"] == 4
    cd: Any = ledger.occupancy(AT, driver="compute-domain.nvidia.com")
    assert cd["totals"]["devices"] == 8
    # productName: GRID A100-40C on the "40c" node, GRID A100-4C on the three "4c" nodes.
    assert [d["model"] for d in gpus["devices"]] == ["GRID A100-40C", "GRID A100-4C", "GRID A100-4C", "GRID A100-4C"]
    assert all(d["node"] == d["pool"] for d in body["devices"])
    assert pool_observations(ledger) == [(1, 1, 1, True)] * 8


def test_a_pool_split_over_a_device_slice_and_a_counter_slice(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, NET_SLICE0)

    # slice0: pool kind-worker at pool.generation 2 with resourceSliceCount 2: one slice of two seen, so
    # the pool is not complete yet, but its two devices are published.
    assert pool_observations(ledger) == [(2, 2, 1, False)]
    names = [("devicenetwork.io", "kind-worker", "my-network-host-device-dummy0"),
             ("devicenetwork.io", "kind-worker", "my-network-macvlan-dummy0")]
    first: Any = ledger.occupancy(AT)
    assert device_names(first) == names

    replay_cleanly(ledger, NET_SLICE1)

    # slice1 (counter set dummy0 only) completes the pool at the same generation and brings the counters.
    assert pool_observations(ledger) == [(2, 2, 1, False), (2, 2, 2, True)]
    assert payloads(ledger, POOL)[-1]["sharedCounters"] == [
        {"name": "dummy0", "counters": {"mutual-exclusion": {"value": "65536"}}}]
    body: Any = ledger.occupancy(AT)
    assert device_names(body) == names
    # macvlan consumes 1 and host-device 65536 of dummy0's counter: two views of one host interface, so
    # the totals count one piece of hardware (DESIGN §5).
    assert body["totals"] == {"devices": 1, "allocated": 0, "free": 1, "shared": 0}
    published = {str(d["device"]): d for d in published_devices(ledger)}
    assert published["my-network-macvlan-dummy0"]["allowMultipleAllocations"] is True
    assert published["my-network-host-device-dummy0"]["allowMultipleAllocations"] is False


def test_a_shared_macvlan_allocation_keeps_its_share_id_and_consumed_capacity(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, NET_SLICE0, NET_SLICE1, NET_CLAIM)
    body: Any = ledger.occupancy(AT)
    claims: Any = ledger.claims(AT)

    claim = "demo-macvlan-58b7bc847c-26gkz-my-network-macvlan-l7s94"
    share = "ca26c4ae-4841-44c8-997e-d7fb961e1bea"
    held = {d["device"]: d["allocations"] for d in body["devices"]}
    # One result on the macvlan device with shareID ca26c4ae-… and consumedCapacity
    # maxVirtualInterfaces "1"; reservedFor the pod demo-macvlan-58b7bc847c-26gkz.
    assert held == {"my-network-host-device-dummy0": [], "my-network-macvlan-dummy0": [{
        "namespace": "default", "claim": claim, "team": "default", "request": "my-network-macvlan",
        "deviceClass": "devicenetwork", "shareID": share,
        "consumedCapacity": {"devicenetwork.io/maxVirtualInterfaces": "1"}, "adminAccess": False,
        "conflict": False, "consumers": ["demo-macvlan-58b7bc847c-26gkz"]}]}
    # The counter set dummy0 is the one piece of hardware, and it is now held.
    assert body["totals"] == {"devices": 1, "allocated": 1, "free": 0, "shared": 0}
    assert claims["claims"] == [{
        "cluster": "default", "namespace": "default", "name": claim, "uid": "93f71307-b064-44bd-8cc3-340dc400afdd",
        "origin": "template", "state": "allocated", "team": "default", "requested": {"devicenetwork": 1},
        "devices": [{"driver": "devicenetwork.io", "pool": "kind-worker", "device": "my-network-macvlan-dummy0",
                     "request": "my-network-macvlan", "shareID": share,
                     "consumedCapacity": {"devicenetwork.io/maxVirtualInterfaces": "1"}, "adminAccess": False}],
        "consumers": ["demo-macvlan-58b7bc847c-26gkz"]}]


def test_metadata_generation_71_does_not_hide_pool_generation_1(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "cni-dra-driver_resourceslice_eth0-consumable-capacity-metadata-gen71_v1.yaml")
    body: Any = ledger.occupancy(AT)

    # metadata.generation 71 counts edits of the object; spec.pool.generation 1 is the pool's generation.
    assert pool_observations(ledger) == [(1, 1, 1, True)]
    assert device_names(body) == [("cni.dra.networking.x-k8s.io", "kind-worker", "eth0")]
    assert body["totals"] == {"devices": 1, "allocated": 0, "free": 1, "shared": 0}
    (eth0,) = published_devices(ledger)
    assert eth0["allowMultipleAllocations"] is True
    assert eth0["capacity"] == {"cni.dra.networking.x-k8s.io/maxVirtualDevices": {
        "value": "65535", "requestPolicy": {"default": "1", "validValues": ["1"]}}}


def test_two_tpus_with_the_same_uuid_are_two_devices(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "google-tpu_resourceslice-list_2-tpus-duplicate-uuid-no-owner_v1beta1.yaml")
    body: Any = ledger.occupancy(AT)

    # accel0 and accel1 both say uuid tpu-25541d5c-…: a device is driver+pool+name, never its uuid (§11.6).
    assert device_names(body) == [("tpu.google.com", "kind-control-plane", "accel0"),
                                  ("tpu.google.com", "kind-control-plane", "accel1")]
    assert body["totals"] == {"devices": 2, "allocated": 0, "free": 2, "shared": 0}
    assert [d["attributes"]["uuid"] for d in published_devices(ledger)] == [
        {"string": "tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9"}] * 2
    # nodeName kind-control-plane although generateName says kind-node-: the node is the spec's.
    assert {d["node"] for d in body["devices"]} == {"kind-control-plane"}


def test_partitions_consuming_one_counter_set_are_one_piece_of_hardware(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml",
                   REAL / "kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml")
    body: Any = ledger.occupancy(AT)

    # Pool my-pool, 2 slices: the counter slice alone is incomplete, the device slice completes it.
    assert pool_observations(ledger) == [(1, 2, 1, False), (1, 2, 2, True)]
    # gpu-0 (40Gi) and gpu-0-partition-0..3 (10Gi each) are published, all consuming gpu-0-counter-set:
    # five views of one GPU, counted once.
    assert [d["device"] for d in body["devices"]] == ["gpu-0"] + [f"gpu-0-partition-{i}" for i in range(4)]
    assert {d["node"] for d in body["devices"]} == {"my-node"}
    assert body["totals"] == {"devices": 1, "allocated": 0, "free": 1, "shared": 0}
    assert {d["consumesCounters"][0]["counterSet"] for d in published_devices(ledger)} == {"gpu-0-counter-set"}


def test_the_every_field_slice_is_recorded_with_its_placeholders(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "k8s-api-testdata_resourceslice_every-field_v1.yaml")
    body: Any = ledger.occupancy(AT)

    # pool nameValue, generation 2, 1 of resourceSliceCount 3 slices seen; one device nameValue on
    # nodeNameValue (the device's own nodeName), tainted, consuming counter set counterSetValue.
    assert pool_observations(ledger) == [(2, 3, 1, False)]
    assert device_names(body) == [("driverValue", "nameValue", "nameValue")]
    assert body["devices"][0]["node"] == "nodeNameValue"
    assert body["totals"] == {"devices": 1, "allocated": 0, "free": 1, "shared": 0}
    (device,) = published_devices(ledger)
    assert device["taints"] == [{"effect": "effectValue", "key": "keyValue", "timeAdded": "2004-01-01T01:01:01Z",
                                 "value": "valueValue"}]


# --- ResourceClaims -----------------------------------------------------------------------------


def test_allocation_mode_all_holds_eight_nics_off_slice(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "dranet-gke_resourceclaim_allocationmode-all-8nics_v1beta1.yaml")
    body: Any = ledger.occupancy(AT)
    claims: Any = ledger.claims(AT)

    pool = "gke-dra-1-gpu-nodes-2-e5f6f579-7je4"
    nics = [f"gpu{i}rdma0" for i in range(8)]
    # allocationMode All -> 8 results gpu0rdma0..gpu7rdma0 in one pool, adminAccess null (= false). No slice
    # of that pool was replayed, so the 8 are held off-slice: 8 devices, all allocated, none free.
    assert device_names(body) == [("dra.net", pool, n) for n in nics]
    assert all(d["offSlice"] for d in body["devices"])
    assert body["totals"] == {"devices": 8, "allocated": 8, "free": 0, "shared": 0}
    assert {(a["claim"], a["request"], a["deviceClass"], a["adminAccess"], tuple(a["consumers"]))
            for d in body["devices"] for a in d["allocations"]} == {
        ("nccl-gib-test-0-rdma-net-interface-mdsfv", "rdma-net-interface", "dranet", False, ())}
    (claim,) = claims["claims"]
    # Template-generated (pod-claim-name annotation, owner pod nccl-gib-test-0); the output was cut before
    # reservedFor, so no consumer. `All` has no count to request up front, hence 0 requested.
    assert (claim["origin"], claim["state"], claim["consumers"], claim["requested"]) == (
        "template", "allocated", [], {"dranet": 0})
    assert [d["device"] for d in claim["devices"]] == nics


def test_the_extended_resource_claim_holds_the_dynamic_mig_device(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger,
                   REAL / "nvidia-gpu_resourceclaim_extended-resource-claim-mig-1g12gb-scheduler-generated_v1.yaml")
    body: Any = ledger.occupancy(AT)
    claims: Any = ledger.claims(AT)

    # Annotation extended-resource-claim "true" -> origin extended; one result gpu-1-mig-19-4-1 in pool
    # kind-dra-1-worker (no slice replayed: off-slice, node from the allocation's nodeSelector).
    (claim,) = claims["claims"]
    assert (claim["namespace"], claim["name"], claim["origin"], claim["state"]) == (
        "extended-resource-mig-1g12gb", "mig-1g12gb-pod-extended-resources-8r9k5", "extended", "allocated")
    assert claim["requested"] == {"mig-1g-12gb.gpu.nvidia.com": 1}
    assert claim["consumers"] == ["mig-1g12gb-pod"]
    assert [(d["driver"], d["pool"], d["device"], d["request"]) for d in claim["devices"]] == [
        ("gpu.nvidia.com", "kind-dra-1-worker", "gpu-1-mig-19-4-1", "container-0-request-0")]
    (device,) = body["devices"]
    assert (device["device"], device["node"], device["offSlice"]) == ("gpu-1-mig-19-4-1", "kind-dra-1-worker", True)
    assert device["allocations"][0]["deviceClass"] == "mig-1g-12gb.gpu.nvidia.com"
    assert body["totals"] == {"devices": 1, "allocated": 1, "free": 0, "shared": 0}


def test_the_trimmed_vks_claim_allocates_gpu_0_of_its_pool(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "vks-v1.36_resourceslice-list_vgpu-2nodes_v1.yaml",
                   REAL / "vks-v1.36_resourceclaim-list_from-template-allocated-reserved_v1.yaml")
    body: Any = ledger.occupancy(AT)
    claims: Any = ledger.claims(AT)

    held, other = "conformance-test-np1-qcqc8-bpdtl-wv2gs", "conformance-test-np1-qcqc8-bpdtl-rcj8j"
    name = "dra-gpu-example-798fccd4d-sfl2p-single-gpu-d2jzk"
    pod = "dra-gpu-example-798fccd4d-sfl2p"
    # Two slices, one gpu-0 each (pool = node); the claim's one result is gpu-0 of pool …-wv2gs, reserved by
    # the Deployment's pod; the other gpu-0 stays free.
    assert device_names(body) == [("gpu.nvidia.com", other, "gpu-0"), ("gpu.nvidia.com", held, "gpu-0")]
    assert [(d["offSlice"], [a["claim"] for a in d["allocations"]]) for d in body["devices"]] == [
        (False, []), (False, [name])]
    assert body["devices"][1]["allocations"][0]["consumers"] == [pod]
    assert body["totals"] == {"devices": 2, "allocated": 1, "free": 1, "shared": 0}
    (claim,) = claims["claims"]
    # No uid in the trimmed object: the ledger keys it by namespace/name. pod-claim-name annotation -> template.
    assert (claim["uid"], claim["origin"], claim["state"], claim["consumers"]) == (
        f"name:gpu-test1/{name}", "template", "allocated", [pod])
    assert [(d["pool"], d["device"]) for d in claim["devices"]] == [(held, "gpu-0")]
    (created,) = payloads(ledger, CREATED)
    assert (created["ownerPod"], created["ownerPodUID"]) == (pod, "d36ca24f-9949-4c33-9d47-c06846f775b1")


def test_the_tutorial_v1beta2_claim_is_manual_allocated_and_reserved_by_pod0(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "k8s-website-tutorial_resourceclaim-list_some-gpu-allocated-reserved_v1beta2.yaml")
    claims: Any = ledger.claims(AT)
    body: Any = ledger.occupancy(AT)

    # No owner, no generateName, no annotation: made by a user. One result gpu-4 of pool kind-worker
    # (adminAccess null = false), reservedFor pod0.
    assert claims["claims"] == [{
        "cluster": "default", "namespace": "dra-tutorial", "name": "some-gpu",
        "uid": "79e1e8d8-7e53-4362-aad1-eca97678339e",
        "origin": "manual", "state": "allocated", "team": "dra-tutorial", "requested": {"gpu.example.com": 1},
        "devices": [{"driver": "gpu.example.com", "pool": "kind-worker", "device": "gpu-4", "request": "some-gpu",
                     "shareID": None, "consumedCapacity": {}, "adminAccess": False}],
        "consumers": ["pod0"]}]
    assert body["totals"] == {"devices": 1, "allocated": 1, "free": 0, "shared": 0}
    assert body["devices"][0]["node"] == "kind-worker"


def test_the_every_field_claim_is_recorded_as_sent(ledger: LedgerHandle) -> None:
    # Invalid per Kubernetes (a request with both `exactly` and `firstAvailable`, placeholder values): the
    # ledger cannot fix it, so it records what was sent rather than dropping the allocation it reports.
    replay_cleanly(ledger, REAL / "k8s-api-testdata_resourceclaim_every-field_v1.yaml")
    claims: Any = ledger.claims(AT)
    body: Any = ledger.occupancy(AT)

    (created,) = payloads(ledger, CREATED)
    (request,) = created["requests"]
    assert sorted(request) == ["exactly", "firstAvailable", "name"]
    # Owner is a kindValue, not a Pod, and no origin annotation: manual.
    assert (created["origin"], created["ownerPod"]) == ("manual", None)
    (claim,) = claims["claims"]
    # deletionTimestamp set but the allocation is still there: still allocated (§11.1). The only request is
    # adminAccess, so it requests 0 devices; its result is adminAccess with shareID and consumedCapacity.
    assert (claim["namespace"], claim["name"], claim["state"], claim["requested"]) == (
        "namespaceValue", "nameValue", "allocated", {"deviceClassNameValue": 0})
    assert claim["devices"] == [{"driver": "driverValue", "pool": "poolValue", "device": "deviceValue",
                                 "request": "requestValue", "shareID": "shareIDValue",
                                 "consumedCapacity": {"consumedCapacityKey": "0"}, "adminAccess": True}]
    # reservedFor names a non-pod consumer (resourceValue/nameValue): a live holder of its own kind (§11.2).
    assert claim["consumers"] == ["nameValue"]
    # adminAccess never occupies: the device is listed (off-slice) but is neither allocated nor, being in
    # no ResourceSlice, a device that could be free (DESIGN §11.4).
    assert body["totals"] == {"devices": 0, "allocated": 0, "free": 0, "shared": 0}
    assert body["devices"][0]["offSlice"] is True


def test_a_claim_manifest_without_a_namespace_lands_in_default(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger,
                   REAL / "dra-driver-cpu_resourceclaim_pending-2-capacity-requests-distinctattribute-numa_v1.yaml")
    claims: Any = ledger.claims(AT)

    # metadata has only a name; no status: pending. Two ExactCount requests (count defaults to 1) of
    # class dra.cpu -> 2 requested.
    assert [(c["namespace"], c["name"], c["origin"], c["state"], c["requested"], c["devices"])
            for c in claims["claims"]] == [("default", "numa-spread-cpus", "manual", "pending", {"dra.cpu": 2}, [])]


def test_pending_manifests_request_what_they_say(ledger: LedgerHandle) -> None:
    replay_cleanly(ledger, REAL / "example-driver_resourceclaim_pending-capacity-requests-memory-compute_v1.yaml",
                   REAL / "k8s-website-examples_resourceclaim_some-gpu-manifest-odd-indentation-no-eol_v1.yaml")
    claims: Any = ledger.claims(AT)

    # Two manifests, no status: both pending, each one device of gpu.example.com (count defaults to 1).
    assert [(c["namespace"], c["name"], c["state"], c["requested"]) for c in claims["claims"]] == [
        ("dra-tutorial", "some-gpu", "pending", {"gpu.example.com": 1}),
        ("gpu-allow-multiple-allocations", "shared-gpu-pod0", "pending", {"gpu.example.com": 1})]


def test_pods_are_recorded_pending_with_the_claims_they_name(ledger: LedgerHandle) -> None:
    pods = [p for p in FILES if "_pod_" in p.name]
    replay_cleanly(ledger, *pods)

    # No pod file has a status.phase: all Pending. Only the kubevirt pod names a generated claim (through
    # status.resourceClaimStatuses); the others use a template without status or an extended resource.
    recorded = sorted((p["namespace"], p["name"], p["phase"], p["claims"]) for p in payloads(ledger, POD))
    assert recorded == [
        ("extended-resource-mig-1g12gb", "mig-1g12gb-pod", "Pending", []),
        ("extended-resource-request", "pod0", "Pending", []),
        ("gpu-test1", "virt-launcher-vmi-fedora-9bjwb", "Pending",
         ["virt-launcher-vmi-fedora-9bjwb-gpu-resource-claim-m4k28"]),
        ("prioritized-alternatives", "pod0", "Pending", []),
    ]
