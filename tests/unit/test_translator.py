"""The translator on hand-made transitions: which events, in which order, dated when."""

from __future__ import annotations

import copy
import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger import events as ev
from ledger.errors import InvalidObject, UnsupportedObject
from ledger.recorded import WatchLine, read_history
from ledger.simulate import FleetSpec, write_history
from ledger.translator.translate import Observation, TranslatorState, translate
from ledger.types import JSONValue
from tests.factories import Feed, at, claim, dig, gpu, namespace, pod, resource_slice, stamp, types, uid

SEED_LAB = Path(__file__).parents[2] / "ledger" / "data" / "seed-lab.jsonl"


def test_allocation_is_dated_by_allocation_timestamp_and_release_by_observation() -> None:
    feed, cid = Feed(), uid("claim")
    assert types(feed("ADDED", claim(name="c", claim_uid=cid), 1)) == ["ClaimCreated"]
    allocated = feed("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=2.5), 3)
    assert types(allocated) == ["ClaimAllocated"]
    assert allocated[0].occurred_at == at(2.5)
    event = allocated[0].event
    assert isinstance(event, ev.ClaimAllocated)
    assert event.results == [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0",
                              "adminAccess": False, "shareID": None, "consumedCapacity": {},
                              "deviceClassName": "gpu.example.com"}]
    released = feed("MODIFIED", claim(name="c", claim_uid=cid), 40)
    assert types(released) == ["ClaimDeallocated"]
    assert released[0].occurred_at == at(40)
    assert [e.stream_position for e in allocated + released] == [2, 3]


def test_an_older_version_showing_a_released_allocation_again_changes_nothing() -> None:
    # A recording replayed again with other receive times, or recordings that overlap: the claim's allocated
    # versions come back after its release. Translated, they allocated gpu-0 again from the release on (the stamp is
    # kept after the release) and billed the gap until the next release.
    feed, cid = Feed(), uid("claim")
    created = claim(name="c", claim_uid=cid)
    allocated = claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=1)
    reserved = claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=1, reserved=[("p", "pod-1")])
    released = claim(name="c", claim_uid=cid)
    assert types(feed("ADDED", created, 0)) == ["ClaimCreated"]
    assert [types(feed("MODIFIED", o, m)) for o, m in [(allocated, 1), (reserved, 2), (released, 60)]] == [
        ["ClaimAllocated"], ["ClaimReserved"], ["ClaimUnreserved", "ClaimDeallocated"]]

    again = [feed("MODIFIED", o, m) for o, m in [(allocated, 120), (reserved, 121), (released, 122), (created, 123)]]
    reallocated = feed("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=170), 171)

    assert again == [[], [], [], []]
    assert types(reallocated) == ["ClaimAllocated"] and reallocated[0].occurred_at == at(170)
    # Released again, the new allocation's own older versions are skipped the same way.
    feed("MODIFIED", claim(name="c", claim_uid=cid), 200)
    assert feed("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=170), 230) == []


@pytest.mark.parametrize(("created", "stamped", "observed", "expected"), [
    (0, -600, 3, 0),     # a stamp ten hours before the claim existed: from creationTimestamp
    (0, 2.5, 3, 2.5),    # a stamp between creation and the observation: as stamped
    (0, 0, 3, 0),        # the stamp at creation exactly
    (0, 90, 3, 3),       # a stamp ahead of the observation (a fast clock): when first seen allocated
    (10, 20, 3, 10),     # a replay --at before the object: the object's own times, never before creation
])
def test_allocation_time_is_the_stamp_kept_between_creation_and_first_sight(
        created: float, stamped: float, observed: float, expected: float) -> None:
    feed, cid = Feed(), uid("claim")
    events = feed("ADDED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=stamped,
                                 created_at=created), observed)
    assert types(events) == ["ClaimCreated", "ClaimAllocated"]
    assert events[1].occurred_at == at(expected)
    event = events[1].event
    assert isinstance(event, ev.ClaimAllocated)
    assert event.allocation_timestamp == stamp(stamped)  # the payload keeps the stamp as sent


def test_a_claim_allocated_again_starts_no_earlier_than_its_previous_release_was_seen() -> None:
    # Released (seen at 30), allocated again with a stamp of 20: dated 20, the claim was listed twice on gpu-0
    # between 20 and 30, and the device counted as shared.
    feed, cid = Feed(), uid("claim")
    first = feed("ADDED", claim(name="r", claim_uid=cid, results=["gpu-0"], allocated_at=5), 6)
    released = feed("MODIFIED", claim(name="r", claim_uid=cid), 30)
    again = feed("MODIFIED", claim(name="r", claim_uid=cid, results=["gpu-0"], allocated_at=20), 40)
    later = feed("MODIFIED", claim(name="r", claim_uid=cid), 50)
    once_more = feed("MODIFIED", claim(name="r", claim_uid=cid, results=["gpu-0"], allocated_at=55), 60)

    assert [(types(x), [e.occurred_at for e in x]) for x in (first, released, again, later, once_more)] == [
        (["ClaimCreated", "ClaimAllocated"], [at(0), at(5)]), (["ClaimDeallocated"], [at(30)]),
        (["ClaimAllocated"], [at(30)]), (["ClaimDeallocated"], [at(50)]),
        (["ClaimAllocated"], [at(55)])]  # a stamp after the last release is kept as stamped


def test_a_second_pod_reserving_the_claim_adds_one_reservation() -> None:
    feed, cid = Feed(), uid("claim")
    pod_a, pod_b = ("a", uid("pod")), ("b", uid("pod"))
    feed("ADDED", claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=1, reserved=[pod_a]), 1)
    second = feed("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=1,
                                    reserved=[pod_a, pod_b]), 2)
    assert types(second) == ["ClaimReserved"]
    reserved = second[0].event
    assert isinstance(reserved, ev.ClaimReserved)
    assert reserved.consumer == {"resource": "pods", "name": "b", "uid": pod_b[1], "apiGroup": None}


