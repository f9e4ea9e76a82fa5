"""Faults of the API server, each leaving the ledger identical to a clean replay of the same history.

Every scenario follows seed-lab in lockstep through the real kubernetes-asyncio client (so receive
times are the history's ``observedAt``) and compares all events and read models with a replay.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from ledger.recorded import WatchLine
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import (
    SEED_LAB,
    assert_same_ledger,
    caught_up,
    eventually,
    fake_cluster,
    lockstep,
    metric_sample,
    run,
    seed_lab,
)
from workers.fake_apiserver import Fault
from workers.health import WorkerMetrics

FAULTS: dict[str, list[Fault]] = {
    "a stream dropped mid-way, once between events and once inside one": [
        Fault(action="drop", kind="ResourceClaim", verb="watch", after_events=2),
        Fault(action="drop", kind="Pod", verb="watch", after_events=3, partial=True),
    ],
    "410 Gone sent in-stream and answered as a status": [
        Fault(action="expire", kind="ResourceClaim", verb="watch", after_events=3),
        Fault(action="status", status=410, kind="Pod", verb="watch"),
    ],
    "410 Gone answered to a list": [
        Fault(action="status", status=410, kind="DeviceClass", verb="list"),
        Fault(action="status", status=410, kind="Namespace", verb="list", times=2),
    ],
    "API 500s and 429s on lists and watches": [
        Fault(action="status", status=500, kind="ResourceClaim", verb="list", times=2),
        Fault(action="status", status=503, kind="ResourceSlice", verb="watch"),
        Fault(action="status", status=429, retry_after_s=0, kind="Pod", verb="watch", times=2),
    ],
}


@pytest.mark.parametrize("faults", list(FAULTS.values()), ids=list(FAULTS))
def test_api_faults_leave_the_ledger_identical_to_a_clean_run(
        ledger_factory: Callable[[], LedgerHandle], faults: list[Fault]) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    metrics: list[WorkerMetrics] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.inject(*faults)
            cluster.server.advance(4)
            metrics.append(cluster.start().metrics)
            await lockstep(cluster.server, live.db)
            assert cluster.server.faults == [], "every injected fault fired"

    run(scenario)
    assert_same_ledger(live, clean)
    kinds = {f.kind for f in faults if f.kind}
    for kind in kinds:
        assert (metric_sample(metrics[0], "dra_ledger_watch_restarts_total", kind=kind)
                + metric_sample(metrics[0], "dra_ledger_watch_expired_total", kind=kind)) > 0, kind


def test_410s_are_counted_and_make_the_worker_list_again(ledger_factory: Callable[[], LedgerHandle]) -> None:
    live = ledger_factory()
    metrics: list[WorkerMetrics] = []
    lists: list[int] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.inject(*FAULTS["410 Gone sent in-stream and answered as a status"])
            cluster.server.advance(4)
            metrics.append(cluster.start().metrics)
            await lockstep(cluster.server, live.db)
            lists.append(sum(1 for r in cluster.server.requests
                             if r.startswith("GET /apis/resource.k8s.io/v1/resourceclaims") and "watch=" not in r))

    run(scenario)
    assert metric_sample(metrics[0], "dra_ledger_watch_expired_total", kind="ResourceClaim") == 1
    assert metric_sample(metrics[0], "dra_ledger_watch_expired_total", kind="Pod") == 1
    assert lists[0] >= 2  # the first list, and the list after the 410


def test_objects_deleted_while_the_worker_was_down_past_compaction_are_recorded_as_deleted(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    lines = seed_lab()
    # The claim train-0-gpu-4fj8q is deleted at 10:00:04 while no worker runs; the history is then
    # compacted, so the restarted worker's resourceVersions are gone (410) and it must list again.
    deletion = next(i for i, x in enumerate(lines)
                    if isinstance(x, WatchLine) and x.type == "DELETED" and x.object.get("kind") == "ResourceClaim")
    expired: list[float] = []

    async def scenario() -> None:
        async with fake_cluster(live.db, lines) as cluster:
            cluster.server.advance(4)
            first = cluster.start(identity="before")
            await lockstep(cluster.server, live.db, lines=deletion - 4)
            await first.close()
            played = cluster.server.advance(1)
            assert played[0].type == "DELETED" and played[0].name == "train-0-gpu-4fj8q"
            cluster.server.expire()
            second = cluster.start(identity="after")
            await caught_up(live.db, cluster.server)  # the relists happen at 10:00:04, before time moves on
            await lockstep(cluster.server, live.db)
            expired.append(metric_sample(second.metrics, "dra_ledger_watch_expired_total"))

    run(scenario)
    assert expired[0] >= 1
    assert [e.type for e in live.events() if e.stream == "claim:897a4b4b-03a9-30aa-6df0-70dbf8841cb8"][-1] == \
        "ClaimDeleted"
    assert_same_ledger(live, clean)


def test_each_complete_list_is_timed_per_kind_the_one_after_a_410_included(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    live = ledger_factory()
    metrics: list[WorkerMetrics] = []
    claim_lists: list[int] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.inject(Fault(action="status", status=410, kind="ResourceClaim", verb="watch"))
            cluster.server.advance(10)  # two claims exist: each claim list is one page of 3
            worker = cluster.start()
            metrics.append(worker.metrics)
            await eventually(lambda: metric_sample(worker.metrics, "dra_ledger_watch_relist_duration_seconds_count",
                                             kind="ResourceClaim") >= 2, "the claims listed again after the 410")
            await caught_up(live.db, cluster.server)
            claim_lists.append(sum(1 for r in cluster.server.requests
                                   if r.startswith("GET /apis/resource.k8s.io/v1/resourceclaims?")
                                   and "watch=" not in r))

    run(scenario)
    name = "dra_ledger_watch_relist_duration_seconds"
    # The first list of every kind, and for claims the list after the 410 on their first watch.
    assert claim_lists == [2]
    assert metric_sample(metrics[0], f"{name}_count", kind="ResourceClaim") == 2
    assert metric_sample(metrics[0], f"{name}_bucket", kind="ResourceClaim", le="+Inf") == 2
    assert metric_sample(metrics[0], f"{name}_sum", kind="ResourceClaim") > 0
    for kind in ("Namespace", "DeviceClass", "ResourceSlice", "Pod"):
        assert metric_sample(metrics[0], f"{name}_count", kind=kind) == 1, kind
    assert metric_sample(metrics[0], "dra_ledger_watch_expired_total", kind="ResourceClaim") == 1


@pytest.mark.parametrize(("status", "said"), [
    (403, "HTTP 403 injected fault: Forbidden (the worker's credentials may not do this: it needs get, list and watch "
          "on the kinds it follows, as the ClusterRole in deploy/kubernetes/rbac.yaml grants)"),
    (401, "HTTP 401 injected fault: Unauthorized (the API server did not accept the worker's credentials: check the "
          "kubeconfig's user, or the ServiceAccount token the pod mounts)"),
])
def test_a_refused_list_is_logged_in_one_line_saying_what_to_fix_and_the_watch_starts_again(
        ledger_factory: Callable[[], LedgerHandle], caplog: pytest.LogCaptureFixture, status: int, said: str) -> None:
    # RBAC fixed while the worker runs: it follows on, with the ledger of a clean run. Each restart logged the
    # refusal with a traceback that buried what to fix (about 30 in 10 s over the six kinds).
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.inject(Fault(action="status", status=status, kind="ResourceClaim", verb="list", times=2))
            cluster.server.advance(4)
            cluster.start()
            await lockstep(cluster.server, live.db)
            assert cluster.server.faults == []

    with caplog.at_level(logging.ERROR, logger="workers.main"):
        run(scenario)
    assert_same_ledger(live, clean)
    refused = [r for r in caplog.records if r.getMessage().startswith("watch of ResourceClaim failed")]
    assert len(refused) == 2
    expected = f"list resourceclaims.resource.k8s.io/v1: {said}"
    assert [r.getMessage().split(": ", 1)[1] for r in refused] == [expected, expected]
    assert [bool(r.exc_info) for r in refused] == [False, False]  # no traceback
