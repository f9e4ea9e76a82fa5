"""Occupancy of one DeviceClass: the devices its CEL selectors pick at T, with totals over them only.

The history (:func:`two_classes`) has one node with four whole GPUs (``index``, ``model`` attributes) and
four MIG partitions (``profile`` attribute, no ``model`` or ``index``), and two classes whose selectors read
an attribute only the other kind lacks: on the other kind the expression fails (a missing attribute),
which must mean "does not match" (DESIGN §11.10). Expected values are worked out by hand below.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ledger.errors import Invalid, UnknownDeviceClass
from ledger.projections import queries
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject, JSONValue
from tests.factories import at, history, rv, stamp, uid
from tests.integration.test_quotas import DRIVER, Lab, device_class, exactly, lab_slice, req
from tests.paths import HISTORIES, REAL

T = at(30)
"""After the allocations (minute 10) and gpu-2 leaving its slice (minute 20); before ``late-gpu`` (minute 40)."""
LATER = at(50)

WHOLE = "whole-gpu.example.com"
MIG = "mig-1g.example.com"
LATE = "late-gpu.example.com"
WHOLE_SELECTOR = f"device.attributes['{DRIVER}'].model == 'A100'"  # fails on a MIG partition: no `model`
MIG_SELECTOR = f"device.attributes['{DRIVER}'].profile == '1g.10gb'"  # fails on a whole GPU: no `profile`
LATE_SELECTOR = f"device.attributes['{DRIVER}'].index >= 1"  # fails on a MIG partition: no `index`


def _mig(n: int) -> JSONObject:
    return {"name": f"mig-{n}", "attributes": {"profile": {"string": "1g.10gb"}, "parentIndex": {"int": 0}},
            "capacity": {"memory": {"value": "10Gi"}}}


def _result(request: str, device: str) -> JSONObject:
    return {"request": request, "driver": DRIVER, "pool": "node-a", "device": device}


def two_classes() -> Lab:
    """The history described in the module docstring.

    Minute 0: classes ``whole-gpu`` and ``mig-1g``; slice with gpu-0..gpu-3 and mig-0..mig-3.
    Minute 10: ``train`` (class whole-gpu) holds gpu-0 and gpu-1; ``held-off`` (whole-gpu) holds gpu-2;
    ``infer`` (mig-1g) holds mig-0 and mig-1 and is reserved by two pods (so both partitions are shared).
    Minute 20: the slice is republished (same generation) without gpu-2: gpu-2 is held off-slice.
    Minute 40: class ``late-gpu`` (index >= 1) is created.
    """
    h = Lab()
    h.add(device_class(WHOLE, selector=WHOLE_SELECTOR))
    h.add(device_class(MIG, selector=MIG_SELECTOR))
    published = lab_slice(4, extra=[_mig(n) for n in range(4)])
    h.add(published)
    h.claim("train", [req("gpu", exactly(WHOLE, 2))], results=[_result("gpu", "gpu-0"), _result("gpu", "gpu-1")])
    h.claim("held-off", [req("gpu", exactly(WHOLE, 1))], results=[_result("gpu", "gpu-2")])
    infer = h.claim("infer", [req("mig", exactly(MIG, 2))], results=[_result("mig", "mig-0"), _result("mig", "mig-1")])
    reserved: Any = infer["status"]
    reserved["reservedFor"].append({"resource": "pods", "name": "infer-pod-2", "uid": uid("pod")})
    republished: Any = copy.deepcopy(published)
    republished["metadata"]["resourceVersion"] = rv()
    republished["spec"]["devices"] = [d for d in republished["spec"]["devices"] if d["name"] != "gpu-2"]
    h.events.append(("MODIFIED", republished, 20))
    late: Any = device_class(LATE, selector=LATE_SELECTOR)
    late["metadata"]["creationTimestamp"] = stamp(40)  # the ledger dates a new object by its creation
    h.add(late, minutes=40)
    return h


@pytest.fixture()
def lab(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    two_classes().replay(ledger, tmp_path)
    return ledger


def listed(body: JSONObject) -> list[tuple[str, bool, list[str]]]:
    """(device, offSlice, claims holding it) of every listed device, in order."""
    devices: Any = body["devices"]
    return [(d["device"], d["offSlice"], [a["claim"] for a in d["allocations"]]) for d in devices]


def test_whole_gpus_are_the_devices_with_a_model_and_the_off_slice_device_held_for_that_class(
        lab: LedgerHandle) -> None:
    body = lab.occupancy(T, device_class=WHOLE)
    # gpu-0, gpu-1, gpu-3: model A100. gpu-2: no longer in the slice, held by `held-off`, a request of
    # whole-gpu. mig-*: no `model` attribute, the selector fails, so they are not whole GPUs.
    assert listed(body) == [("gpu-0", False, ["train"]), ("gpu-1", False, ["train"]), ("gpu-2", True, ["held-off"]),
                            ("gpu-3", False, [])]
    assert body["totals"] == {"devices": 4, "allocated": 3, "free": 1, "shared": 0}
    # Unfiltered, the same instant has all 8 devices, 5 allocated, the 2 partitions of `infer` shared.
    assert lab.occupancy(T)["totals"] == {"devices": 8, "allocated": 5, "free": 3, "shared": 2}


def test_mig_partitions_are_the_devices_with_a_profile_and_never_the_off_slice_whole_gpu(
        lab: LedgerHandle) -> None:
    body = lab.occupancy(T, device_class=MIG)
    # whole GPUs have no `profile` attribute (the selector fails: no match); gpu-2 is held for whole-gpu.
    assert listed(body) == [("mig-0", False, ["infer"]), ("mig-1", False, ["infer"]), ("mig-2", False, []),
                            ("mig-3", False, [])]
    # mig-0 and mig-1 are held by one claim with two live consumers: shared.
    assert body["totals"] == {"devices": 4, "allocated": 2, "free": 2, "shared": 2}


def test_a_class_created_after_t_is_unknown_at_t_and_selects_only_on_slice_devices_later(
        lab: LedgerHandle) -> None:
    with pytest.raises(UnknownDeviceClass, match=re.escape(LATE)):
        lab.occupancy(T, device_class=LATE)
    body = lab.occupancy(LATER, device_class=LATE)
    # index >= 1 on slice: gpu-1 (held by train) and gpu-3; gpu-2 is off-slice and held for whole-gpu, not
    # late-gpu, so its old index does not count; partitions have no index (selector error: no match).
    assert listed(body) == [("gpu-1", False, ["train"]), ("gpu-3", False, [])]
    assert body["totals"] == {"devices": 2, "allocated": 1, "free": 1, "shared": 0}


def test_an_unknown_or_empty_class_is_refused(lab: LedgerHandle) -> None:
    with pytest.raises(UnknownDeviceClass):
        lab.occupancy(T, device_class="gpu.nvidia.com")
    with pytest.raises(Invalid):
        lab.occupancy(T, device_class="")


def test_pages_of_a_class_list_each_member_once_in_key_order_with_the_class_totals(lab: LedgerHandle) -> None:
    pages: list[JSONObject] = []
    after: queries.DeviceSortKey | None = None
    with lab.engine.connect() as conn:
        while True:
            page = queries.occupancy(conn, at=T, cluster=lab.cluster, device_class=WHOLE, after=after, limit=1)
            pages.append(page.body)
            if page.next_after is None:
                break
            after = page.next_after
    # The off-slice gpu-2 takes its place in key order between gpu-1 and gpu-3.
    assert [listed(p) for p in pages] == [[("gpu-0", False, ["train"])], [("gpu-1", False, ["train"])],
                                          [("gpu-2", True, ["held-off"])], [("gpu-3", False, [])]]
    assert all(p["totals"] == {"devices": 4, "allocated": 3, "free": 1, "shared": 0} for p in pages)


def test_a_team_limited_class_answer_keeps_the_teams_devices_of_that_class(lab: LedgerHandle) -> None:
    with lab.engine.connect() as conn:
        page = queries.occupancy(conn, at=T, cluster=lab.cluster, device_class=MIG, teams=["ml"])
    # Lab claims live in namespace `ml` without a team label: their team is the namespace.
    assert listed(page.body) == [("mig-0", False, ["infer"]), ("mig-1", False, ["infer"])]
    assert page.body["totals"] == {"devices": 2, "allocated": 2, "free": 0, "shared": 2}


def test_the_seed_lab_class_takes_every_device_with_the_expected_totals(ledger: LedgerHandle) -> None:
    # seed-lab.jsonl has one DeviceClass, gpu.example.com (device.driver == 'gpu.example.com'), so its
    # occupancy is the whole lab: the totals of seed-lab.expected.json at 09:30.
    expected: Any = json.loads((HISTORIES / "seed-lab.expected.json").read_text())["checks"][0]
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    body: Any = ledger.occupancy(parse_time(expected["at"]), device_class="gpu.example.com")
    assert (body["totals"]["devices"], body["totals"]["allocated"], body["totals"]["free"]) == (
        expected["devices_total"], expected["devices_allocated"], expected["devices_free"])
    held: dict[str, JSONValue] = {d["device"]: f"{a['namespace']}/{a['claim']}"
                                  for d in body["devices"] for a in d["allocations"]}
    assert held == expected["allocated"]


def _class_file(path: Path, name: str, expression: str) -> Path:
    path.write_text(f"apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: {name}\n"
                    f"spec:\n  selectors:\n  - cel:\n      expression: \"{expression}\"\n")
    return path


def test_partitions_of_one_counter_set_stay_one_unit_in_their_class_totals(ledger: LedgerHandle,
                                                                            tmp_path: Path) -> None:
    # KEP-4815's slices: gpu-0 (40Gi) and gpu-0-partition-0..3 (10Gi each), all consuming gpu-0-counter-set.
    # A class of 40Gi devices takes gpu-0, one of 10Gi devices the four partitions; the totals keep
    # DESIGN §5's rule over the class's devices: the partitions are views of one GPU, counted once.
    memory = "device.capacity['resource-driver.example.com'].memory"
    ledger.replay(REAL / "kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml",
                  REAL / "kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml",
                  _class_file(tmp_path / "whole.yaml", "whole", f"{memory}.compareTo(quantity('40Gi')) == 0"),
                  _class_file(tmp_path / "part.yaml", "part", f"{memory}.compareTo(quantity('10Gi')) == 0"), at=T)
    whole: Any = ledger.occupancy(T, device_class="whole")
    part: Any = ledger.occupancy(T, device_class="part")
    assert [d["device"] for d in whole["devices"]] == ["gpu-0"]
    assert [d["device"] for d in part["devices"]] == [f"gpu-0-partition-{i}" for i in range(4)]
    assert whole["totals"] == part["totals"] == {"devices": 1, "allocated": 0, "free": 1, "shared": 0}


@pytest.mark.parametrize(("held", "asked"), [("gpu-0", "part"), ("gpu-0-partition-2", "whole")])
def test_a_class_unit_is_allocated_when_a_device_of_another_class_holds_its_counter_set(
        ledger: LedgerHandle, tmp_path: Path, held: str, asked: str) -> None:
    # The same KEP-4815 slices. A claim holds `held`; the class `asked` for does not list that device, but its own
    # devices share gpu-0-counter-set with it, so the one piece of hardware is not free for that class either:
    # a whole GPU held leaves no partition to allocate, a partition held leaves no whole GPU.
    memory = "device.capacity['resource-driver.example.com'].memory"
    claim_path = tmp_path / "claim.json"
    claim_path.write_text(json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "hold", "namespace": "ml", "uid": uid("claim"), "resourceVersion": rv(),
                     "creationTimestamp": stamp(0)},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "any"}}]}},
        "status": {"allocation": {"allocationTimestamp": stamp(0), "devices": {"results": [
            {"request": "r", "driver": "resource-driver.example.com", "pool": "my-pool", "device": held}]}}}}))
    ledger.replay(REAL / "kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml",
                  REAL / "kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml",
                  _class_file(tmp_path / "whole.yaml", "whole", f"{memory}.compareTo(quantity('40Gi')) == 0"),
                  _class_file(tmp_path / "part.yaml", "part", f"{memory}.compareTo(quantity('10Gi')) == 0"),
                  claim_path, at=T)
    body: Any = ledger.occupancy(T, device_class=asked)
    assert all(not d["allocations"] for d in body["devices"])  # the class's own devices are not allocated
    assert body["totals"] == {"devices": 1, "allocated": 1, "free": 0, "shared": 0}
    # Without a class the unit is the same one, allocated.
    assert ledger.occupancy(T)["totals"] == {"devices": 1, "allocated": 1, "free": 0, "shared": 0}


def test_a_class_counts_only_in_the_clusters_that_define_it(lab: LedgerHandle, tmp_path: Path) -> None:
    # Cluster `other` publishes two A100s of the same driver (whole-gpu's selectors would take them) but
    # defines no DeviceClass.
    other = LedgerHandle(engine=lab.engine, cluster="other")
    other.replay(history(tmp_path / "other.jsonl", [("ADDED", lab_slice(2), 0)]))
    published: Any = other.occupancy(T)
    assert [d["device"] for d in published["devices"]] == ["gpu-0", "gpu-1"]
    with lab.engine.connect() as conn:
        # No cluster given: the whole-gpu devices of `default`, none of `other` (the class is not defined there).
        body: Any = queries.occupancy_all(conn, at=T, device_class=WHOLE)
        assert [(d["cluster"], d["device"]) for d in body["devices"]] == [
            ("default", "gpu-0"), ("default", "gpu-1"), ("default", "gpu-2"), ("default", "gpu-3")]
        assert body["totals"] == {"devices": 4, "allocated": 3, "free": 1, "shared": 0}
        with pytest.raises(UnknownDeviceClass, match="in cluster 'other'"):
            queries.occupancy_all(conn, at=T, cluster="other", device_class=WHOLE)
