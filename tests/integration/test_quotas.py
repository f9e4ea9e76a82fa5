"""Kueue-style counting (KUEUE-COUNTING.md §8) on histories of real ``resource.k8s.io/v1`` shapes.

Each case replays Namespaces, DeviceClasses, a ResourceSlice and allocated ResourceClaims (the shape
the API server returns, with ``status.allocation.devices.results[]``), then reads ``quotas`` at T.
Kueue charges templates at admission; the ledger charges the claims that held devices, with Kueue's
rules, and still counts what Kueue would refuse, naming Kueue's reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ledger import services
from ledger.config import LedgerConfig
from ledger.projections.quotas import (
    MAX_INT64,
    REASON_ALL,
    REASON_CLAIM_BY_NAME,
    REASON_FIRST_AVAILABLE,
    REASON_NO_EXACTLY,
    reason_unmapped,
)
from ledger.quantities import parse_quantity
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject, JSONValue
from tests.factories import at, history, namespace, rv, stamp, uid
from tests.paths import HISTORIES

T = at(30)
DRIVER = "gpu.example.com"
DEFAULT_MAPPING: list[JSONObject] = [{"name": "res-1", "deviceClassNames": ["class-1"]},
                   {"name": "res-2", "deviceClassNames": ["class-2"]}]


def config(mappings: Sequence[JSONObject] = DEFAULT_MAPPING, quotas: Sequence[JSONObject] = ()) -> LedgerConfig:
    return LedgerConfig.model_validate({"deviceClassMappings": list(mappings), "quotas": list(quotas)})


def device_class(name: str, *, selector: str | None = None, extended: str | None = None) -> JSONObject:
    """A v1 DeviceClass selecting the lab driver's devices (optionally narrowed by ``selector``)."""
    selectors: list[JSONValue] = [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]
    if selector:
        selectors.append({"cel": {"expression": selector}})
    spec: JSONObject = {"selectors": selectors}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "uid": uid("class"), "resourceVersion": rv(), "creationTimestamp": stamp(0)},
            "spec": spec}


def lab_slice(n: int = 16, extra: Sequence[JSONObject] = ()) -> JSONObject:
    """One node's ResourceSlice with ``n`` GPUs gpu-0.. (dra-example-driver shapes) plus ``extra`` devices."""
    devices: list[JSONValue] = [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "model": {"string": "A100"}},
                                 "capacity": {"memory": {"value": "80Gi"}}} for i in range(n)]
    devices.extend(extra)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "node-a-gpu.example.com-x1", "uid": uid("slice"), "resourceVersion": rv(),
                         "creationTimestamp": stamp(0)},
            "spec": {"driver": DRIVER, "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


class Lab:
    """Builds a history: teams' namespaces, classes, one slice, and claims allocated on its devices."""

    def __init__(self) -> None:
        self.events: list[tuple[str, JSONObject, float]] = []
        self.next_device = 0

    def add(self, obj: JSONObject, minutes: float = 0) -> None:
        self.events.append(("ADDED", obj, minutes))

    def claim(self, name: str, requests: list[JSONValue], *, ns: str = "ml", origin: str = "template",
              allocate: dict[str, int] | None = None, admin: Sequence[str] = (),
              results: list[JSONObject] | None = None, minutes: float = 10) -> JSONObject:
        """A claim ADDED allocated at ``minutes``: ``allocate`` maps request name -> devices given to it."""
        annotations: JSONObject = {}
        owner: list[JSONValue] = []
        if origin == "template":
            annotations["resource.kubernetes.io/pod-claim-name"] = "gpu"
            owner = [{"apiVersion": "v1", "kind": "Pod", "name": f"{name}-pod", "uid": uid("pod"), "controller": True,
                      "blockOwnerDeletion": True}]
        elif origin == "extended":
            annotations["resource.kubernetes.io/extended-resource-claim"] = "true"
            owner = [{"apiVersion": "v1", "kind": "Pod", "name": f"{name}-pod", "uid": uid("pod"), "controller": True}]
        if results is None:
            results = []
            for request, n in (allocate or {}).items():
                for _ in range(n):
                    result: JSONObject = {"request": request, "driver": DRIVER, "pool": "node-a",
                                          "device": f"gpu-{self.next_device}"}
                    if request in admin:
                        result["adminAccess"] = True
                    results.append(result)
                    self.next_device += 1
        obj: JSONObject = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": uid("claim"), "resourceVersion": rv(),
                         "creationTimestamp": stamp(minutes - 1), "annotations": annotations,
                         "ownerReferences": owner},
            "spec": {"devices": {"requests": requests}},
            "status": {"allocation": {"devices": {"results": list(results)}, "allocationTimestamp": stamp(minutes),
                                      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                          {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
                       "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": uid("pod")}]}}
        if not results:
            del obj["status"]
        self.add(obj, minutes)
        return obj

    def replay(self, ledger: LedgerHandle, tmp_path: Path) -> None:
        path = history(tmp_path / f"lab-{uid('h')}.jsonl", sorted(self.events, key=lambda e: e[2]))
        report = ledger.replay(path)
        assert not report.rejected, report.rejected