def test_a_repeated_delivery_or_relist_emits_nothing() -> None:
    feed, cid = Feed(), uid("claim")
    obj = claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=1)
    assert types(feed("ADDED", obj, 1)) == ["ClaimCreated", "ClaimAllocated"]
    assert feed("MODIFIED", copy.deepcopy(obj), 2) == []
    assert feed("ADDED", copy.deepcopy(obj), 3) == []  # relist shows it again with the same resourceVersion


def test_a_modified_that_changes_nothing_tracked_emits_nothing() -> None:
    feed, cid = Feed(), uid("claim")
    obj = claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=1)
    feed("ADDED", obj, 1)
    relabelled = copy.deepcopy(obj)
    dig(relabelled, "metadata")["resourceVersion"] = "999999"
    dig(relabelled, "metadata")["labels"] = {"x": "y"}
    assert feed("MODIFIED", relabelled, 2) == []


def test_deletion_timestamp_is_not_a_release_but_deletion_while_allocated_is() -> None:
    feed, cid, p = Feed(), uid("claim"), ("a", uid("pod"))
    feed("ADDED", claim(name="c", claim_uid=cid, results=["gpu-2"], allocated_at=1, reserved=[p]), 1)
    stuck = feed("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-2"], allocated_at=1, reserved=[p],
                                   deletion=10), 11)
    assert types(stuck) == ["ClaimDeletionRequested"]
    assert stuck[0].occurred_at == at(10)
    gone = feed("DELETED", claim(name="c", claim_uid=cid, results=["gpu-2"], allocated_at=1, reserved=[p],
                                 deletion=10), 200)
    assert types(gone) == ["ClaimUnreserved", "ClaimDeallocated", "ClaimDeleted"]
    assert {e.occurred_at for e in gone[1:]} == {at(200)}


def test_a_deleted_for_a_claim_never_seen_records_its_life_and_release() -> None:
    feed, cid = Feed(), uid("claim")
    got = feed("DELETED", claim(name="c", claim_uid=cid, results=["gpu-3"], allocated_at=5), 30)
    assert types(got) == ["ClaimCreated", "ClaimAllocated", "ClaimDeallocated", "ClaimDeleted"]
    assert got[1].occurred_at == at(5) and got[2].occurred_at == at(30)


