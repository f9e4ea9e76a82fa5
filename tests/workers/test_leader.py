"""Leader election in-process: a leader that cannot renew its Lease steps down and stops writing; the
ledger stays identical to a clean run whoever leads afterwards."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from ledger.testing.handle import LedgerHandle
from tests.workers.harness import SEED_LAB, assert_same_ledger, eventually, fake_cluster, lockstep, run
from workers.fake_apiserver import Fault


def test_a_leader_that_cannot_renew_steps_down_and_the_ledger_stays_identical(
        ledger_factory: Callable[[], LedgerHandle], caplog: pytest.LogCaptureFixture) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    caplog.set_level(logging.WARNING, logger="workers.main")

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            server = cluster.server
            server.advance(4)

            def holder() -> object:
                lease = server.lease("dra-ledger", "dra-ledger-watch")
                spec = lease.get("spec") if lease else None
                return spec.get("holderIdentity") if isinstance(spec, dict) else None

            a = cluster.start(identity="a")
            await eventually(lambda: holder() == "a", "a holds the Lease")
            b = cluster.start(identity="b")
            await lockstep(server, live.db, lines=10)
            assert b.metrics.stored_events == 0 < a.metrics.stored_events
            # The API server refuses every Lease update for longer than the renew deadline (1.2 s).
            server.inject(Fault(action="status", status=500, kind="Lease", verb="update", times=10**6))
            await eventually(lambda: not a.metrics.leading, "a stepped down", 10)
            assert not b.metrics.leading  # b cannot take the Lease either while updates fail
            server.faults.clear()
            await lockstep(server, live.db)  # whoever wins the Lease now carries on
            assert a.metrics.leading != b.metrics.leading

    run(scenario)
    assert any("lost the lease" in r.getMessage() for r in caplog.records)
    assert_same_ledger(live, clean)
