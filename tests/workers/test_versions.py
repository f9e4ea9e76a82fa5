"""Servers that do not serve resource.k8s.io/v1 yet: the worker falls back to v1beta2, then v1beta1."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger import services
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import CLUSTER, SEED_LAB, assert_same_ledger, fake_cluster, lockstep, run


@pytest.mark.parametrize("served", [["v1beta2"], ["v1beta1"], ["v1beta1", "v1beta2"]])
def test_the_worker_falls_back_to_the_newest_served_version_and_records_the_same_ledger(
        ledger_factory: Callable[[], LedgerHandle], served: list[str]) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    requests: list[str] = []

    async def scenario() -> None:
        async with fake_cluster(live.db, served={"resource.k8s.io": served}) as cluster:
            cluster.server.advance(4)
            cluster.start()
            await lockstep(cluster.server, live.db)
            requests.extend(cluster.server.requests)

    run(scenario)
    expected = "v1beta2" if "v1beta2" in served else "v1beta1"
    assert any(r.startswith(f"GET /apis/resource.k8s.io/{expected}/resourceclaims") for r in requests)
    assert not any(r.startswith("GET /apis/resource.k8s.io/v1/") for r in requests)
    stored = services.load_watch_checkpoints(live.db, CLUSTER)
    assert stored["ResourceClaim"].api_version == f"resource.k8s.io/{expected}"
    assert stored["Pod"].api_version == "v1"
    assert_same_ledger(live, clean)