def test_slice_publishes_devices_and_a_pool_generation_bump_replaces_them() -> None:
    feed = Feed()
    first = feed("ADDED", resource_slice(name="s-1", generation=1, devices=[gpu("gpu-0"), gpu("gpu-1")]), 0)
    assert types(first) == ["PoolGenerationObserved", "DevicePublished", "DevicePublished"]
    # The driver restarts and publishes generation 2 in a new slice with only gpu-1 and gpu-2.
    bumped = feed("ADDED", resource_slice(name="s-2", generation=2, devices=[gpu("gpu-1"), gpu("gpu-2")]), 5)
    assert types(bumped) == ["PoolGenerationObserved", "DeviceWithdrawn", "DeviceUpdated", "DevicePublished"]
    withdrawn = bumped[1].event
    assert isinstance(withdrawn, ev.DeviceWithdrawn) and withdrawn.device == "gpu-0"
    assert bumped[1].stream == "device:gpu.example.com/node-a/gpu-0"
    updated = bumped[2].event  # same device, now published by another slice
    assert isinstance(updated, ev.DeviceUpdated) and updated.slice_name == "s-2"


def test_the_highest_generation_among_existing_slices_counts_after_a_restart_from_one() -> None:
    feed = Feed()
    old = resource_slice(name="old", generation=7, devices=[gpu("gpu-0")])
    feed("ADDED", old, 0)
    new = resource_slice(name="new", generation=1, devices=[gpu("gpu-9")])
    assert types(feed("ADDED", new, 1)) == []  # generation 1 < 7: does not count yet
    switched = feed("DELETED", old, 2)
    assert types(switched) == ["PoolGenerationObserved", "DeviceWithdrawn", "DevicePublished"]


def test_a_device_removed_from_a_slice_is_withdrawn_and_nothing_else_changes() -> None:
    feed, sid = Feed(), uid("slice")
    feed("ADDED", resource_slice(name="s", slice_uid=sid, devices=[gpu("gpu-0"), gpu("gpu-1")]), 0)
    shrunk = feed("MODIFIED", resource_slice(name="s", slice_uid=sid, devices=[gpu("gpu-0")]), 3)
    assert types(shrunk) == ["DeviceWithdrawn"]
    assert shrunk[0].occurred_at == at(3)


def test_identity_is_driver_pool_device_not_slice_name() -> None:
    feed = Feed()
    feed("ADDED", resource_slice(name="a", pool="node-a", devices=[gpu("gpu-0")]), 0)
    other = feed("ADDED", resource_slice(name="b", pool="node-b", node="node-b", devices=[gpu("gpu-0")]), 0)
    assert [e.stream for e in other] == ["pool:gpu.example.com/node-b", "device:gpu.example.com/node-b/gpu-0"]


def test_team_comes_from_the_label_else_the_namespace_name_and_relabels_are_dated() -> None:
    feed = Feed()
    labelled = feed("ADDED", namespace("ml", "vision"), 0)
    plain = feed("ADDED", namespace("scratch", None), 0)
    assert [(e.event.team, e.event.label) for e in labelled + plain  # type: ignore[attr-defined]
            ] == [("vision", "team"), ("scratch", None)]
    relabel = namespace("ml", "nlp")
    assert types(feed("MODIFIED", relabel, 42)) == ["TeamAssigned"]


