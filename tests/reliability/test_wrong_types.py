"""Wrong types in every field the translator reads: a located ``InvalidObject`` or a correct translation.

Rich objects of every tracked kind are taken apart leaf by leaf and container by container; each field in
turn gets a value of every other JSON type. The translator must either translate the object or raise
:class:`InvalidObject` whose dotted path is the changed field, one of its parents or one of its children
(``spec.devices[0].attributes``), never another exception and never a path elsewhere. Then one file with
every such object between valid lines replays without stopping, rejecting exactly those lines.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from ledger.errors import InvalidObject, UnsupportedObject
from ledger.testing.handle import LedgerHandle
from ledger.translator.translate import Observation, TranslatorState, translate
from ledger.types import JSONObject, JSONValue
from tests import factories as f
from tests.reliability.world import Sandwich, assert_api_answers, line

WRONG: list[JSONValue] = [7, 1.5, "x", True, [], {}, [7], {"x": 7}]


def _kind_of(value: object) -> str:
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, int | float) else type(value).__name__


def rich_objects() -> dict[str, JSONObject]:
    """One object of each tracked kind with every field the translator reads set."""
    managed: list[JSONValue] = [{"manager": "kube-scheduler", "operation": "Update", "time": f.stamp(3)}]
    slice_ = f.resource_slice(name="rich", pool="rich", devices=[
        {"name": "gpu-0", "nodeName": "node-r", "attributes": {"model": {"string": "X"}, "n": {"int": 1}},
         "capacity": {"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}},
         "allowMultipleAllocations": True, "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
         "consumesCounters": [{"counterSet": "cs", "counters": {"memory": {"value": "10Gi"}}}]}])
    cast(Any, slice_)["spec"]["sharedCounters"] = [{"name": "cs", "counters": {"memory": {"value": "80Gi"}}}]
    cast(Any, slice_)["metadata"]["managedFields"] = managed
    claim = f.claim(name="rich", claim_uid="rich-claim", results=["gpu-0"], allocated_at=2, reserved=[("p", "pu")],
                    deletion=50, annotations={"resource.kubernetes.io/pod-claim-name": "gpu"}, pool="rich")
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    meta["managedFields"] = managed
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pu"}]
    spec_requests = cast(Any, claim)["spec"]["devices"]["requests"]
    spec_requests.append({"name": "alt", "firstAvailable": [
        {"name": "big", "deviceClassName": "big.example.com", "count": 2}]})
    allocation = cast(Any, claim)["status"]["allocation"]
    cast(Any, allocation)["devices"]["results"][0].update({"shareID": "s1", "consumedCapacity": {"memory": "1Gi"},
                                                "adminAccess": False})
    cast(Any, allocation)["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["node-r"]}]}]}
    cast(Any, claim)["status"]["reservedFor"][0]["apiGroup"] = ""
    pod = f.pod(name="p", pod_uid="pu", claim_name="rich")
    cast(Any, pod)["spec"]["nodeName"] = "node-r"
    cast(Any, pod)["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "rich"}]
    cast(Any, pod)["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "ext"}
    cast(Any, pod)["metadata"]["managedFields"] = managed
    namespace = f.namespace("rich-ns", "rich-team")
    device_class: JSONObject = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": "rich.example.com", "uid": "dc", "creationTimestamp": f.stamp(0),
                                 "managedFields": managed},
                    "spec": {"selectors": [{"cel": {"expression": "true"}}]}}
    return {"ResourceSlice": slice_, "ResourceClaim": claim, "Pod": pod, "Namespace": namespace,
            "DeviceClass": device_class}


def leaves(value: JSONValue, path: str = "") -> Iterator[tuple[str, tuple[str | int, ...], JSONValue]]:
    """(dotted path, key tuple, value) of every field and container below the top level."""

    def walk(node: JSONValue, text: str, keys: tuple[str | int, ...]) -> Iterator[tuple[str, tuple[str | int, ...],
                                                                                      JSONValue]]:
        items: list[tuple[str | int, JSONValue]] = (
            list(node.items()) if isinstance(node, dict) else list(enumerate(node)) if isinstance(node, list) else [])
        for key, child in items:
            child_text = f"{text}[{key}]" if isinstance(key, int) else (f"{text}.{key}" if text else key)
            yield child_text, (*keys, key), child
            yield from walk(child, child_text, (*keys, key))

    yield from walk(value, path, ())


def mutated(obj: JSONObject, keys: tuple[str | int, ...], value: JSONValue) -> JSONObject:
    out = copy.deepcopy(obj)
    node: Any = out
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return out


def overlaps(changed: str, reported: str) -> bool:
    """Whether an error at ``reported`` names the changed field, a parent of it or a child of it."""
    return any(a == b or a.startswith(b + ".") or a.startswith(b + "[") for a, b in ((changed, reported),
                                                                                      (reported, changed)))


def translate_after(valid: JSONObject, bad: JSONObject, event_type: str) -> list[Any]:
    """Translate ``valid`` (ADDED), then ``bad`` as ``event_type``; returns the events of the second."""
    state = TranslatorState()
    translate(state, Observation(type="ADDED", object=valid, observed_at=f.at(1), recorded_at=f.at(1), digest="a"))
    if event_type == "ADDED":
        state = TranslatorState()
    return translate(state, Observation(type=event_type, object=bad, observed_at=f.at(5),  # type: ignore[arg-type]
                                        recorded_at=f.at(5), digest="b"))


def cases() -> Iterator[tuple[str, str, JSONValue, JSONObject, JSONObject]]:
    """(kind, changed path, new value, valid object, mutated object) for every field and wrong type."""
    for kind, obj in rich_objects().items():
        for text, keys, original in leaves(obj):
            if text in ("kind", "apiVersion"):
                continue  # covered by the kinds-and-versions corpus
            for value in WRONG:
                if _kind_of(value) != _kind_of(original):
                    yield kind, text, value, obj, mutated(obj, keys, value)


def test_every_field_of_every_kind_is_covered() -> None:
    counted = {kind: sum(1 for c in cases() if c[0] == kind) for kind in rich_objects()}
    assert all(n >= 10 for n in counted.values()), counted
    assert sum(counted.values()) > 1000


@pytest.mark.parametrize("event_type", ["ADDED", "MODIFIED", "DELETED"])
def test_a_wrong_type_anywhere_gives_a_located_error_or_a_translation(event_type: str) -> None:
    unlocated: list[str] = []
    for kind, text, value, valid, bad in cases():
        try:
            translate_after(valid, bad, event_type)
        except InvalidObject as e:
            if not overlaps(text, e.path):
                unlocated.append(f"{kind} {text}={value!r}: reported at {e.path!r}: {e}")
        except UnsupportedObject as e:
            unlocated.append(f"{kind} {text}={value!r}: UnsupportedObject {e}")
        except Exception as e:  # noqa: BLE001  # anything else is the failure this test looks for
            unlocated.append(f"{kind} {text}={value!r}: {type(e).__name__}: {e}")
    assert not unlocated, "\n".join(unlocated[:40]) + f"\n... {len(unlocated)} in all"


def test_a_file_of_every_wrong_type_replays_and_keeps_its_valid_neighbours(ledger: LedgerHandle,
                                                                           tmp_path: Path) -> None:
    sandwich = Sandwich()
    middle: list[str] = []
    expected_rejected = 0
    for n, (_kind, _text, _value, valid, bad) in enumerate(itertools.islice(cases(), 0, None, 3)):
        # Fresh names and uids per line, so the lines do not build on each other.
        fresh = json.loads(json.dumps(bad).replace("rich", f"rich{n}").replace('"pu"', f'"pu{n}"'))
        try:
            translate_after(valid, fresh, "ADDED")
        except InvalidObject:
            expected_rejected += 1
        middle.append(line("ADDED", fresh, 5 + n / 1000))
    path = sandwich.write(tmp_path / "wrong-types.jsonl", middle)

    report = ledger.replay(path)

    assert len(report.rejected) == expected_rejected > 100
    assert all(r.reason.split(": ")[1] for r in report.rejected)  # "ADDED Kind ns/name: path: reason"
    sandwich.assert_kept(ledger)
    assert_api_answers(ledger, at=f.at(30) + timedelta(0))
