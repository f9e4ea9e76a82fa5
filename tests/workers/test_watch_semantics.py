"""Watch details: bookmarks and server timeouts move the checkpoint, lists are paged, backoff is jittered,
a projection that cannot apply a batch stops neither the watches nor the worker, and the health server answers."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from sqlalchemy.exc import IntegrityError

from ledger import services
from ledger.projections import runner
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import (
    FAST,
    SEED_LAB,
    assert_same_ledger,
    caught_up,
    eventually,
    fake_cluster,
    lockstep,
    run,
    stored_version,
    wait_stored,
)
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


def test_a_batch_the_projections_cannot_apply_is_logged_and_retried_while_the_watches_go_on(
        ledger_factory: Callable[[], LedgerHandle], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # A bad event stops the projections at their checkpoint and the next tick retries. The catch-up loop runs
    # in run_worker's TaskGroup beside the watches, and it let anything but a database outage out: here a
    # constraint violation, which cancelled every watch and ended the worker (restarted, it would meet the
    # same event again as soon as it leads, and record nothing meanwhile).
    live, clean = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    real_apply_batch = runner._apply_batch
    applied: list[int] = []

    def apply_batch(*args: Any, **kwargs: Any) -> None:
        applied.append(len(applied) + 1)
        if len(applied) == 1:
            raise IntegrityError("INSERT INTO device_allocations ...", {},
                                 Exception('duplicate key value violates unique constraint "device_allocations_pkey"'))
        real_apply_batch(*args, **kwargs)

    monkeypatch.setattr(runner, "_apply_batch", apply_batch)
    failures: list[float | None] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.advance(4)
            worker = cluster.start(elect=False)
            await lockstep(cluster.server, live.db)  # the watches record the whole history meanwhile
            await eventually(lambda: not any(services.projection_lag(live.db).values()),
                             "the projections caught up after the failed batch")
            assert not worker.task.done(), "the worker stopped"
            failures.append(worker.metrics.registry.get_sample_value(
                "dra_ledger_projection_catch_up_failures_total", {"reason": "projection"}))

    with caplog.at_level(logging.WARNING, logger="workers.sink"):
        run(scenario)
    assert failures == [1.0]
    errors = [r for r in caplog.records if r.name == "workers.sink" and r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "projections stopped at global position 0" in errors[0].getMessage()
    assert "device_allocations_pkey" in errors[0].getMessage()
    assert getattr(errors[0], "position", None) == 0
    assert_same_ledger(live, clean)


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
        metrics.catch_up_failed("projection")

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
        assert 'dra_ledger_projection_catch_up_failures_total{reason="projection"} 1.0' in body
        assert metrics.stored_events == 2

    run(lambda: asyncio.wait_for(scenario(), 10))