def test_pod_links_come_from_spec_and_status_and_deletion_is_recorded() -> None:
    feed, pid = Feed(), uid("pod")
    obj = pod(name="p", pod_uid=pid, phase="Pending", claim_name="manual-claim")
    obj["status"] = {"phase": "Pending", "extendedResourceClaimStatus": {"resourceClaimName": "p-ext-1"},
                     "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    first = feed("ADDED", obj, 0)
    assert types(first) == ["PodPhaseChanged"]
    assert first[0].event.claims == ["manual-claim", "p-ext-1", "p-gpu-x"]  # type: ignore[attr-defined]
    assert types(feed("DELETED", obj, 9)) == ["PodDeleted"]


@pytest.mark.parametrize("value", [7, 1.5, True])
def test_a_team_label_that_is_not_a_string_is_a_located_error_not_the_namespace_name(value: JSONValue) -> None:
    feed = Feed()
    broken = namespace("ml", None)
    metadata = broken["metadata"]
    assert isinstance(metadata, dict) and isinstance(metadata["labels"], dict)
    metadata["labels"]["team"] = value

    with pytest.raises(InvalidObject) as raised:
        feed("ADDED", broken, 0)

    assert raised.value.path == "metadata.labels.team"
    assert feed.state.entries == {}


def test_bad_objects_raise_located_errors_and_leave_state_untouched() -> None:
    feed, cid = Feed(), uid("claim")
    bad = claim(name="c", claim_uid=cid, results=["gpu-0"])
    results = dig(bad, "status", "allocation", "devices")["results"]
    assert isinstance(results, list) and isinstance(results[0], dict)
    results[0]["device"] = 7
    with pytest.raises(InvalidObject) as info:
        feed("ADDED", bad, 0)
    assert info.value.path == "status.allocation.devices.results[0].device"
    assert feed.state.entries == {}
    with pytest.raises(UnsupportedObject):
        feed("ADDED", {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}, 0)


@pytest.mark.parametrize("value", ["x", 3, ["a"], True])
def test_a_field_inside_something_that_is_not_a_mapping_is_a_located_error(value: JSONValue) -> None:
    # status must be an object: a string, number, list or bool there is corrupt input, named by the path read.
    feed, cid = Feed(), uid("claim")
    bad = claim(name="c", claim_uid=cid, results=["gpu-0"])
    bad["status"] = value
    with pytest.raises(InvalidObject) as raised:
        feed("ADDED", bad, 0)
    assert (raised.value.path, raised.value.reason) == (
        "status.allocation", f"expected a mapping at 'allocation', got {type(value).__name__}")
    assert feed.state.entries == {}


@pytest.mark.parametrize("count", [0, -3, -99999999999999999999999, 2**63, "2", 2.5, True])
@pytest.mark.parametrize("where", ["exactly", "firstAvailable"])
def test_a_request_count_the_api_server_would_refuse_rejects_the_claim(count: JSONValue, where: str) -> None:
    # count is how many devices a request wants; quotas, pending demand and a claim's "requested" are
    # counted from it, so 0, a negative, a string, a float or a bool is corrupt input, never a number.
    feed, cid = Feed(), uid("claim")
    bad = claim(name="c", claim_uid=cid)
    requests = dig(bad, "spec", "devices")["requests"]
    assert isinstance(requests, list) and isinstance(requests[0], dict)
    exactly = requests[0]["exactly"]
    assert isinstance(exactly, dict)
    exactly["count"] = count
    path = "spec.devices.requests[0].exactly.count"
    if where == "firstAvailable":
        requests[0] = {"name": "gpu", "firstAvailable": [{"name": "big", **exactly}]}
        path = "spec.devices.requests[0].firstAvailable[0].count"
    with pytest.raises(InvalidObject) as raised:
        feed("ADDED", bad, 0)
    assert raised.value.path == path
    assert feed.state.entries == {}


@pytest.mark.parametrize("count", [1, 8, 2**63 - 1])
def test_a_request_count_from_1_to_int64_is_recorded_as_sent(count: int) -> None:
    feed, cid = Feed(), uid("claim")
    events = feed("ADDED", claim(name="c", claim_uid=cid, count=count), 0)
    created = next(e.event for e in events if isinstance(e.event, ev.ClaimCreated))
    request = created.requests[0]
    assert isinstance(request, dict) and isinstance(request["exactly"], dict)
    assert request["exactly"]["count"] == count


def test_a_claim_or_pod_manifest_without_a_namespace_is_recorded_in_default() -> None:
    feed, cid, pid = Feed(), uid("claim"), uid("pod")
    manifest = claim(name="c", claim_uid=cid)
    del dig(manifest, "metadata")["namespace"]
    bare_pod = pod(name="p", pod_uid=pid)
    del dig(bare_pod, "metadata")["namespace"]

    (created,) = feed("ADDED", manifest, 0)
    (phase,) = feed("ADDED", bare_pod, 0)

    assert isinstance(created.event, ev.ClaimCreated) and created.event.namespace == "default"
    assert isinstance(phase.event, ev.PodPhaseChanged) and phase.event.namespace == "default"


def test_translating_a_whole_history_never_edits_an_object_it_was_given(tmp_path: Path) -> None:
    # normalize() hands v1 objects to the handlers uncopied and the state keeps parts of them, so an
    # edit of state in a later translation must never reach an earlier line's object.
    history = tmp_path / "fleet.jsonl"
    write_history(FleetSpec(nodes=3, gpus_per_node=4, hours=6.0, seed=7), history)
    lines = [x for x in read_history(history) if isinstance(x, WatchLine)]
    lines += [x for x in read_history(SEED_LAB) if isinstance(x, WatchLine)]
    before = [copy.deepcopy(x.object) for x in lines]
    state = TranslatorState()
    produced = 0
    for x in lines:
        assert x.observed_at is not None
        obs = Observation(type=x.type, object=x.object, observed_at=x.observed_at, recorded_at=x.observed_at,
                          digest=x.digest)
        try:
            produced += len(translate(state, obs))
        except (InvalidObject, UnsupportedObject):
            continue

    assert produced > len(lines) // 2  # the history did exercise the translator
    changed = [x.line for x, b in zip(lines, before, strict=True) if x.object != b]
    assert changed == []


@given(digest=st.text(max_size=80), index=st.integers(min_value=0, max_value=10_000),
       other=st.text(max_size=80), millis=st.integers(min_value=0, max_value=253_402_300_799_998))
def test_event_ids_start_with_the_receive_time_and_stay_unique(digest: str, index: int, other: str,
                                                                millis: int) -> None:
    # Ids are keys of events_event_id_key: led by the receive time in milliseconds, a batch's inserts land on
    # the index's last pages; the hash of (digest, index) behind it keeps them unique and deterministic.
    when = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis, microseconds=999)
    first = ev.event_id_for(digest, index, when)
    assert first == ev.event_id_for(digest, index, when)
    assert (first.version, first.variant) == (8, uuid.RFC_4122)
    assert first.hex[:12] == f"{millis:012x}"
    assert ev.event_id_for(digest, index + 1, when) != first
    if other != digest:
        assert ev.event_id_for(other, index, when) != first
    # A later millisecond sorts after, whatever the hash: PostgreSQL compares uuid values byte by byte.
    assert ev.event_id_for(other, index, when + timedelta(milliseconds=1)).bytes > first.bytes


