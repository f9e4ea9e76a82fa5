"""DeviceTaintRule, the optional sixth kind: followed where the server serves it, skipped (said once) where not."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger import services
from ledger.recorded import WatchLine, read_history
from ledger.testing.handle import LedgerHandle
from tests.factories import at, claim, dig, gpu, history, namespace, resource_slice, rv, taint_rule, uid
from tests.integration.test_quotas import device_class
from tests.workers.harness import CLUSTER, assert_same_ledger, caught_up, eventually, fake_cluster, lockstep, run

DRA = "resource.k8s.io"
ALL_KINDS = ("Namespace", "DeviceClass", "ResourceSlice", "ResourceClaim", "Pod")


def _history(path: Path) -> Path:
    """A small cluster whose devices a DeviceTaintRule taints, changes, and stops tainting."""
    rule = taint_rule("gpu-1-broken", selector={"driver": "gpu.example.com", "device": "gpu-1"}, created=2)
    changed = copy.deepcopy(rule)
    dig(changed, "spec", "taint")["effect"] = "NoExecute"
    every = taint_rule("everything", selector={}, created=6)
    dig(changed, "metadata")["resourceVersion"] = rv()  # after every's: the history's versions increase
    return history(path, [
        ("ADDED", namespace("ml", "vision"), 0),
        ("ADDED", device_class("gpu.example.com"), 0),
        ("ADDED", resource_slice(name="node-a-gpus", devices=[gpu("gpu-0"), gpu("gpu-1"), gpu("gpu-2")]), 0),
        ("ADDED", claim(name="wants-two", claim_uid=uid("claim"), count=2), 1),
        ("ADDED", rule, 2),
        ("MODIFIED", changed, 4),
        ("ADDED", every, 6),
        ("DELETED", changed, 8),
        ("DELETED", every, 9),
    ])


def test_a_served_device_taint_rule_is_followed_live_and_records_what_a_replay_records(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    path = _history(tmp_path / "rules.jsonl")
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(path)
    requests: list[str] = []

    async def scenario() -> None:
        # A 1.34 cluster with the alpha API on: DeviceTaintRule only in v1alpha3, the rest in v1.
        async with fake_cluster(live.db, list(read_history(path)), served={DRA: ["v1", "v1alpha3"]}) as cluster:
            cluster.server.advance(5)  # the first rule reaches the worker through the list
            cluster.start()
            # Every loop has listed (the rule loop discovers its version first) before the next line plays.
            await caught_up(live.db, cluster.server, [*ALL_KINDS, "DeviceTaintRule"])
            await lockstep(cluster.server, live.db)
            await eventually(lambda: set(services.projection_lag(live.db).values()) == {0}, "projections caught up")
            requests.extend(cluster.server.requests)

    run(scenario)
    assert any(r.startswith(f"GET /apis/{DRA}/v1alpha3/devicetaintrules") for r in requests)
    assert services.load_watch_checkpoints(live.db, CLUSTER)["DeviceTaintRule"].api_version == f"{DRA}/v1alpha3"
    assert_same_ledger(live, clean)
    rule_events = [(e.type, e.stream) for e in live.events() if e.type.startswith("DeviceTaintRule")]
    assert rule_events == [("DeviceTaintRuleDefined", "taintrule:gpu-1-broken"),
                           ("DeviceTaintRuleChanged", "taintrule:gpu-1-broken"),
                           ("DeviceTaintRuleDefined", "taintrule:everything"),
                           ("DeviceTaintRuleDeleted", "taintrule:gpu-1-broken"),
                           ("DeviceTaintRuleDeleted", "taintrule:everything")]
    # Pending demand of the claim (2 GPUs of 3): gpu-1 tainted from minute 2 to 8, every device from 6 to 9.
    def free(minutes: float) -> list[tuple[int, int]]:
        body: Any = services.pending(live.db, at=at(minutes), cluster=CLUSTER)
        return [(c["requested"], c["free"]) for c in body["classes"]]

    assert {m: free(m) for m in (1.5, 3, 7, 10)} == {1.5: [(2, 3)], 3: [(2, 2)], 7: [(2, 0)], 10: [(2, 3)]}


def test_a_server_without_device_taint_rule_is_followed_without_it_and_says_so_once(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _history(tmp_path / "rules.jsonl")
    lines = [line for line in read_history(path)
             if isinstance(line, WatchLine) and line.object.get("kind") != "DeviceTaintRule"]
    live = ledger_factory()
    requests: list[str] = []
    caplog.set_level(logging.WARNING, logger="workers.main")

    async def scenario() -> None:
        # Kubernetes 1.34 without the alpha API: resource.k8s.io v1, v1beta2 and v1beta1, no DeviceTaintRule.
        async with fake_cluster(live.db, lines, served={DRA: ["v1beta1", "v1"]}) as cluster:
            worker = cluster.start()
            await lockstep(cluster.server, live.db)
            await eventually(lambda: any("not served" in r.getMessage() for r in caplog.records), "the warning")
            assert not worker.task.done()  # still following the other kinds
            requests.extend(cluster.server.requests)

    run(scenario)
    assert not any("/devicetaintrules" in r for r in requests)
    assert "DeviceTaintRule" not in services.load_watch_checkpoints(live.db, CLUSTER)
    said = [r.getMessage() for r in caplog.records if "DeviceTaintRule is not served" in r.getMessage()]
    assert len(said) == 1, said
    assert [e.type for e in live.events()][:1] == ["TeamAssigned"]  # the other kinds were recorded
    assert {e.type for e in live.events()} >= {"DevicePublished", "ClaimCreated", "DeviceClassDefined"}
