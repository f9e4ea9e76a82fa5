"""Pending demand: requested devices per DeviceClass against devices free at T (CEL, taints, counters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledger import services
from ledger.projections.selectors import DeviceView, matches
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject, JSONValue
from tests.factories import at, dig, namespace, stamp, taint_rule
from tests.integration.test_quotas import DRIVER, Lab, device_class, exactly, lab_slice, req
from tests.paths import HISTORIES


@pytest.mark.parametrize(("when", "free"), [("2026-11-02T09:30:00Z", 2), ("2026-11-02T10:40:00Z", 3)])
def test_seed_lab_big_requests_four_with_two_then_three_free(ledger: LedgerHandle, when: str, free: int) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    body: Any = services.pending(ledger.db, at=parse_time(when), cluster=ledger.cluster)
    assert body["classes"] == [{"cluster": ledger.cluster, "deviceClass": "gpu.example.com", "claims": 1,
                                "requested": 4, "free": free}]
    [big] = body["claims"]
    assert (big["namespace"], big["name"], big["team"], big["origin"]) == ("ml-train", "big", "vision", "manual")
    assert big["requests"] == [{"request": "gpu", "deviceClass": "gpu.example.com", "allocationMode": "ExactCount",
                                "count": 4, "free": free}]
    assert parse_time(big["pendingSince"]) <= parse_time(when)
    assert big["ageSeconds"] == (parse_time(when) - parse_time(big["pendingSince"])).total_seconds()


def test_a_claim_being_deleted_is_no_longer_pending_demand(ledger: LedgerHandle, tmp_path: Path) -> None:
    # The scheduler allocates no claim with a deletionTimestamp: seed-lab's over-request "big", its deletion asked at
    # 10:50 (a finalizer keeps it a while), waits for nothing from then on, though it still holds no allocation.
    [added] = [json.loads(text) for text in (HISTORIES / "seed-lab.jsonl").read_text().splitlines()
               if '"kind":"ResourceClaim","metadata":{"name":"big"' in text and '"type":"ADDED"' in text]
    obj = added["object"]
    obj["metadata"] |= {"deletionTimestamp": "2026-11-02T10:50:00Z", "finalizers": ["example.com/hold"],
                        "resourceVersion": "999001"}
    deleting = tmp_path / "deleting.jsonl"
    deleting.write_text(json.dumps({"observedAt": "2026-11-02T10:50:01Z", "type": "MODIFIED", "object": obj}) + "\n")
    ledger.replay(HISTORIES / "seed-lab.jsonl", deleting)

    before: Any = services.pending(ledger.db, at=parse_time("2026-11-02T10:40:00Z"), cluster=ledger.cluster)
    after: Any = services.pending(ledger.db, at=parse_time("2026-11-02T10:50:00Z"), cluster=ledger.cluster)
    assert [(c["name"], c["requests"][0]["count"]) for c in before["claims"]] == [("big", 4)]
    assert before["classes"][0]["requested"] == 4
    assert after == {"at": "2026-11-02T10:50:00Z", "classes": [], "claims": []}
    # Still a claim without an allocation: the claims listing shows it, with its state.
    listing: Any = services.claims(ledger.db, at=parse_time("2026-11-02T10:55:00Z"), cluster=ledger.cluster)
    listed = {c["name"]: c["state"] for c in listing["claims"]}
    assert listed["big"] == "pending"


def _pending_names(ledger: LedgerHandle, when: str) -> list[str]:
    body: Any = services.pending(ledger.db, at=parse_time(when), cluster=ledger.cluster)
    return [f"{c['namespace']}/{c['name']}" for c in body["claims"]]


def test_a_template_claim_waits_while_its_pod_is_pending_and_not_once_the_pod_finished(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # seed-lab.jsonl: pod train-0 is created Pending at 09:02:01 with its template claim train-0-gpu-4fj8q, which is
    # allocated at 09:02:05; the pod Succeeds at 10:00:01 and the claim is released then, deleted at 10:00:04, the pod
    # at 10:00:07. Here the two deletions are left out, as for a Job whose finished pods are kept for their logs:
    # the released claim stays, with no allocation, for as long as its Succeeded pod does.
    lines = (HISTORIES / "seed-lab.jsonl").read_text().splitlines()
    deletions = [n for n, text in enumerate(lines) if '"type":"DELETED"' in text and "train-0" in text]
    assert len(deletions) == 2
    kept = tmp_path / "finished-pod-kept.jsonl"
    kept.write_text("".join(text + "\n" for n, text in enumerate(lines) if n not in deletions))
    ledger.replay(kept)

    # Before its allocation the claim waits for devices for a Pending pod: demand.
    assert _pending_names(ledger, "2026-11-02T09:02:03Z") == ["ml-train/train-0-gpu-4fj8q"]
    # Released with its pod Succeeded: no demand, then or hours later; the over-request "big" still is.
    assert _pending_names(ledger, "2026-11-02T10:00:02Z") == ["ml-train/big"]
    assert _pending_names(ledger, "2026-11-02T10:40:00Z") == ["ml-train/big"]
    # Still a claim without an allocation: the claims listing shows it as such.
    listing: Any = services.claims(ledger.db, at=parse_time("2026-11-02T10:40:00Z"), cluster=ledger.cluster)
    assert {c["name"]: c["state"] for c in listing["claims"]}["train-0-gpu-4fj8q"] == "pending"


def test_a_manual_claim_owned_by_a_pod_that_finished_still_counts_while_another_pod_waits_for_it(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # seed-lab's over-request "big" is manual, and pod big-pod waits for it by name, Pending all along. Here it is
    # also owned (not as its controller) by pod train-0, which Succeeds at 10:00:01 and is deleted at 10:00:07: an
    # owner that finished says nothing about a manual claim's other users, so big stays demand.
    lines = (HISTORIES / "seed-lab.jsonl").read_text().splitlines()
    train_pod_uid = next(json.loads(text)["object"]["metadata"]["uid"] for text in lines
                         if json.loads(text)["object"].get("kind") == "Pod" and '"name":"train-0"' in text)
    owned = tmp_path / "owned-big.jsonl"
    with owned.open("w") as out:
        for text in lines:
            event = json.loads(text)
            meta = event["object"].get("metadata", {})
            if event["object"].get("kind") == "ResourceClaim" and meta.get("name") == "big":
                meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "train-0",
                                            "uid": train_pod_uid, "controller": False}]
            out.write(json.dumps(event) + "\n")
    ledger.replay(owned)

    listing: Any = services.claims(ledger.db, at=parse_time("2026-11-02T10:40:00Z"), cluster=ledger.cluster)
    assert {c["name"]: c["origin"] for c in listing["claims"]}["big"] == "manual"
    assert _pending_names(ledger, "2026-11-02T10:00:02Z") == ["ml-train/big"]
    assert _pending_names(ledger, "2026-11-02T10:40:00Z") == ["ml-train/big"]


def test_a_template_claim_whose_pod_was_never_recorded_still_counts_as_demand(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # Without the pod's lines (a recording that started after it, a cluster whose pods are not watched) nothing says
    # the pod finished: the claim released at 10:00:01 is counted, as before, until its deletion at 10:00:04.
    lines = (HISTORIES / "seed-lab.jsonl").read_text().splitlines()
    no_pod = tmp_path / "no-pod.jsonl"
    pod_lines = [text for text in lines if json.loads(text)["object"]["kind"] == "Pod" and "train-0" in text]
    assert len(pod_lines) == 4
    no_pod.write_text("".join(text + "\n" for text in lines if text not in pod_lines))
    ledger.replay(no_pod)

    assert _pending_names(ledger, "2026-11-02T10:00:02Z") == ["ml-train/big", "ml-train/train-0-gpu-4fj8q"]
    assert _pending_names(ledger, "2026-11-02T10:00:05Z") == ["ml-train/big"]


def _tainted(name: str, effect: str) -> JSONObject:
    return {"name": name, "attributes": {"index": {"int": 90}, "model": {"string": "A100"}},
            "capacity": {"memory": {"value": "80Gi"}},
            "taints": [{"key": "gpu.example.com/unhealthy", "value": "ecc", "effect": effect}]}


def test_tainted_devices_are_not_free_and_cel_errors_match_nothing(ledger: LedgerHandle, tmp_path: Path) -> None:
    h = Lab()
    h.add(namespace("ml", "vision"))
    h.add(device_class("gpu.example.com"))
    # A class whose selector reads an attribute domain no device has: an evaluation error, so no match.
    h.add(device_class("nvidia-only", selector="device.attributes['gpu.nvidia.com'].productName == 'H100'"))
    h.add(device_class("broken", selector="device.attributes[ == "))
    h.add(lab_slice(4, extra=[_tainted("gpu-no-schedule", "NoSchedule"), _tainted("gpu-no-execute", "NoExecute"),
                              _tainted("gpu-prefer", "PreferNoSchedule")]))
    h.claim("held", [req("gpu", exactly("gpu.example.com", 1))], allocate={"gpu": 1})  # takes gpu-0
    h.claim("wants-three", [req("gpu", exactly("gpu.example.com", 3))], origin="manual")
    h.claim("wants-index-3", [req("gpu", exactly("gpu.example.com", 1, selectors=[
        {"cel": {"expression": f"device.attributes['{DRIVER}'].index == 3"}}]))], origin="manual")
    h.claim("wants-nvidia", [req("gpu", exactly("nvidia-only", 1))], origin="manual")
    h.claim("wants-broken", [req("gpu", exactly("broken", 1))], origin="manual")
    h.replay(ledger, tmp_path)
    body: Any = services.pending(ledger.db, at=at(30), cluster=ledger.cluster)
    classes = {c["deviceClass"]: c for c in body["classes"]}
    # gpu-1..gpu-3 and the PreferNoSchedule device are free; gpu-0 is held; two are tainted out.
    assert classes["gpu.example.com"] == {"cluster": ledger.cluster, "deviceClass": "gpu.example.com", "claims": 2,
                                          "requested": 4, "free": 4}
    assert classes["nvidia-only"]["free"] == 0 and classes["broken"]["free"] == 0
    by_claim = {c["name"]: c["requests"][0]["free"] for c in body["claims"]}
    assert by_claim == {"wants-three": 4, "wants-index-3": 1, "wants-nvidia": 0, "wants-broken": 0}


def test_devices_a_blocking_device_taint_rule_matches_are_not_free_while_it_is_in_force(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    h = Lab()
    h.add(namespace("ml", "vision"))
    h.add(device_class("gpu.example.com"))
    h.add(device_class("index-five-up", selector=f"device.attributes['{DRIVER}'].index >= 5"))
    h.add(lab_slice(6))  # gpu-0 .. gpu-5, pool node-a
    h.claim("held", [req("gpu", exactly("gpu.example.com", 1))], allocate={"gpu": 1}, minutes=2)  # takes gpu-0
    h.claim("wants-two", [req("gpu", exactly("gpu.example.com", 2))], origin="manual", minutes=2)
    index_two: list[JSONValue] = [{"cel": {"expression": f"device.attributes['{DRIVER}'].index == 2"}}]
    rules = {
        # taint one device each, by name (gpu-1), by CEL (gpu-2) and by DeviceClass (gpu-5)
        "by-name": taint_rule("by-name", selector={"driver": DRIVER, "pool": "node-a", "device": "gpu-1"}),
        "by-cel": taint_rule("by-cel", selector={"selectors": index_two}, effect="NoExecute"),
        "by-class": taint_rule("by-class", selector={"deviceClassName": "index-five-up"}),
        # match nothing: effect None, no selector, a CEL error, another pool, a class not defined, a field that
        # contradicts another
        "effect-none": taint_rule("effect-none", selector={}, effect="None"),
        "no-selector": taint_rule("no-selector", selector=None),
        "cel-error": taint_rule("cel-error", selector={"selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'H100'"}}]}),
        "other-pool": taint_rule("other-pool", selector={"pool": "node-b"}),
        "no-class": taint_rule("no-class", selector={"deviceClassName": "not-defined"}),
        "contradiction": taint_rule("contradiction", selector={"device": "gpu-3", "selectors": index_two}),
    }
    for rule in rules.values():
        dig(rule, "metadata")["creationTimestamp"] = stamp(5)
        h.add(rule, 5)
    h.add(taint_rule("later", selector={"device": "gpu-3"}, created=40), 40)
    h.events.append(("MODIFIED", taint_rule("by-cel", selector={"selectors": index_two}, effect="None"), 42))
    h.events.append(("DELETED", rules["by-name"], 45))
    h.replay(ledger, tmp_path)

    def free_at(minutes: float) -> tuple[int, int]:
        body: Any = services.pending(ledger.db, at=at(minutes), cluster=ledger.cluster)
        [cls] = body["classes"]
        [claim] = body["claims"]
        assert (cls["deviceClass"], cls["requested"], claim["name"]) == ("gpu.example.com", 2, "wants-two")
        return cls["free"], claim["requests"][0]["free"]

    # Minute 30: gpu-0 held; gpu-1, gpu-2, gpu-5 tainted by rules; gpu-3 and gpu-4 free.
    assert free_at(30) == (2, 2)
    # Minute 50: by-name deleted (gpu-1 free again), by-cel now effect None (gpu-2 free), later taints gpu-3:
    # gpu-1, gpu-2 and gpu-4 free.
    assert free_at(50) == (3, 3)
    # Minute 3: no rule yet (they were created at minute 5 and 40): gpu-1 .. gpu-5 free.
    assert free_at(3) == (5, 5)


def test_cel_selectors_follow_kubernetes_device_shapes() -> None:
    device = DeviceView(driver="gpu.example.com", attributes={"model": {"string": "LATEST-GPU-MODEL"},
                                                               "index": {"int": 7},
                                                               "gpu.example.com/uuid": {"string": "gpu-1"}},
                        capacity={"memory": {"value": "80Gi"}})
    assert matches("device.driver == 'gpu.example.com'", device)
    assert matches("device.attributes['gpu.example.com'].index == 7", device)
    assert matches("device.attributes['gpu.example.com'].model == 'LATEST-GPU-MODEL'", device)
    assert matches("device.attributes['gpu.example.com'].uuid == 'gpu-1'", device)
    assert matches("device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0", device)
    assert not matches("device.capacity['gpu.example.com'].memory.isGreaterThan(quantity('100Gi'))", device)
    assert not matches("device.attributes['dra.net'].rdma == true", device)  # missing domain: no match
    assert not matches("device.attributes[", device)  # does not compile: no match
    assert not matches("'not a bool'", device)