def exactly(cls: str, count: int | None = None, **more: JSONValue) -> JSONObject:
    spec: JSONObject = {"deviceClassName": cls, "allocationMode": "ExactCount", **more}
    if count is not None:
        spec["count"] = count
    return spec


def req(name: str, spec: JSONObject) -> JSONObject:
    return {"name": name, "exactly": spec}


def lab(*classes: JSONObject, teams: dict[str, str] | None = None, devices: Sequence[JSONObject] = ()) -> Lab:
    made = Lab()
    for ns, team in (teams or {"ml": "vision"}).items():
        made.add(namespace(ns, team))
    for cls in classes or (device_class("class-1"), device_class("class-2")):
        made.add(cls)
    made.add(lab_slice(extra=devices))
    return made


def used(ledger: LedgerHandle, cfg: LedgerConfig, when: datetime = T) -> dict[tuple[str, str], Any]:
    body: Any = services.quotas(ledger.db, at=when, config=cfg, cluster=ledger.cluster)
    return {(r["team"], r["resourceName"]): r for r in body["rows"]}


def amounts(rows: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """Used per resource name, added over teams; names with nothing used are left out."""
    out: dict[str, Any] = {}
    for (_, name), r in rows.items():
        if r["used"]:
            out[name] = out.get(name, 0) + r["used"]
    return out


# --- §8 cases ------------------------------------------------------------------------------------


def test_case_1_one_template_request_of_two_devices_counts_two(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    h.claim("job-0-gpu", [req("gpu", exactly("class-1", 2))], allocate={"gpu": 2})
    h.replay(ledger, tmp_path)
    rows = used(ledger, config())
    assert amounts(rows) == {"res-1": 2}
    assert rows[("vision", "res-1")]["reasons"] == []


def test_case_2_two_template_claims_of_two_classes_count_per_mapping(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    h.claim("job-0-a", [req("a", exactly("class-1", 2))], allocate={"a": 2})
    h.claim("job-0-b", [req("b", exactly("class-2", 1))], allocate={"b": 1})
    h.replay(ledger, tmp_path)
    assert amounts(used(ledger, config())) == {"res-1": 2, "res-2": 1}


def test_case_3_a_claim_used_by_two_containers_and_two_pods_counts_once(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    claim = h.claim("job-0-gpu", [req("gpu", exactly("class-1", 2))], allocate={"gpu": 2})
    status = claim["status"]
    assert isinstance(status, dict)
    status["reservedFor"] = [{"resource": "pods", "name": "p-a", "uid": uid("pod")},
                             {"resource": "pods", "name": "p-b", "uid": uid("pod")}]
    h.replay(ledger, tmp_path)
    assert amounts(used(ledger, config())) == {"res-1": 2}


def test_case_4_two_requests_with_a_match_attribute_constraint_add_up(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    claim = h.claim("job-0-pair", [req("a", exactly("class-1", 1)), req("b", exactly("class-1", 1))],
                    allocate={"a": 1, "b": 1})
    spec = claim["spec"]
    assert isinstance(spec, dict) and isinstance(spec["devices"], dict)
    spec["devices"]["constraints"] = [{"requests": ["a", "b"], "matchAttribute": "gpu.example.com/model"}]
    h.replay(ledger, tmp_path)
    assert amounts(used(ledger, config())) == {"res-1": 2}


def test_case_5_an_admin_access_request_is_charged_nothing(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    h.claim("job-0-gpu", [req("gpu", exactly("class-1", 2)), req("admin", exactly("class-1", 1, adminAccess=True))],
            allocate={"gpu": 2, "admin": 1}, admin=["admin"])
    h.replay(ledger, tmp_path)
    rows = used(ledger, config())
    assert amounts(rows) == {"res-1": 2}
    assert rows[("vision", "res-1")]["reasons"] == []


def test_case_6_count_omitted_is_one_and_three_pods_count_three(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab(device_class("foo.example.com"))
    for i in range(3):
        h.claim(f"job-{i}-foo", [req("foo", exactly("foo.example.com"))], allocate={"foo": 1})
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "foo", "deviceClassNames": ["foo.example.com"]}],
                 [{"team": "vision", "resourceName": "foo", "nominalQuota": 10}])
    row = used(ledger, cfg)[("vision", "foo")]
    assert (row["used"], row["nominalQuota"], row["overQuota"]) == (3, 10, False)


def test_case_7_seven_pods_against_a_nominal_of_five_is_over_quota_and_pending_pods_count_nothing(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab(device_class("foo.example.com"), teams={"alpha-ns": "alpha", "beta-ns": "beta"})
    for i in range(7):
        h.claim(f"a-{i}-foo", [req("foo", exactly("foo.example.com", 1))], ns="alpha-ns", allocate={"foo": 1})
    for i in range(3):
        h.claim(f"b-{i}-foo", [req("foo", exactly("foo.example.com", 1))], ns="beta-ns", allocate={"foo": 1})
    h.claim("b-9-foo", [req("foo", exactly("foo.example.com", 1))], ns="beta-ns")  # pending: cohort is full
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "foo", "deviceClassNames": ["foo.example.com"]}],
                 [{"team": "alpha", "resourceName": "foo", "nominalQuota": 5},
                  {"team": "beta", "resourceName": "foo", "nominalQuota": 5}])
    rows = used(ledger, cfg)
    assert (rows[("alpha", "foo")]["used"], rows[("alpha", "foo")]["overQuota"]) == (7, True)
    assert (rows[("beta", "foo")]["used"], rows[("beta", "foo")]["overQuota"]) == (3, False)
    assert sum(r["used"] for r in rows.values()) == 10  # the cohort's 5 + 5, 2 of them borrowed by alpha
    demand: Any = services.pending(ledger.db, at=T, cluster=ledger.cluster)
    assert [(c["namespace"], c["name"]) for c in demand["claims"]] == [("beta-ns", "b-9-foo")]


def test_case_8_refused_claims_are_counted_with_kueues_reason(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    h.claim("all-nics", [req("nics", {"deviceClassName": "class-1", "allocationMode": "All"})], allocate={"nics": 3})
    h.claim("prio", [{"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "class-2", "count": 4},
                                                          {"name": "small", "deviceClassName": "class-2"}]}],
            results=[{"request": "gpu/small", "driver": DRIVER, "pool": "node-a", "device": "gpu-10"}])
    h.claim("neither", [{"name": "odd"}],
            results=[{"request": "odd", "driver": DRIVER, "pool": "node-a", "device": "gpu-11"}])
    h.claim("by-name", [req("gpu", exactly("class-2", 1))], origin="manual",
            results=[{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-12"}])
    h.replay(ledger, tmp_path)
    rows = used(ledger, config())
    assert amounts(rows) == {"res-1": 3, "res-2": 2}
    reasons = set(rows[("vision", "res-1")]["reasons"]) | set(rows[("vision", "res-2")]["reasons"])
    assert reasons == {f"ml/all-nics: {REASON_ALL}", f"ml/prio: {REASON_FIRST_AVAILABLE}",
                       f"ml/by-name: {REASON_CLAIM_BY_NAME}"}
    # Listed in the order of the row's claims (namespace, name), not in the order the claims were created.
    names = [c["name"] for c in rows[("vision", "res-2")]["claims"]]
    assert names == sorted(names) and names.index("by-name") < names.index("prio")
    assert rows[("vision", "res-2")]["reasons"] == [f"ml/by-name: {REASON_CLAIM_BY_NAME}",
                                                    f"ml/prio: {REASON_FIRST_AVAILABLE}"]
    # The request with neither exactly nor firstAvailable has no class to map: its result names none.
    assert not any(REASON_NO_EXACTLY in r for row in rows.values() for r in row["reasons"])
    # With an empty configuration every class is unmapped: still counted, under the class name.
    empty = used(ledger, config([]))
    assert amounts(empty) == {"class-1": 3, "class-2": 2}
    assert f"ml/all-nics: {reason_unmapped('class-1')}" in empty[("vision", "class-1")]["reasons"]


def test_case_9_counts_add_up_and_saturate_at_max_int64(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab()
    h.claim("sum", [req("a", exactly("class-1", 2)), req("b", exactly("class-1", 3))], allocate={"a": 2, "b": 3})
    h.claim("huge", [req("a", exactly("class-2", MAX_INT64)), req("b", exactly("class-2", MAX_INT64))],
            allocate={"a": 1, "b": 1})
    h.replay(ledger, tmp_path)
    assert amounts(used(ledger, config())) == {"res-1": 5, "res-2": MAX_INT64}


def test_case_10_classes_pooled_under_one_name_add_up(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab(device_class("gpu-a100"), device_class("gpu-h100"))
    h.claim("mixed", [req("a", exactly("gpu-a100", 1)), req("h", exactly("gpu-h100", 2))], allocate={"a": 1, "h": 2})
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "example.com/gpu", "deviceClassNames": ["gpu-a100", "gpu-h100"]}])
    assert amounts(used(ledger, cfg)) == {"example.com/gpu": 3}


def test_case_11_an_extended_resource_claim_counts_under_the_extended_resource_name(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab(device_class("gpu.example.com", extended="example.com/gpu"), device_class("plain.example.com"))
    # The scheduler's claim for containers asking 1 and 2 GPUs: one request per container.
    h.claim("ext-0-extended-resources-q9w7d", [req("container-0-request-0", exactly("gpu.example.com", 1)),
                                               req("container-1-request-0", exactly("gpu.example.com", 2))],
            origin="extended", allocate={"container-0-request-0": 1, "container-1-request-0": 2})
    h.claim("ext-1-extended-resources-a1b2c", [req("container-0-request-0", exactly("plain.example.com", 1))],
            origin="extended", allocate={"container-0-request-0": 1})
    h.replay(ledger, tmp_path)
    rows = used(ledger, config([]))
    assert amounts(rows) == {"example.com/gpu": 3, "deviceclass.resource.kubernetes.io/plain.example.com": 1}
    assert all(not r["reasons"] for r in rows.values())


def test_case_12_extended_claims_of_two_classes_count_under_their_shared_mapping(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab(device_class("class-a", extended="vendor.example/a"), device_class("class-b", extended="vendor.example/b"))
    h.claim("w-extended-resources-x", [req("container-0-request-0", exactly("class-a", 5)),
                                       req("container-1-request-0", exactly("class-b", 5))],
            origin="extended", allocate={"container-0-request-0": 5, "container-1-request-0": 5})
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "gpu-claims", "deviceClassNames": ["class-a", "class-b"]}])
    assert amounts(used(ledger, cfg)) == {"gpu-claims": 10}


def _mig(name: str, profile: str, memory: str) -> JSONObject:
    return {"name": name, "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
            "capacity": {"memory": {"value": memory}},
            "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": memory}}}]}


