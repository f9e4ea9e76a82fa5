"""After a relist, objects the translator holds but the list lacks are rebuilt as DELETED (pure, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

from ledger.recorded import WatchLine
from ledger.translator.relist import known, state_key, vanished
from ledger.translator.translate import Observation, TranslatorState, translate
from ledger.types import JSONObject
from tests.workers.harness import seed_lab

AT = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)


def _state_after(lines: int) -> TranslatorState:
    state = TranslatorState()
    for line in seed_lab()[:lines]:
        assert isinstance(line, WatchLine) and line.observed_at is not None
        translate(state, Observation(type=line.type, object=line.object, observed_at=line.observed_at,
                                     recorded_at=line.observed_at, digest=line.digest))
    return state


def _deleted(state: TranslatorState, obj: JSONObject) -> list[str]:
    produced = translate(state, Observation(type="DELETED", object=obj, observed_at=AT, recorded_at=AT,
                                            digest=f"relist-{state_key(obj)}"))
    assert all(e.occurred_at == AT for e in produced)
    return [e.event.TYPE for e in produced]


def test_a_claim_missing_from_the_list_is_released_and_deleted_at_the_relist() -> None:
    state = _state_after(30)
    listed = [k for k in state.entries if k.startswith("claim:") and "897a4b4b" not in k]
    (tombstone,) = vanished(state, "ResourceClaim", listed)
    assert tombstone["metadata"] == {"uid": "897a4b4b-03a9-30aa-6df0-70dbf8841cb8", "namespace": "ml-train",
                                     "name": "train-0-gpu-4fj8q"}
    assert _deleted(state, tombstone) == ["ClaimUnreserved", "ClaimDeallocated", "ClaimDeleted"]
    assert not known(state, "claim:897a4b4b-03a9-30aa-6df0-70dbf8841cb8")


def test_a_pod_missing_from_the_list_is_deleted_without_an_invented_phase_change() -> None:
    state = _state_after(30)
    key = "pod:7d5fa06b-d535-1cd3-4781-116a68593e01"
    (tombstone,) = vanished(state, "Pod", [k for k in state.entries if k.startswith("pod:") and k != key])
    assert _deleted(state, tombstone) == ["PodDeleted"]


def test_a_slice_and_a_class_missing_from_the_list_withdraw_their_devices_and_delete_the_class() -> None:
    state = _state_after(30)
    (slice_obj,) = vanished(state, "ResourceSlice", [])
    assert _deleted(state, slice_obj).count("DeviceWithdrawn") == 8
    (device_class,) = vanished(state, "DeviceClass", [])
    assert _deleted(state, device_class) == ["DeviceClassDeleted"]


def test_listed_objects_deleted_ones_and_namespaces_never_vanish() -> None:
    state = _state_after(39)
    everything = list(state.entries)
    for kind in ("ResourceClaim", "Pod", "ResourceSlice", "DeviceClass"):
        assert vanished(state, kind, everything) == []
    assert vanished(state, "Namespace", []) == []  # a deleted namespace keeps its last team
    deleted_claim = "claim:897a4b4b-03a9-30aa-6df0-70dbf8841cb8"
    assert state.entries[deleted_claim].get("deleted") is True
    assert all(deleted_claim.split(":")[1] not in str(t) for t in vanished(state, "ResourceClaim", []))
