"""An event's stored JSON is the same whether encoded from its Struct (the append path) or from the dict
``to_payload`` builds, and reads back to the same event."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from ledger import events as ev
from ledger.recorded import WatchLine, read_history
from ledger.simulate import FleetSpec, write_history
from ledger.store.postgres import json_bytes
from ledger.translator.translate import Observation, TranslatorState, translate
from ledger.types import JSONObject
from tests.paths import HISTORIES, REAL

AT = datetime(2026, 1, 1, tzinfo=UTC)


def _events(path: Path) -> list[ev.NewEvent]:
    """Every event the translator makes of ``path``'s lines (one state for the file; bad lines skipped)."""
    state, out = TranslatorState(), []
    for line in read_history(path, at=AT):
        if not isinstance(line, WatchLine):
            continue
        obs = Observation(type=line.type, object=line.object, observed_at=line.observed_at or AT, recorded_at=AT,
                          digest=f"test/{line.digest}")
        try:
            out += translate(state, obs)
        except ValueError:  # InvalidObject, UnsupportedObject: fixtures that are meant to be refused
            continue
    return out


def _source_column(source: ev.EventSource) -> JSONObject:
    """What ``events.source`` holds for ``source``, spelled out by hand."""
    return {"kind": source.kind, "uid": source.uid, "resourceVersion": source.resource_version,
            "watchType": source.watch_type, "digest": source.digest}


def _corpus(tmp_path: Path) -> list[ev.NewEvent]:
    history = tmp_path / "fleet.jsonl"
    # Small, but with MIG partitions, shares, extended-resource claims and driver restarts (FleetSpec defaults).
    write_history(FleetSpec(nodes=6, gpus_per_node=4, hours=6, seed=3), history)
    found = _events(HISTORIES / "seed-lab.jsonl") + _events(history)
    for path in sorted(REAL.glob("*.yaml")):
        found += _events(path)
    return found


def test_every_event_encodes_from_its_struct_as_from_its_payload_dict(tmp_path: Path) -> None:
    found = _corpus(tmp_path)
    types = {e.event.TYPE for e in found}
    # The corpus reaches the payloads whose keys are spelled apart from plain camel case.
    assert {"ClaimCreated", "ClaimAllocated", "ClaimReserved", "PodPhaseChanged", "DevicePublished"} <= types
    for e in found:
        assert json_bytes(e.event) == json_bytes(ev.to_payload(e.event)), e.event.TYPE
        assert json_bytes(e.source) == json_bytes(_source_column(e.source))
        assert ev.from_payload(e.event.TYPE, ev.to_payload(e.event)) == e.event


def test_payload_keys_keep_the_kubernetes_spelling() -> None:
    created = ev.ClaimCreated(uid="u", namespace="ml", name="c", origin="template", owner_pod="p",
                              owner_pod_uid="pu", requests=[])
    assert json_bytes(created) == (b'{"uid":"u","namespace":"ml","name":"c","origin":"template","ownerPod":"p",'
                                     b'"ownerPodUID":"pu","requests":[]}')
    source = ev.EventSource(kind="Pod", uid="u", resource_version="7", watch_type="ADDED", digest="d")
    assert json_bytes(source) == b'{"kind":"Pod","uid":"u","resourceVersion":"7","watchType":"ADDED","digest":"d"}'


def test_a_payload_msgspec_cannot_encode_falls_back_to_the_dict_encoding() -> None:
    # A lone surrogate: msgspec refuses it, json.dumps writes it as an ASCII escape.
    created = ev.ClaimCreated(uid="u", namespace="ml", name="c\ud800", origin="manual", owner_pod=None,
                              owner_pod_uid=None, requests=[])
    assert json_bytes(created) == json_bytes(ev.to_payload(created))
    assert b'"name": "c\\ud800"' in json_bytes(created)
