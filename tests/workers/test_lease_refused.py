"""A replica that cannot take the Lease (403, not served) never writes: the error ends its run."""

from __future__ import annotations

import asyncio

import pytest

from ledger.testing.handle import LedgerHandle
from tests.workers.harness import WAIT_S, fake_cluster, run
from workers.fake_apiserver import Fault
from workers.k8s.client import ApiError


def test_a_refused_lease_stops_the_replica_before_it_writes_anything(ledger: LedgerHandle) -> None:
    outcome: list[BaseException] = []

    async def scenario() -> None:
        async with fake_cluster(ledger.db) as cluster:
            cluster.server.advance(10)
            cluster.server.inject(Fault(action="status", status=403, kind="Lease", verb="get", times=1000))
            worker = cluster.start(identity="no-rights")
            with pytest.raises(ApiError) as info:
                await asyncio.wait_for(worker.task, WAIT_S)
            outcome.append(info.value)
            assert worker.metrics is not None
        # Its run ended on its own: leaving the fake cluster still closes its client (an open aiohttp session was
        # reported unclosed at the end of the test session).
        assert worker.client.rest_client.pool_manager.closed

    run(scenario, timeout_s=90)
    assert outcome and "403" in str(outcome[0])
    assert ledger.events() == []  # it never followed a kind, so nothing was written
