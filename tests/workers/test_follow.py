"""A live follow of seed-lab through the real kubernetes-asyncio client records what a replay records."""

from __future__ import annotations

from collections.abc import Callable

from ledger import services
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import SEED_LAB, assert_same_ledger, eventually, fake_cluster, lockstep, run


def test_following_seed_lab_live_gives_the_same_events_and_read_models_as_replaying_it(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    replayed, live = ledger_factory(), ledger_factory()
    replayed.replay(SEED_LAB)

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.advance(4)  # what exists before the worker starts reaches it through the list
            cluster.start()
            await lockstep(cluster.server, live.db)
            # The leader keeps the read models current by itself (no query has caught them up yet).
            await eventually(lambda: set(services.projection_lag(live.db).values()) == {0}, "projections caught up")

    run(scenario)
    assert_same_ledger(live, replayed)
    assert len(live.events()) == len(replayed.events()) > 0
