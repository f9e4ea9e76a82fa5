"""``repair_state``: translator state entries that fell behind their streams (as release 0.3.0 could leave them) are
rebuilt from their objects' events, after which every later event of the object is recorded; the fold gives, for
every kind it rebuilds, the entry the translator itself kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text

from ledger import services
from ledger.errors import StreamConflict
from ledger.simulate import FleetSpec, write_history
from ledger.store.postgres import EntryBehind
from ledger.testing.handle import LedgerHandle
from ledger.translator.repair import REBUILT_PREFIXES, rebuilt_entry
from ledger.types import JSONObject
from tests.factories import dig, namespace, rv, taint_rule
from tests.integration.test_quotas import DRIVER, Lab, device_class
from tests.integration.test_two_writers import ALLOCATED, CLUSTER, seed_lab
from tests.paths import HISTORIES
from tests.workers.harness import assert_same_ledger


def stored_entries(ledger: LedgerHandle, prefix: str) -> dict[str, JSONObject]:
    """The entries of the cluster's ``translator_state`` whose key starts with ``prefix``, tombstones included."""
    with ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT key, state::text AS state FROM translator_state WHERE cluster = :c "
                                 "AND starts_with(key, :p)"), {"c": ledger.cluster, "p": prefix}).all()
    return {str(r.key): json.loads(r.state) for r in rows}


def stored_claim_entries(ledger: LedgerHandle) -> dict[str, JSONObject]:
    """Every ResourceClaim entry of the cluster's ``translator_state``, tombstones included, by key."""
    return stored_entries(ledger, "claim:")


def folded(ledger: LedgerHandle, key: str) -> JSONObject:
    return rebuilt_entry(ledger.db.read_stream(cluster=ledger.cluster, stream=key))


