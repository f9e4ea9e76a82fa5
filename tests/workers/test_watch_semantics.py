"""Watch details: bookmarks and server timeouts move the checkpoint, lists are paged, backoff is jittered,
and the health server answers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import aiohttp
import pytest

from ledger.testing.handle import LedgerHandle
from tests.workers.harness import FAST, caught_up, fake_cluster, lockstep, run, stored_version, wait_stored
from workers.health import HealthServer, WorkerMetrics
from workers.settings import WatchSettings, backoff_delay_s


def test_bookmarks_at_each_watch_timeout_move_a_quiet_kinds_checkpoint(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    live = ledger_factory()
    requests: list[str] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.settings = FAST.model_copy(update={"server_timeout_s": 1})
            cluster.server.advance(4)
            cluster.start()
            await lockstep(cluster.server, live.db)
            # DeviceClass saw its last event at resourceVersion 1003; only bookmarks can move it on.
            assert stored_version(live.db, "DeviceClass") < int(cluster.server.resource_version)
            await caught_up(live.db, cluster.server, ["DeviceClass", "Namespace", "ResourceSlice"])
            requests.extend(cluster.server.requests)

    run(scenario)
    watches = [r for r in requests if "/deviceclasses?" in r and "watch=True" in r]
    assert len(watches) >= 2  # the server ended the first watch after timeoutSeconds; the worker came back
    assert all("allowWatchBookmarks=True" in r and "timeoutSeconds=1" in r for r in watches)


def test_a_burst_of_watch_events_is_written_in_a_few_transactions(ledger_factory: Callable[[], LedgerHandle]) -> None:
    live = ledger_factory()
    counts: list[int] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.advance(4)
            worker = cluster.start()
            await caught_up(live.db, cluster.server)
            before = worker.sink.transactions
            played = cluster.server.advance(None)  # the rest of the history at once: 35 lines
            await wait_stored(live.db, played)
            counts.extend([sum(p.type != "BOOKMARK" for p in played), worker.sink.transactions - before,
                           worker.metrics.stored_events])

    run(scenario)
    events, transactions, stored = counts
    assert stored == events == 33
    assert transactions <= 10  # one per kind and network read, not one per event


def test_lists_are_read_page_by_page(ledger_factory: Callable[[], LedgerHandle]) -> None:
    live = ledger_factory()
    requests: list[str] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.advance(30)  # 7 pods exist: pages of 3, 3 and 1
            cluster.start()
            await caught_up(live.db, cluster.server)
            requests.extend(cluster.server.requests)

    run(scenario)
    pod_lists = [r for r in requests if r.startswith("GET /api/v1/pods?") and "watch=" not in r]
    assert len(pod_lists) == 3 and all("limit=3" in r for r in pod_lists)
    assert sum("continue=" in r for r in pod_lists) == 2


def test_backoff_follows_the_settings_with_jitter_and_retry_after_wins() -> None:
    settings = WatchSettings(error_backoffs_s=(1.0, 4.0), jitter=0.25)
    rng = random.Random(7)
    first = [backoff_delay_s(settings, 0, rng=rng) for _ in range(200)]
    later = [backoff_delay_s(settings, 9, rng=rng) for _ in range(200)]
    assert min(first) >= 0.75 and max(first) <= 1.25 and len(set(first)) > 100
    assert min(later) >= 3.0 and max(later) <= 5.0  # the last delay repeats
    assert backoff_delay_s(settings, 0, retry_after_s=30.0, rng=rng) == 30.0


@pytest.mark.parametrize("ready", [True, False])
def test_the_health_server_answers_liveness_readiness_and_metrics(ready: bool) -> None:
    async def scenario() -> None:
        metrics = WorkerMetrics()
        metrics.set_leader(True)
        metrics.observed_events("ResourceClaim", ["ADDED", "MODIFIED", "BOOKMARK"], "1042")

        async def readiness() -> bool:
            return ready

        server = HealthServer(metrics, readiness)
        port = await server.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    assert resp.status == 200
                async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                    assert resp.status == (200 if ready else 503)
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    body = await resp.text()
        finally:
            await server.stop()
        assert "dra_ledger_leader 1.0" in body
        assert 'dra_ledger_watch_events_total{kind="ResourceClaim",type="MODIFIED"} 1.0' in body
        assert 'dra_ledger_watch_resource_version{kind="ResourceClaim"} 1042.0' in body
        assert 'dra_ledger_watch_seconds_since_last_event{kind="ResourceClaim"}' in body
        assert metrics.stored_events == 2

    run(lambda: asyncio.wait_for(scenario(), 10))
