"""The bad-input corpus: each case is one small hostile line (or a few) between valid neighbours.

Every case gives a clear, located rejection (``FILE:LINE: reason``, the reason naming the field) or a
correct result; none stops the replay or breaks an API answer, and the valid lines around it are all
kept (:meth:`Sandwich.assert_kept`). Cases are named for what they break.
"""

from __future__ import annotations

import copy
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from ledger import services
from ledger.errors import Invalid
from ledger.quantities import parse_quantity, quantity_value
from ledger.recorded import WatchLine, read_text, watch_line
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests import factories as f
from tests.reliability.world import READ_PATHS, Sandwich, assert_api_answers, client, line

MIDDLE = 4
"""File line of the first line under test (after the three ``Sandwich.before`` lines)."""


@dataclass(frozen=True, slots=True)
class Case:
    """Lines under test; ``rejected`` maps each rejected line's offset in them to a reason fragment."""

    lines: Callable[[Sandwich], list[str]]
    rejected: dict[int, str]
    check: Callable[[LedgerHandle, Sandwich], None] | None = None


def _slice(s: Sandwich, **changes: Any) -> JSONObject:
    obj = f.resource_slice(name=f.uid("slice"), pool=f.uid("other"), devices=[f.gpu("gpu-9")])
    obj.update(changes)
    return obj


def _claim(s: Sandwich, name: str = "odd", *, uid: str | None = None, device: str = "gpu-1",
           allocated_at: float | None = None) -> JSONObject:
    return f.claim(name=name, namespace=s.namespace, claim_uid=uid or f.uid("claim"),
                   results=[device] if allocated_at is not None else None, allocated_at=allocated_at, pool=s.pool)


def _random_letters(n: int) -> str:
    """``n`` lowercase letters drawn at random (seeded: the same each run)."""
    letters = random.Random(n)
    return "".join(letters.choice(string.ascii_lowercase) for _ in range(n))


def _without(obj: JSONObject, *keys: str) -> JSONObject:
    out = copy.deepcopy(obj)
    meta = out["metadata"]
    assert isinstance(meta, dict)
    for key in keys:
        meta.pop(key, None)
    return out


def _streams(ledger: LedgerHandle) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in ledger.events():
        out.setdefault(str(e.stream), []).append(e.type)
    return out


def _claim_held_between(s: Sandwich, uid: str, start: float, end: float) -> Callable[[LedgerHandle, Sandwich], None]:
    def check(ledger: LedgerHandle, _: Sandwich) -> None:
        assert "ClaimAllocated" in _streams(ledger)[f"claim:{uid}"]
    return check


def _unicode_claim(s: Sandwich) -> JSONObject:
    obj = _claim(s, name="ünï-cødé-\u202e-名前-🚀", device="gpu-1", allocated_at=None)
    return obj


def _attr_slice(pool: str, models: dict[str, str]) -> JSONObject:
    return f.resource_slice(name=f.uid("slice"), pool=pool,
                            devices=[f.gpu(name, model=model) for name, model in models.items()])


def _check_models(pool: str, expected: dict[str, str]) -> Callable[[LedgerHandle, Sandwich], None]:
    def check(ledger: LedgerHandle, _: Sandwich) -> None:
        body: Any = ledger.occupancy(at=f.at(30), pool=pool)
        assert {d["device"]: d["model"] for d in body["devices"]} == expected
    return check


QUANTITIES = ["80Gi", "85899345920", "80e9", "8.5E10", "500m", "1.5Ti", "+1k", "0.5Ei", "100n", "1u", "2k", "3M",
              "4G", "5T", "6P", "7E", "1Ki", "1Mi", "1Pi", ".5", "5.", "1e-3"]
"""Every Kubernetes quantity notation: plain, decimal SI suffixes n..E, binary Ki..Ei, exponents, signs."""
BAD_QUANTITIES: list[Any] = ["80 GB", "", "Gi", "1e3Gi", "NaN", "Infinity", "1e9999999", "0x10", "1_000", "1Gb",
                             "80Gi ", -1, 12.5, True, None, [], {"value": []}, {"value": {"x": 1}}]