def test_a_claim_entry_folded_from_its_events_is_the_one_the_translator_kept_on_seed_lab(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # Seed lab, and then shared-gpu (left allocated with no consumer) is released at 12:30 without being deleted.
    [last] = [json.loads(t) for t in (HISTORIES / "seed-lab.jsonl").read_text().splitlines()
              if '"kind":"ResourceClaim","metadata":{"name":"shared-gpu"' in t][-1:]
    obj = last["object"]
    obj["status"].pop("allocation")
    obj["metadata"]["resourceVersion"] = "999001"
    released = tmp_path / "released.jsonl"
    released.write_text(json.dumps({"observedAt": "2026-11-02T12:30:00.250000Z", "type": "MODIFIED", "object": obj})
                        + "\n")
    ledger.replay(HISTORIES / "seed-lab.jsonl", released)
    stored = stored_claim_entries(ledger)

    assert len(stored) == 6 and sum(1 for e in stored.values() if e.get("deleted")) == 1  # train-0's tombstone
    assert [e["released"] for e in stored.values() if "released" in e] == ["2026-11-02T12:30:00.250000+00:00"]
    for key, entry in stored.items():
        assert folded(ledger, key) == entry, key


def assert_every_entry_folds_to_the_stored_one(ledger: LedgerHandle) -> dict[str, int]:
    """Check, for every stored entry of the kinds :func:`rebuilt_entry` folds, that folding its stream gives it (but
    ``rv``); return how many entries of each kind were checked, and how many of them are tombstones."""
    checked: dict[str, int] = {}
    for prefix in REBUILT_PREFIXES:
        for key, entry in stored_entries(ledger, prefix).items():
            # rv (claims only): the translator keeps the last version it read, the fold the last that changed
            # something; both are versions of the object, and the fold's is where its last event came from.
            assert {k: v for k, v in folded(ledger, key).items() if k != "rv"} == \
                {k: v for k, v in entry.items() if k != "rv"}, key
            checked[prefix] = checked.get(prefix, 0) + 1
            checked[f"{prefix} deleted"] = checked.get(f"{prefix} deleted", 0) + bool(entry.get("deleted"))
    return checked


def test_the_fold_matches_every_entry_of_a_simulated_fleet(ledger: LedgerHandle, tmp_path: Path) -> None:
    # Shared claims, consumers coming and going, releases and reallocations, deletions, pods through their phases, a
    # namespace relabelled: some 240 claims.
    history = tmp_path / "fleet.jsonl"
    write_history(FleetSpec(nodes=6, gpus_per_node=8, hours=12, seed=5), history)
    ledger.replay(history)

    checked = assert_every_entry_folds_to_the_stored_one(ledger)

    assert checked["claim:"] > 200 and checked["claim: deleted"] > 100 and checked["pod: deleted"] > 100
    assert checked["namespace:"] >= 3 and checked["class:"] >= 2
    assert sum(1 for e in stored_claim_entries(ledger).values() if e.get("consumers")) > 10


def test_the_fold_matches_device_classes_and_taint_rules_changed_deleted_and_defined_again(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    h = Lab()
    h.add(namespace("ml", "vision"))
    gpu_class = device_class("gpu.example.com")
    h.add(gpu_class)
    h.events.append(("MODIFIED", {**gpu_class, "metadata": {**dig(gpu_class, "metadata"), "resourceVersion": rv()},
                                  "spec": {"selectors": []}}, 2))
    h.events.append(("DELETED", gpu_class, 3))
    h.events.append(("ADDED", device_class("gpu.example.com"), 4))
    rule = taint_rule("broken", selector={"driver": DRIVER})
    h.add(rule, 1)
    h.events.append(("MODIFIED", taint_rule("broken", selector={"driver": DRIVER}, effect="NoExecute"), 2))
    h.events.append(("DELETED", rule, 3))
    h.events.append(("ADDED", taint_rule("broken", selector=None), 5))
    h.add(taint_rule("gone", selector={"driver": DRIVER}), 1)
    h.events.append(("DELETED", taint_rule("gone", selector={"driver": DRIVER}), 6))
    h.replay(ledger, tmp_path)

    checked = assert_every_entry_folds_to_the_stored_one(ledger)

    assert (checked["class:"], checked["taintrule:"], checked["taintrule: deleted"]) == (1, 2, 1)
    assert [len(ledger.db.read_stream(cluster=ledger.cluster, stream=s)) for s in
            ("class:gpu.example.com", "taintrule:broken")] == [4, 4]


def test_a_claim_entry_behind_its_stream_is_rebuilt_and_the_claims_later_events_are_recorded(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    # train-0's claim is allocated at line 7, released at line 31 and deleted at line 32. Its entry is set back to
    # what it was after its creation (position 1) while its stream is at 3, as release 0.3.0 could leave it: the
    # deletion is then refused as a StreamConflict at every attempt, until the entry is repaired.
    lines = seed_lab()
    live, clean = ledger_factory(), ledger_factory()
    services.ingest(clean.db, lines, cluster=CLUSTER)
    services.ingest(live.db, lines[:31], cluster=CLUSTER)
    [(key, entry)] = [(k, e) for k, e in stored_claim_entries(live).items() if e.get("name") == "train-0-gpu-4fj8q"]
    events = live.db.read_stream(cluster=CLUSTER, stream=key)
    assert [e.type for e in events] == ["ClaimCreated", "ClaimAllocated", "ClaimReserved"] and entry["pos"] == 3
    with live.engine.begin() as conn:
        conn.execute(text("UPDATE translator_state SET state = CAST(:s AS jsonb) WHERE cluster = :c AND key = :k"),
                     {"s": json.dumps(rebuilt_entry(events[:1])), "c": CLUSTER, "k": key})
    with pytest.raises(StreamConflict):
        services.ingest(live.db, lines[31:], cluster=CLUSTER)

    [repair] = services.repair_state(live.db, cluster=CLUSTER)
    again = services.repair_state(live.db)

    assert repair.repaired == [EntryBehind(key=key, position=1, head=3)] and repair.left == []
    assert stored_claim_entries(live)[key] == entry
    assert [(r.cluster, r.repaired, r.left) for r in again] == [(CLUSTER, [], [])]
    report = services.ingest(live.db, lines[31:], cluster=CLUSTER)
    assert report.recorded == len(lines) - 31
    assert_same_ledger(live, clean)


def test_a_pool_entry_behind_its_stream_is_named_and_left(ledger: LedgerHandle) -> None:
    services.ingest(ledger.db, seed_lab()[:ALLOCATED], cluster=ledger.cluster)
    with ledger.engine.begin() as conn:
        key = conn.execute(text("SELECT key FROM translator_state WHERE cluster = :c AND key LIKE 'pool:%' "
                                "ORDER BY key LIMIT 1"), {"c": ledger.cluster}).scalar_one()
        conn.execute(text("UPDATE translator_state SET state = jsonb_set(state, '{pos}', '0') WHERE cluster = :c "
                          "AND key = :k"), {"c": ledger.cluster, "k": key})

    [repair] = services.repair_state(ledger.db, cluster=ledger.cluster)

    assert repair.repaired == [] and repair.left == [EntryBehind(key=key, position=0, head=1)]


def test_db_repair_state_says_what_it_rebuilt_and_exits_1_for_entries_it_leaves(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from ledger.cli import app

    url = ledger.engine.url.render_as_string(hide_password=False)
    services.ingest(ledger.db, seed_lab()[:31], cluster=ledger.cluster)
    [(key, entry)] = [(k, e) for k, e in stored_claim_entries(ledger).items() if e.get("name") == "train-0-gpu-4fj8q"]
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE translator_state SET state = jsonb_set(state, '{pos}', '2') WHERE cluster = :c "
                          "AND key = :k"), {"c": ledger.cluster, "k": key})
        conn.execute(text("UPDATE translator_state SET state = jsonb_set(state, '{pos}', '0') WHERE cluster = :c "
                          "AND key = 'namespace:ml-train'"), {"c": ledger.cluster})
        conn.execute(text("UPDATE translator_state SET state = jsonb_set(state, '{pos}', '0') WHERE cluster = :c "
                          "AND key = 'pool:gpu.example.com/lab-node'"), {"c": ledger.cluster})

    rest = tmp_path / "rest.jsonl"
    rest.write_text("\n".join((HISTORIES / "seed-lab.jsonl").read_text().splitlines()[31:]) + "\n")
    refused = CliRunner().invoke(app, ["replay", str(rest), "--database-url", url, "--cluster", ledger.cluster])
    assert refused.exit_code == 2, refused.output
    assert f"error: stream '{key}' is past position 2: another writer appended to it first at every attempt; if no " \
        "other writer of this cluster is running, its translator state entry is behind the stream" in refused.stderr
    assert "run `dra-ledger db repair-state`, then this command again" in refused.stderr

    first = CliRunner().invoke(app, ["db", "repair-state", "--database-url", url])
    second = CliRunner().invoke(app, ["db", "repair-state", "--database-url", url, "--cluster", ledger.cluster])
    unknown = CliRunner().invoke(app, ["db", "repair-state", "--database-url", url, "--cluster", "elsewhere"])

    assert first.exit_code == 1, first.output
    assert first.stdout.splitlines() == [
        f"{ledger.cluster}: {key}: entry at stream position 2, stream at 3: rebuilt from its events",
        f"{ledger.cluster}: namespace:ml-train: entry at stream position 0, stream at 1: rebuilt from its events",
        f"{ledger.cluster}: pool:gpu.example.com/lab-node: entry at stream position 0, stream at 1: a pool's entry, "
        "left as it is (its next events are refused)"]
    assert "pool entries behind their streams, left as they are: 1 (nothing here rebuilds them)" in first.stderr
    assert stored_claim_entries(ledger)[key] == entry
    assert second.exit_code == 1 and key not in second.stdout
    replayed = CliRunner().invoke(app, ["replay", str(rest), "--database-url", url, "--cluster", ledger.cluster])
    assert replayed.exit_code == 0, replayed.output
    assert unknown.exit_code == 0 and "nothing is recorded under cluster 'elsewhere'" in unknown.stderr
