"""The translator's packed entries: what goes in comes out, whatever form it is kept in."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from ledger.errors import InvalidObject, UnsupportedObject
from ledger.events import NewEvent
from ledger.recorded import WatchLine, read_history
from ledger.simulate import FleetSpec, write_history
from ledger.translator.entries import StateEntries
from ledger.translator.translate import Observation, TranslatorState, translate
from ledger.types import JSONObject, JSONValue
from tests.factories import Feed, gpu, resource_slice, types, uid


def _pool_entry(feed: Feed) -> tuple[str, JSONObject]:
    (key,) = [k for k in feed.state.entries if k.startswith("pool:")]
    entry = feed.state.entries[key]
    return key, entry


def test_an_entry_reads_back_equal_and_each_read_is_the_callers_own_copy() -> None:
    entries = StateEntries()
    value: JSONObject = {"pos": 3, "namespace": "ml", "results": [{"device": "gpu-0", "consumedCapacity": {}}],
                         "consumers": {"u1": {"resource": "pods", "name": "p", "uid": "u1", "apiGroup": None}},
                         "ratio": 0.1, "huge": 2**70, "deletion": None, "flag": True}
    entries["claim:a"] = value
    expected = copy.deepcopy(value)
    value["pos"] = 99  # the writer's object is not the entry

    first = entries["claim:a"]
    first["pos"] = 100
    results = first["results"]
    assert isinstance(results, list)
    results.clear()

    assert entries["claim:a"] == expected
    assert entries.get("claim:b") is None and "claim:b" not in entries and "claim:a" in entries


def test_a_pool_reads_back_with_the_published_views_the_translator_wrote() -> None:
    feed = Feed()
    feed("ADDED", resource_slice(name="s-1", generation=1, devices=[gpu("gpu-0"), gpu("gpu-1")]), 0)
    feed("ADDED", resource_slice(name="s-2", generation=2, devices=[gpu("gpu-1", multi=True), gpu("gpu-2")]), 5)

    _, pool = _pool_entry(feed)

    # Worked out by hand: generation 2 counts, so its slice's two devices are what was published.
    published = pool["published"]
    assert isinstance(published, dict) and sorted(published) == ["gpu-1", "gpu-2"]
    gpu_1 = published["gpu-1"]
    assert isinstance(gpu_1, dict) and gpu_1["slice"] == "s-2" and gpu_1["allowMultipleAllocations"] is True


def test_a_pool_whose_published_views_differ_from_its_slices_keeps_them_and_the_translator_acts_on_them() -> None:
    # A row as an older release could have left it: gpu-1 in the slice but not yet published.
    feed, sid = Feed(), uid("slice")
    obj = resource_slice(name="s", slice_uid=sid, devices=[gpu("gpu-0"), gpu("gpu-1")])
    feed("ADDED", obj, 0)
    key, pool = _pool_entry(feed)
    published = pool["published"]
    assert isinstance(published, dict)
    del published["gpu-1"]
    feed.state.entries[key] = pool

    assert feed.state.entries[key] == pool
    again = feed("MODIFIED", copy.deepcopy(obj), 1)  # the slice itself did not change
    assert types(again) == ["DevicePublished"]
    assert again[0].stream == "device:gpu.example.com/node-a/gpu-1"


def test_an_entry_given_as_stored_text_reads_back_as_that_json() -> None:
    feed = Feed()
    feed("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0)
    key, pool = _pool_entry(feed)
    claim: JSONObject = {"pos": 2, "name": "c", "rv": "5001", "results": None, "consumers": {}}
    entries = StateEntries()

    entries.load_json("claim:c", json.dumps(claim, indent=2))  # any spacing: jsonb prints its own
    entries.load_json(key, json.dumps(pool))

    assert entries["claim:c"] == claim and entries[key] == pool
    stored = entries.packed_json("claim:c")
    assert stored is not None and json.loads(stored) == claim
    assert entries.packed_json(key) is None  # a pool is kept without its published views: encode it


def test_a_write_that_cannot_be_encoded_changes_no_entry() -> None:
    entries = StateEntries({"claim:a": {"pos": 1}, "claim:b": {"pos": 2}})
    deep: JSONValue = []
    for _ in range(5000):
        deep = [deep]

    with pytest.raises(RecursionError):
        entries.replace({"claim:a": {"pos": 5}, "claim:c": {"pos": 1, "x": deep}}, removed=["claim:b"])

    assert dict(entries) == {"claim:a": {"pos": 1}, "claim:b": {"pos": 2}}


def _translate_all(lines: list[WatchLine], *, restart_each_line: bool) -> list[NewEvent]:
    state, out = TranslatorState(), []
    for x in lines:
        assert x.observed_at is not None
        obs = Observation(type=x.type, object=x.object, observed_at=x.observed_at, recorded_at=x.observed_at,
                          digest=x.digest)
        try:
            out.extend(translate(state, obs))
        except (InvalidObject, UnsupportedObject):
            continue
        if restart_each_line:  # what a worker restarted after this line loads: the stored text of every entry
            reloaded = TranslatorState()
            for key in state.entries:
                reloaded.entries.load_json(key, json.dumps(state.entries[key]))
            state = reloaded
    return out


def test_a_translator_reloaded_from_stored_text_after_every_line_emits_the_same_events(tmp_path: Path) -> None:
    history = tmp_path / "fleet.jsonl"
    # MIG partitions on every node and driver restarts: every pool moves to new generations several times.
    write_history(FleetSpec(nodes=3, gpus_per_node=2, hours=6.0, seed=11, mig_node_fraction=1.0,
                            restarts_per_node_day=8.0), history)
    lines = [x for x in read_history(history) if isinstance(x, WatchLine)]

    straight = _translate_all(lines, restart_each_line=False)
    restarted = _translate_all(lines, restart_each_line=True)

    assert {"DeviceUpdated", "PoolGenerationObserved", "ClaimDeallocated", "ClaimDeleted"} <= set(types(straight))
    assert restarted == straight


def test_a_pool_row_without_published_views_reads_back_without_them() -> None:
    # A damaged row: the translator rejects lines of this pool (KeyError) rather than guess the views.
    feed = Feed()
    feed("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0)
    key, pool = _pool_entry(feed)
    del pool["published"]

    feed.state.entries[key] = pool

    assert feed.state.entries[key] == pool