def _quantity_slice(pool: str, values: list[Any]) -> JSONObject:
    devices: list[Any] = []
    for i, value in enumerate(values):
        dev = f.gpu(f"q-{i}", multi=True)
        dev["capacity"] = {"memory": {"value": value}, "plain": value}
        devices.append(dev)
    return f.resource_slice(name=f.uid("slice"), pool=pool, devices=devices)


def _quantity_claim(s: Sandwich, pool: str, value: Any) -> JSONObject:
    obj = f.claim(name=f.uid("qclaim"), namespace=s.namespace, claim_uid=f.uid("claim"), results=["q-0"],
                  allocated_at=5, pool=pool)
    results = cast(Any, obj)["status"]["allocation"]["devices"]["results"]
    results[0]["consumedCapacity"] = {"memory": value}
    results[0]["shareID"] = f.uid("share")
    cast(Any, obj)["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {"memory": value}}
    return obj


def _ten_thousand(pool: str) -> JSONObject:
    return f.resource_slice(name=f.uid("slice"), pool=pool,
                            devices=[{"name": f"dev-{i:05d}", "attributes": {"index": {"int": i}}}
                                     for i in range(10_000)])


def _check_pool_size(pool: str, size: int) -> Callable[[LedgerHandle, Sandwich], None]:
    def check(ledger: LedgerHandle, _: Sandwich) -> None:
        body: Any = ledger.occupancy(at=f.at(30), pool=pool)
        assert body["totals"]["devices"] == size
    return check


def _has_stream(ledger: LedgerHandle, stream: str) -> None:
    assert stream in _streams(ledger), sorted(_streams(ledger))


def _check_pool_size_of(prefix: str, size: int = 10_000) -> Callable[[LedgerHandle, Sandwich], None]:
    return lambda ledger, s: _check_pool_size(prefix + s.pool, size)(ledger, s)


def _same_uid_streams(ledger: LedgerHandle, s: Sandwich) -> None:
    streams = _streams(ledger)
    assert streams[f"claim:{s.first_uid}"] == ["ClaimCreated", "ClaimAllocated"]
    assert streams[f"pod:{s.first_uid}"] == ["PodPhaseChanged"]
    assert streams[f"class:{s.first_uid}"] == ["DeviceClassDefined"]


def _first_still_held(ledger: LedgerHandle, s: Sandwich) -> None:
    # The API server never reuses a uid: a second claim under it is rejected, so it can neither release
    # the first claim's device nor open a second stream that could double-bill.
    assert _streams(ledger)[f"claim:{s.first_uid}"] == ["ClaimCreated", "ClaimAllocated"]


def _nothing_from(ledger: LedgerHandle, uid: str) -> None:
    """No event came from the object with ``uid`` (a DELETED of a slice never seen withdraws nothing)."""
    assert not [e for e in ledger.events() if e.source.get("uid") == uid]


def _ghost(ledger: LedgerHandle, stream: str) -> None:
    assert _streams(ledger)[stream] == ["ClaimCreated", "ClaimAllocated", "ClaimDeallocated", "ClaimDeleted"]


def _out_of_order(s: Sandwich) -> list[str]:
    uid = "late-" + s.first_uid
    newer = _claim(s, name="late", uid=uid, device="gpu-1", allocated_at=None)
    older = copy.deepcopy(newer)
    cast(Any, newer)["metadata"]["resourceVersion"] = "900"
    cast(Any, older)["metadata"]["resourceVersion"] = "100"
    newer["status"] = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-" + uid}]}
    return [line("MODIFIED", newer, 5), line("MODIFIED", older, 6), line("MODIFIED", newer, 7)]


def _order_kept(ledger: LedgerHandle, s: Sandwich) -> None:
    # resourceVersion is opaque (compared only for equality): the file order is the order of changes,
    # so the stale line unreserves and the repeated newer line reserves again; nothing is dropped or doubled.
    assert _streams(ledger)[f"claim:late-{s.first_uid}"] == [
        "ClaimCreated", "ClaimReserved", "ClaimUnreserved", "ClaimReserved"]


def _big(obj: JSONObject) -> JSONObject:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    meta["annotations"] = {"example.com/blob": "x" * 1_500_000}
    return obj


def _unicode_kept(ledger: LedgerHandle, s: Sandwich) -> None:
    body: Any = ledger.claims(at=f.at(30))
    assert "ünï-cødé-\u202e-名前-🚀" in {c["name"] for c in body["claims"]}


CORPUS: dict[str, Case] = {
    # --- the line itself ---------------------------------------------------------------------------
    "truncated_json_line": Case(lambda s: [line("ADDED", _claim(s), 5)[:57]], {0: "invalid JSON"}),
    "truncated_after_the_object": Case(lambda s: [line("ADDED", _claim(s), 5)[:-1]], {0: "invalid JSON"}),
    "binary_garbage": Case(lambda s: ["\x00\x01\x02\x7f garbage"], {0: "invalid JSON"}),
    "json_array_not_object": Case(lambda s: ["[1, 2, 3]"], {0: "not a JSON object (found array)"}),
    "json_string_not_object": Case(lambda s: ['"ADDED"'], {0: "not a JSON object (found string)"}),
    "missing_type": Case(lambda s: [json.dumps({"observedAt": f.stamp(5), "object": _claim(s)})],
                         {0: "missing field 'type'"}),
    "unknown_watch_type": Case(lambda s: [json.dumps({"observedAt": f.stamp(5), "type": "UPDATED",
                                                      "object": _claim(s)})], {0: "type: 'UPDATED' is not"}),
    "watch_error_event": Case(lambda s: [json.dumps({"observedAt": f.stamp(5), "type": "ERROR", "object": {
        "kind": "Status", "code": 410, "message": "too old resource version"}})], {0: "ERROR events"}),
    "object_is_a_string": Case(lambda s: [line("ADDED", "a claim", 5)], {0: "object: not a JSON object"}),
    "object_missing": Case(lambda s: [json.dumps({"observedAt": f.stamp(5), "type": "ADDED"})],
                           {0: "missing field 'object'"}),
    "nan_in_an_object": Case(lambda s: [line("ADDED", _claim(s), 5).replace('"count": 1', '"count": NaN')],
                             {0: "NaN or Infinity"}),
    "infinity_in_an_object": Case(lambda s: [line("ADDED", _claim(s), 5).replace('"count": 1', '"count": -Infinity')],
                                  {0: "NaN or Infinity"}),
    "number_past_the_float_range": Case(lambda s: [line("ADDED", _claim(s), 5).replace('"count": 1', '"count": 1e309')],
                                        {0: "a number past ±1.8e308 reads as Infinity"}),
    "lone_surrogate_in_a_name": Case(lambda s: [line("ADDED", _claim(s, name="x\ud800y"), 5)],
                                     {0: "lone UTF-16 surrogate"}),
    "nul_in_a_name": Case(lambda s: [line("ADDED", _claim(s, name="x\x00y"), 5)], {0: "NUL character"}),
    "integer_of_5000_digits": Case(
        lambda s: [line("ADDED", _claim(s), 5).replace('"count": 1', '"count": ' + "9" * 5000)],
                                   {0: "invalid JSON"}),
    "nested_100000_deep": Case(lambda s: ['{"type": "ADDED", "observedAt": "2026-11-02T09:05:00Z", "object": '
                                          + "[" * 100_000 + "]" * 100_000 + "}"], {0: "invalid JSON"}),
    "nested_900_deep_inside_an_annotation": Case(
        lambda s: [line("ADDED", _claim(s), 5).replace('"name": "odd"', '"name": "odd", "annotations": {"a": '
                                                        + "[" * 900 + "]" * 900 + "}", 1)],
        {0: "object: nested too deeply"}),
    # --- times -------------------------------------------------------------------------------------
    "observed_at_without_zone": Case(lambda s: [line("ADDED", _claim(s), 5).replace('Z"', '"', 1)],
                                     {0: "observedAt: not an RFC 3339 time with a zone"}),
    "observed_at_not_a_time": Case(lambda s: [json.dumps({"observedAt": 1700000000, "type": "ADDED",
                                                          "object": _claim(s)})], {0: "observedAt:"}),
    "observed_at_year_10000": Case(lambda s: [json.dumps({"observedAt": "10000-01-01T00:00:00Z", "type": "ADDED",
                                                          "object": _claim(s)})], {0: "observedAt:"}),
    "creation_timestamp_without_zone": Case(
        lambda s: [line("ADDED", {**_claim(s), "metadata": {**_claim(s)["metadata"],  # type: ignore[dict-item]
                                                            "creationTimestamp": "2026-11-02T09:00:00"}}, 5)],
        {0: "metadata.creationTimestamp: time has no zone"}),
    "allocation_timestamp_garbage": Case(
        lambda s: [line("ADDED", json.loads(json.dumps(_claim(s, allocated_at=10)).replace(
            f'"{f.stamp(10)}"', '"yesterday"')), 5)],
        {0: "status.allocation.allocationTimestamp: not an RFC 3339 time"}),
    # Past the latest time a query takes (9998-12-31T23:59:59.999999Z): nothing the line records could be asked about.
    "times_in_the_far_future": Case(
        lambda s: [json.dumps({"observedAt": "9999-12-31T23:59:59.999999Z", "type": "ADDED",
                               "object": f.namespace(f.uid("ns"), "future")})],
        {0: "observedAt: '9999-12-31T23:59:59.999999Z' is too far in the future: no query can ask about it"}),
    "times_in_the_last_hour_a_query_takes": Case(
        lambda s: [json.dumps({"observedAt": "9998-12-31T23:59:59.999999Z", "type": "ADDED",
                               "object": f.namespace(f.uid("ns"), "future")})], {}),
    # --- kinds and versions -------------------------------------------------------------------------
    "unknown_kind_a_crd": Case(lambda s: [line("ADDED", {"apiVersion": "nvidia.com/v1beta1", "kind": "ComputeDomain",
                                                         "metadata": {"name": "cd", "uid": f.uid()}}, 5)],
                               {0: "kind ComputeDomain (apiVersion nvidia.com/v1beta1) is not tracked"}),
    "claim_in_v1alpha3": Case(lambda s: [line("ADDED", {**_claim(s), "apiVersion": "resource.k8s.io/v1alpha3"}, 5)],
                              {0: "ResourceClaim in apiVersion resource.k8s.io/v1alpha3 is not supported"}),
    "slice_in_v1alpha3": Case(lambda s: [line("ADDED", {**_slice(s), "apiVersion": "resource.k8s.io/v1alpha3"}, 5)],
                              {0: "ResourceSlice in apiVersion resource.k8s.io/v1alpha3 is not supported"}),
    "kind_missing": Case(lambda s: [line("ADDED", {k: v for k, v in _claim(s).items() if k != "kind"}, 5)],
                         {0: "kind: must be a string"}),
    "api_version_a_number": Case(lambda s: [line("ADDED", {**_claim(s), "apiVersion": 1}, 5)],
                                 {0: "apiVersion: must be a string"}),
    "metadata_a_list": Case(lambda s: [line("ADDED", {**_claim(s), "metadata": []}, 5)],
                            {0: "metadata: must be a mapping"}),
    "bookmark_with_no_object_fields": Case(lambda s: [line("BOOKMARK", {"kind": "ResourceClaim",
                                                                        "metadata": {"resourceVersion": "9"}}, 5)], {}),
    # --- identity --------------------------------------------------------------------------------------
    "claim_without_uid": Case(lambda s: [line("ADDED", _without(_claim(s, name="no-uid"), "uid"), 5)], {},
                              lambda ledger, s: _has_stream(ledger, f"claim:name:{s.namespace}/no-uid")),
    "claim_without_uid_or_name": Case(lambda s: [line("ADDED", _without(_claim(s), "uid", "name"), 5)],
                                      {0: "metadata.name: required string is missing or empty"}),
    "claim_without_resource_version": Case(
        lambda s: [line("ADDED", _without(_claim(s, uid="no-rv-" + s.first_uid), "resourceVersion"), 5)], {},
        lambda ledger, s: _has_stream(ledger, f"claim:no-rv-{s.first_uid}")),
    "slice_without_uid_or_resource_version": Case(
        lambda s: [line("ADDED", _without(_slice(s), "uid", "resourceVersion"), 5)], {}),
    "pod_without_uid": Case(lambda s: [line("ADDED", _without(f.pod(name="nouid", pod_uid="x", namespace=s.namespace),
                                                              "uid"), 5)], {},
                            lambda ledger, s: _has_stream(ledger, f"pod:name:{s.namespace}/nouid")),
    "duplicate_uids_across_kinds": Case(
        lambda s: [line("ADDED", f.pod(name="twin", pod_uid=s.first_uid, namespace=s.namespace, claim_name="first"), 5),
                   line("ADDED", f.resource_slice(name="twin", pool=f.uid("twin"), devices=[f.gpu("t")],
                                                  slice_uid=s.first_uid), 6),
                   line("ADDED", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                  "metadata": {"name": s.first_uid, "uid": s.first_uid}, "spec": {}}, 7)], {},
        lambda ledger, s: _same_uid_streams(ledger, s)),
    "duplicate_uid_reused_by_another_claim": Case(
        lambda s: [line("ADDED", _claim(s, name="impostor", uid=s.first_uid, device="gpu-1", allocated_at=None), 5)],
        {0: "metadata.uid: claim-"}, lambda ledger, s: _first_still_held(ledger, s)),
    # --- DELETED of an object never seen, and order ----------------------------------------------------
    "deleted_claim_never_seen": Case(
        lambda s: [line("DELETED", _claim(s, uid="ghost-" + s.first_uid, device="gpu-9", allocated_at=4), 5)], {},
                                     lambda ledger, s: _ghost(ledger, f"claim:ghost-{s.first_uid}")),
    "deleted_slice_never_seen": Case(lambda s: [line("DELETED", _slice(s, metadata={"name": "ghost", "uid": "ghost"}),
                                                     5)], {}, lambda ledger, s: _nothing_from(ledger, "ghost")),
    "deleted_pod_namespace_class_never_seen": Case(
        lambda s: [line("DELETED", f.pod(name="p", pod_uid=f.uid("pod"), namespace=s.namespace), 5),
                   line("DELETED", f.namespace(f.uid("ns"), "gone"), 5),
                   line("DELETED", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                    "metadata": {"name": f.uid("class")}, "spec": {}}, 5)], {}),
    "events_out_of_resource_version_order": Case(lambda s: _out_of_order(s), {},
                                                 lambda ledger, s: _order_kept(ledger, s)),
    # --- size -----------------------------------------------------------------------------------------------
    "object_of_one_and_a_half_megabytes": Case(
        lambda s: [line("ADDED", _big(_claim(s, uid="big-" + s.first_uid, allocated_at=None)), 5)], {},
        lambda ledger, s: _has_stream(ledger, f"claim:big-{s.first_uid}")),
    "slice_with_10000_devices": Case(lambda s: [line("ADDED", _ten_thousand("big-" + s.pool), 5)], {},
                                     _check_pool_size_of("big-")),
    # --- names and values --------------------------------------------------------------------------------
    # Random letters do not compress: a key this long made the whole batch fail in a b-tree index (PostgreSQL's
    # row limit is about 2,700 bytes), so the lines around it were never recorded.
    "namespace_name_of_12000_random_letters": Case(
        lambda s: [line("ADDED", f.namespace(_random_letters(12_000), "t"), 5)],
        {0: "metadata.name: 12000 bytes long; a Kubernetes name or key is at most 317"}),
    "device_name_of_318_letters": Case(
        lambda s: [line("ADDED", _slice(s, spec={**cast(dict[str, Any], _slice(s)["spec"]),
                                                 "devices": [f.gpu("d" * 318)]}), 5)],
        {0: "spec.devices[0].name: 318 bytes long"}),
    "allocated_pool_of_318_letters_in_two_byte_characters": Case(
        lambda s: [line("ADDED", json.loads(json.dumps(_claim(s, allocated_at=4)).replace(
            f'"pool": "{s.pool}"', '"pool": "' + "é" * 159 + '"')), 5)],
        {0: "pool: 318 bytes long"}),
    "names_of_253_and_keys_of_317_characters": Case(
        lambda s: [line("ADDED", _claim(s, name="n" * 253, uid="u" * 317), 5)], {},
        lambda ledger, s: _has_stream(ledger, "claim:" + "u" * 317)),
    "unicode_and_control_characters_in_names": Case(lambda s: [line("ADDED", _unicode_claim(s), 5)], {},
                                                    lambda ledger, s: _unicode_kept(ledger, s)),
    "unicode_and_control_characters_in_attribute_values": Case(
        lambda s: [line("ADDED", _attr_slice("attr-" + s.pool, {"u-0": "Ünïcødé 名前 🚀", "u-1": "tab\tbell\x07esc\x1b",
                                                                 "u-2": "\u202eevil", "u-3": "line\nbreak"}), 5)], {},
        lambda ledger, s: _check_models("attr-" + s.pool, {"u-0": "Ünïcødé 名前 🚀", "u-1": "tab\tbell\x07esc\x1b",
                                                           "u-2": "\u202eevil", "u-3": "line\nbreak"})(ledger, s)),
    "attribute_values_with_trailing_spaces": Case(
        lambda s: [line("ADDED", _attr_slice("sp-" + s.pool, {"a": "A100", "b": "A100 ", "c": " A100", "d": "A100\t"}),
                        5)], {},
        lambda ledger, s: _check_models("sp-" + s.pool, {"a": "A100", "b": "A100 ", "c": " A100", "d": "A100\t"})(
            ledger, s)),
    "quantities_in_every_notation": Case(
        lambda s: [line("ADDED", _quantity_slice("q-" + s.pool, QUANTITIES), 5),
                   *[line("ADDED", _quantity_claim(s, "q-" + s.pool, q), 6) for q in QUANTITIES[:4]]], {},
        _check_pool_size_of("q-", len(QUANTITIES))),
    "invalid_quantities": Case(
        lambda s: [line("ADDED", _quantity_slice("q-" + s.pool, BAD_QUANTITIES), 5),
                   *[line("ADDED", _quantity_claim(s, "q-" + s.pool, q), 6) for q in BAD_QUANTITIES]], {},
        _check_pool_size_of("q-", len(BAD_QUANTITIES))),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_bad_line_is_rejected_with_its_location_or_recorded_correctly_and_its_neighbours_are_kept(
        ledger: LedgerHandle, tmp_path: Path, name: str) -> None:
    case = CORPUS[name]
    sandwich = Sandwich()
    middle = case.lines(sandwich)
    path = sandwich.write(tmp_path / f"{name}.jsonl", middle)

    report = ledger.replay(path)

    rejected = {r.origin: r.reason for r in report.rejected}
    expected = {f"{path}:{MIDDLE + offset}": fragment for offset, fragment in case.rejected.items()}
    assert set(rejected) == set(expected), rejected
    for origin, fragment in expected.items():
        assert fragment in rejected[origin], (origin, rejected[origin])
    assert report.lines == len(sandwich.before) + len(middle) + len(sandwich.after)
    sandwich.assert_kept(ledger)
    if case.check is not None:
        case.check(ledger, sandwich)
    assert_api_answers(ledger)
    # Replaying the same file again adds nothing, bad lines included, and reports the same bad lines again.
    again = ledger.replay(path)
    assert (again.recorded, again.events) == (0, 0)
    assert {r.origin: r.reason for r in again.rejected} == {
        origin: f"{reason} (already recorded as rejected)" for origin, reason in rejected.items()}


