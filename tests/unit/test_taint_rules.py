"""DeviceTaintRule through the translator: which events, on which stream, with which payload, dated when."""

from __future__ import annotations

import copy

import pytest

from ledger import events as ev
from ledger.errors import InvalidObject, UnsupportedObject
from ledger.translator import relist
from ledger.types import JSONObject, JSONValue
from tests.factories import Feed, at, dig, taint_rule, types, uid


def _gpu_rule(name: str, **kwargs: object) -> JSONObject:
    selector: JSONObject = {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-3",
                            "selectors": [{"cel": {"expression": 'device.attributes["gpu.example.com"].index == 3'}}]}
    return taint_rule(name, selector=selector, **kwargs)  # type: ignore[arg-type]  # kwargs: effect, key, value


@pytest.mark.parametrize("api_version", ["resource.k8s.io/v1alpha3", "resource.k8s.io/v1beta1",
                                         "resource.k8s.io/v1beta2", "resource.k8s.io/v1"])
def test_a_rule_in_any_served_version_is_defined_on_its_stream_with_kubernetes_field_names(api_version: str) -> None:
    feed, name = Feed(), uid("rule")
    out = feed("ADDED", _gpu_rule(name, value="ecc", api_version=api_version), 5)

    assert types(out) == ["DeviceTaintRuleDefined"]
    assert out[0].stream == f"taintrule:{name}"
    assert out[0].stream_position == 1
    assert out[0].occurred_at == at(0)  # creationTimestamp, not the receive time (minute 5)
    assert ev.to_payload(out[0].event) == {
        "name": name,
        "deviceSelector": {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-3",
                           "selectors": [{"cel": {"expression": 'device.attributes["gpu.example.com"].index == 3'}}]},
        "taint": {"key": "example.com/broken", "value": "ecc", "effect": "NoSchedule",
                  "timeAdded": "2026-11-02T09:00:00Z"},
    }


def test_a_relist_or_repeated_delivery_emits_nothing_and_a_status_change_is_no_change() -> None:
    feed, name = Feed(), uid("rule")
    rule = _gpu_rule(name)
    feed("ADDED", rule, 1)
    assert feed("MODIFIED", copy.deepcopy(rule), 2) == []
    assert feed("ADDED", copy.deepcopy(rule), 3) == []  # a relist shows it again
    with_status = copy.deepcopy(rule)
    with_status["status"] = {"conditions": [{"type": "EvictionInProgress", "status": "False"}]}
    dig(with_status, "metadata")["resourceVersion"] = "777777"
    assert feed("MODIFIED", with_status, 4) == []


def test_a_new_effect_is_a_change_and_a_deletion_then_a_new_rule_of_that_name_continues_the_stream() -> None:
    feed, name = Feed(), uid("rule")
    feed("ADDED", _gpu_rule(name), 1)
    changed = feed("MODIFIED", _gpu_rule(name, effect="NoExecute"), 7)
    assert types(changed) == ["DeviceTaintRuleChanged"]
    event = changed[0].event
    assert isinstance(event, ev.DeviceTaintRuleChanged)
    assert event.taint["effect"] == "NoExecute"
    assert changed[0].occurred_at == at(7)  # no managedFields: the receive time

    deleted = feed("DELETED", _gpu_rule(name, effect="NoExecute"), 9)
    assert types(deleted) == ["DeviceTaintRuleDeleted"]
    assert ev.to_payload(deleted[0].event) == {"name": name}
    assert deleted[0].occurred_at == at(9)
    assert feed("DELETED", _gpu_rule(name), 10) == []  # a repeated deletion

    again = feed("ADDED", taint_rule(name, selector={}), 12)
    assert types(again) == ["DeviceTaintRuleDefined"]
    assert [e.stream_position for e in changed + deleted + again] == [2, 3, 4]
    redefined = again[0].event
    assert isinstance(redefined, ev.DeviceTaintRuleDefined)
    assert redefined.device_selector == {}  # the empty selector (every device), not "no selector"


def test_a_rule_without_a_selector_records_none() -> None:
    feed = Feed()
    out = feed("ADDED", taint_rule(uid("rule"), selector=None), 1)
    event = out[0].event
    assert isinstance(event, ev.DeviceTaintRuleDefined)
    assert event.device_selector is None


@pytest.mark.parametrize(("edit", "path"), [
    (lambda spec: spec.pop("taint"), "spec.taint"),
    (lambda spec: spec["taint"].pop("effect"), "spec.taint.effect"),
    (lambda spec: spec["taint"].update(key=""), "spec.taint.key"),
    (lambda spec: spec["taint"].update(value=3), "spec.taint.value"),
    (lambda spec: spec["taint"].update(timeAdded="yesterday"), "spec.taint.timeAdded"),
    (lambda spec: spec.update(deviceSelector="gpu-3"), "spec.deviceSelector"),
    (lambda spec: spec["deviceSelector"].update(pool=["node-a"]), "spec.deviceSelector.pool"),
    (lambda spec: spec["deviceSelector"].update(selectors={"cel": {}}), "spec.deviceSelector.selectors"),
    (lambda spec: spec["deviceSelector"]["selectors"].append(7), "spec.deviceSelector.selectors[1]"),
    (lambda spec: spec["deviceSelector"]["selectors"][0]["cel"].update(expression=None),
     "spec.deviceSelector.selectors[0].cel.expression"),
])
def test_a_malformed_rule_is_a_located_error_and_leaves_state_untouched(edit: object, path: str) -> None:
    feed = Feed()
    rule = _gpu_rule(uid("rule"))
    assert callable(edit)
    edit(rule["spec"])
    with pytest.raises(InvalidObject) as raised:
        feed("ADDED", rule, 1)
    assert raised.value.path == path
    assert feed.state.entries == {}


def test_v1alpha3_stays_unsupported_for_the_other_dra_kinds() -> None:
    feed = Feed()
    with pytest.raises(UnsupportedObject):
        feed("ADDED", {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceClass", "metadata": {"name": "x"}}, 1)


def test_a_rule_that_vanished_during_a_relist_is_deleted() -> None:
    feed, kept, gone = Feed(), uid("rule"), uid("rule")
    feed("ADDED", _gpu_rule(kept), 1)
    feed("ADDED", _gpu_rule(gone), 1)
    listed = [relist.state_key(taint_rule(kept, selector={}))]
    assert listed == [f"taintrule:{kept}"]
    tombstones = relist.vanished(feed.state, "DeviceTaintRule", [k for k in listed if k])
    assert [dig(t, "metadata")["name"] for t in tombstones] == [gone]
    out = feed("DELETED", tombstones[0], 20)
    assert types(out) == ["DeviceTaintRuleDeleted"]
    payload: JSONValue = ev.to_payload(out[0].event)
    assert payload == {"name": gone}