def test_event_id_times_by_hand() -> None:
    # 2026-11-02T09:00:00.123Z: 20,759 days after 1970-01-01 (56 years with 14 leap days, then 305 days of 2026)
    # plus 9 hours, in milliseconds.
    when = datetime(2026, 11, 2, 9, 0, 0, 123_000, tzinfo=UTC)
    assert ((2026 - 1970) * 365 + 14 + 305) == 20_759
    assert ev.event_id_for("d", 0, when).hex[:12] == f"{(20_759 * 86_400 + 9 * 3600) * 1000 + 123:012x}"
    # Before 1970 the time is clamped to 0, never wrapped into another part of the index (48 bits of milliseconds
    # reach past the year 9999, the last a datetime holds).
    assert ev.event_id_for("d", 0, datetime(1969, 12, 31, tzinfo=UTC)).hex[:12] == "0" * 12
    assert ev.event_id_for("d", 0, datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)).hex[:12] == (
        f"{253_402_300_799_999:012x}")


def test_an_event_id_is_its_documented_layout_bit_by_bit() -> None:
    # Built here from the docstring with bit strings: 48 bits of milliseconds, version 8, the first 12 of the 80
    # hash bits, variant 10, then the hash's last 62 bits. Ids must never change: stored events keep them.
    when = datetime(2026, 11, 2, 9, 0, 0, 123_000, tzinfo=UTC)
    digest = "cluster-a/" + "ab" * 32
    sha = hashlib.sha1(uuid.NAMESPACE_URL.bytes + f"dra-ledger:{digest}:3".encode()).digest()
    hash_bits = "".join(f"{byte:08b}" for byte in sha[:10])
    millis = (20_759 * 86_400 + 9 * 3600) * 1000 + 123
    bits = f"{millis:048b}" + "1000" + hash_bits[:12] + "10" + hash_bits[-62:]
    assert len(bits) == 128
    assert ev.event_id_for(digest, 3, when) == uuid.UUID(int=int(bits, 2))