def test_a_file_cut_in_the_middle_of_its_last_line_keeps_every_line_before_it(ledger: LedgerHandle,
                                                                               tmp_path: Path) -> None:
    sandwich = Sandwich()
    path = tmp_path / "cut.jsonl"
    text = "\n".join([*sandwich.before, *sandwich.after])
    path.write_text(text + "\n" + line("ADDED", f.namespace(f.uid("ns"), "t"), 40)[:33])  # no final newline

    report = ledger.replay(path)

    assert [(r.origin, r.reason.split(":")[0]) for r in report.rejected] == [(f"{path}:5", "invalid JSON")]
    sandwich.assert_kept(ledger)


def test_a_kubectl_yaml_list_with_bad_items_keeps_the_good_items(ledger: LedgerHandle, tmp_path: Path) -> None:
    sandwich = Sandwich()
    path = tmp_path / "list.yaml"
    good = f.claim(name="listed", namespace=sandwich.namespace, claim_uid=f.uid("claim"))
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        good, 7, {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "ResourceClaim", "metadata": {"name": "a"}},
        {"kind": 5}]}))

    report = ledger.replay(path, at=f.at(1))

    reasons = sorted(r.reason for r in report.rejected)
    assert len(reasons) == 3
    assert any("items[1]: not an object" in r for r in reasons)
    assert any("items[3]: kind: not a string" in r for r in reasons)
    assert any("v1alpha3 is not supported" in r for r in reasons)
    assert ledger.claims(at=f.at(30))["claims"]