def test_case_13_counter_sources_charge_the_largest_matching_counter_times_count(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    migs = [_mig("gpu-0-mig-1g", "1g.10gb", "9856Mi"), _mig("gpu-0-mig-3g", "3g.40gb", "40Gi")]
    h = lab(device_class("mig.example.com", selector="device.attributes['gpu.example.com'].type == 'mig'"),
            device_class("mig-1g.example.com", selector="device.attributes['gpu.example.com'].profile == '1g.10gb'"),
            devices=migs)
    h.claim("any-mig", [req("mig", exactly("mig.example.com", 1))],
            results=[{"request": "mig", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-1g"}])
    h.claim("small-migs", [req("mig", exactly("mig-1g.example.com", 3))],
            ns="ml2", results=[{"request": "mig", "driver": DRIVER, "pool": "node-a", "device": "gpu-0-mig-1g"}])
    h.add(namespace("ml2", "speech"))
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "gpu.memory", "deviceClassNames": ["mig.example.com", "mig-1g.example.com"],
                   "sources": [{"counter": "memory"}]}],
                 [{"team": "speech", "resourceName": "gpu.memory", "nominalQuota": "20Gi"}])
    rows = used(ledger, cfg)
    assert rows[("vision", "gpu.memory")]["used"] == parse_quantity("40Gi")
    assert rows[("speech", "gpu.memory")]["used"] == 3 * parse_quantity("9856Mi")
    assert rows[("speech", "gpu.memory")]["overQuota"] is True  # 28.875Gi > 20Gi


def test_capacity_sources_charge_the_requested_capacity_times_count(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = lab(device_class("gpu.example.com"))
    # kueue_resourceclaimtemplate_capacity-request-qualified-name-4Gi_v1.yaml, allocated twice.
    h.claim("cap-0", [req("gpu", exactly("gpu.example.com", 1,
                                         capacity={"requests": {"gpu.example.com/memory": "4Gi"}}))],
            allocate={"gpu": 1})
    h.claim("cap-1", [req("gpu", exactly("gpu.example.com", 2))], allocate={"gpu": 2})
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "gpu.example.com/memory", "deviceClassNames": ["gpu.example.com"],
                   "sources": [{"capacity": "gpu.example.com/memory"}]}])
    # cap-0: its request, 4Gi x 1; cap-1: no request, so the device's full capacity (80Gi) x 2.
    assert amounts(used(ledger, cfg)) == {"gpu.example.com/memory": parse_quantity("4Gi") + 2 * parse_quantity("80Gi")}