def test_the_watch_path_takes_every_corpus_object_without_stopping(ledger: LedgerHandle) -> None:
    """A live watch hands decoded objects to ``record_watch_batch``: the same corpus, one burst, no crash."""
    sandwich = Sandwich()
    texts = [*sandwich.before]
    for name in sorted(CORPUS):
        if name != "slice_with_10000_devices":  # covered by replay; too slow for a second time here
            texts.extend(CORPUS[name].lines(sandwich))
    texts.extend(sandwich.after)
    lines = [item for item in read_text("\n".join(texts), source="corpus") if isinstance(item, WatchLine)]
    live = [watch_line(source="watch:mixed", line=n, event_type=item.type, observed_at=item.observed_at or f.at(5),
                       obj=item.object) for n, item in enumerate(lines, 1)]
    state = services.load_state(ledger.db, "default")
    checkpoint = services.WatchCheckpoint(kind="ResourceClaim", api_version="resource.k8s.io/v1",
                                          resource_version="1")

    report = services.record_watch_batch(ledger.db, live, cluster="default", state=state, checkpoint=checkpoint)

    assert report.rejected and report.recorded
    sandwich.assert_kept(ledger)
    assert_api_answers(ledger)


@pytest.mark.parametrize("text", QUANTITIES)
def test_every_kubernetes_quantity_notation_parses_to_its_exact_value(text: str) -> None:
    expected = {"80Gi": 80 * 2**30, "85899345920": 85899345920, "80e9": 80 * 10**9, "8.5E10": 85 * 10**9,
                "500m": Decimal("0.5"), "1.5Ti": 3 * 2**39, "+1k": 1000, "0.5Ei": 2**59, "100n": Decimal("1e-7"),
                "1u": Decimal("1e-6"), "2k": 2000, "3M": 3 * 10**6, "4G": 4 * 10**9, "5T": 5 * 10**12,
                "6P": 6 * 10**15, "7E": 7 * 10**18, "1Ki": 1024, "1Mi": 2**20, "1Pi": 2**50, ".5": Decimal("0.5"),
                "5.": 5, "1e-3": Decimal("0.001")}
    assert parse_quantity(text) == expected[text]


@pytest.mark.parametrize("value", [q for q in BAD_QUANTITIES if isinstance(q, str) and q.strip() == q])
def test_an_invalid_quantity_is_invalid_never_another_error(value: str) -> None:
    with pytest.raises(Invalid, match="not a quantity"):
        parse_quantity(value)
    assert quantity_value(value) is None


@pytest.mark.parametrize(("at", "status"), [("2026-11-02T09:30:00", 422), ("2026-11-02", 422), ("yesterday", 422),
                                            ("9999-12-31T23:59:59Z", 422), ("10000-01-01T00:00:00Z", 422),
                                            ("8999-01-01T00:00:00Z", 200), ("0001-01-01T00:00:00Z", 200),
                                            ("2026-11-02T10:30:00+01:00", 200)])
def test_api_times_without_a_zone_or_beyond_the_calendar_are_422(ledger: LedgerHandle, tmp_path: Path, at: str,
                                                                 status: int) -> None:
    ledger.replay(Sandwich().write(tmp_path / "h.jsonl", []))
    with client(ledger) as api:
        for path in READ_PATHS:
            response = api.get(path, params={"at": at})
            assert response.status_code == status, (path, response.text)
            if status == 422:
                assert response.headers["content-type"] == "application/problem+json"
        usage = api.get("/v1/usage", params={"from": at, "to": "9000-01-01T00:00:00Z"})
        assert usage.status_code == status, usage.text