# --- the seed lab --------------------------------------------------------------------------------

SEED_CONFIG = config([{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]}],
                     [{"team": "vision", "resourceName": "example.com/gpu", "nominalQuota": 3},
                      {"team": "nlp", "resourceName": "example.com/gpu", "nominalQuota": 4}])
CHECKS = [c["at"] for c in json.loads((HISTORIES / "seed-lab.expected.json").read_text())["checks"]]
EXPECTED_AT = {"2026-11-02T09:30:00Z": {"vision": 4, "nlp": 2},
               "2026-11-02T10:40:00Z": {"vision": 3, "nlp": 2},
               "2026-11-02T12:00:00Z": {"vision": 3, "nlp": 2}}


@pytest.fixture()
def seed_lab(ledger: LedgerHandle) -> LedgerHandle:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    return ledger


@pytest.mark.parametrize("check", CHECKS)
def test_seed_lab_quota_usage_per_team_at_each_check(seed_lab: LedgerHandle, check: str) -> None:
    rows = used(seed_lab, SEED_CONFIG, parse_time(check))
    assert {team: r["used"] for (team, _), r in rows.items()} == EXPECTED_AT[check]
    assert rows[("vision", "example.com/gpu")]["overQuota"] is (EXPECTED_AT[check]["vision"] > 3)
    # pick-seven and shared-gpu are plain claims referenced by name: Kueue would refuse their pods.
    assert f"ml-train/pick-seven: {REASON_CLAIM_BY_NAME}" in rows[("vision", "example.com/gpu")]["reasons"]
    assert rows[("nlp", "example.com/gpu")]["reasons"] == [f"ml-serve/shared-gpu: {REASON_CLAIM_BY_NAME}"]


def test_seed_lab_vision_is_over_a_quota_of_3_from_pair_0_allocated_until_train_0_released(
        seed_lab: LedgerHandle) -> None:
    body: Any = services.quota_history(seed_lab.db, start=parse_time("2026-11-02T09:00:00Z"),
                                  end=parse_time("2026-11-02T12:00:00Z"), config=SEED_CONFIG, cluster=seed_lab.cluster)
    over = [(i["from"], i["to"], i["used"]) for i in body["intervals"] if i["team"] == "vision" and i["overQuota"]]
    # pair-0's allocationTimestamp is 09:15:00; train-0's allocation left the claim when observed at 10:00:01.
    assert over == [("2026-11-02T09:15:00Z", "2026-11-02T10:00:01Z", 4)]
    nlp = [i for i in body["intervals"] if i["team"] == "nlp"]
    assert not any(i["overQuota"] for i in nlp)


def test_seed_lab_without_mappings_counts_under_class_and_extended_names(seed_lab: LedgerHandle) -> None:
    rows = used(seed_lab, config([]), parse_time("2026-11-02T09:30:00Z"))
    assert amounts(rows) == {"gpu.example.com": 4 + 1, "deviceclass.resource.kubernetes.io/gpu.example.com": 1}
    assert rows[("nlp", "deviceclass.resource.kubernetes.io/gpu.example.com")]["reasons"] == []


def test_namespace_overrides_in_the_configuration_choose_the_team_billed(seed_lab: LedgerHandle) -> None:
    cfg = LedgerConfig.model_validate({"teams": {"overrides": {"ml-serve": "platform"}},
                                       "deviceClassMappings": [{"name": "example.com/gpu",
                                                                "deviceClassNames": ["gpu.example.com"]}]})
    rows = used(seed_lab, cfg, parse_time("2026-11-02T09:30:00Z"))
    assert {team: r["used"] for (team, _), r in rows.items()} == {"vision": 4, "platform": 2}
