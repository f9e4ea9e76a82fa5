"""A relist is reconciled page by page: real kubernetes-asyncio pages from the fake API server, a real ledger.

The ledger first holds seed-lab up to 09:25 (six claims, seven pods); the server then holds the whole
history, in which one claim and three pods were deleted since. Listing with pages of 2 must record
what one page of 500 records, delete the missing objects only after the last page, and move the
checkpoint only then.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from kubernetes_asyncio import client as k8s
from sqlalchemy import text

from ledger import services
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import CLUSTER, api_client, assert_same_ledger, run, seed_lab
from workers.fake_apiserver import FakeApiServer
from workers.k8s.client import KubeSource, ListPage, WatchExpired
from workers.k8s.kinds import BY_KIND
from workers.sink import LedgerSink

KINDS = ("Namespace", "DeviceClass", "ResourceSlice", "ResourceClaim", "Pod")
SEEDED = 30
"""seed-lab lines the ledger holds before the relist (up to 09:25: nothing deleted yet)."""
OLD_VERSION = "1"
"""The ResourceClaim checkpoint stored before the relist."""


def _seeded(handle: LedgerHandle) -> LedgerHandle:
    services.ingest(handle.db, seed_lab()[:SEEDED], cluster=CLUSTER)
    checkpoint = services.WatchCheckpoint(kind="ResourceClaim", api_version=BY_KIND["ResourceClaim"].api_version("v1"),
                                          resource_version=OLD_VERSION)
    services.record_watch_batch(handle.db, [], cluster=CLUSTER, state=services.load_state(handle.db, CLUSTER),
                                checkpoint=checkpoint)
    return handle


@contextlib.asynccontextmanager
async def _cluster() -> AsyncIterator[tuple[FakeApiServer, k8s.ApiClient]]:
    """The fake server with the whole of seed-lab played, and a real client of it (closed on exit)."""
    async with FakeApiServer(seed_lab()) as server:
        server.advance(None)
        client = api_client(server.url)
        try:
            yield server, client
        finally:
            await client.close()


def _source(server: FakeApiServer, client: k8s.ApiClient, kind: str, page_size: int) -> KubeSource:
    return KubeSource(client, BY_KIND[kind], "v1", clock=server.now, page_size=page_size)


async def _relist(server: FakeApiServer, client: k8s.ApiClient, handle: LedgerHandle, *, page_size: int,
                  kinds: Sequence[str] = KINDS) -> None:
    sink = LedgerSink(handle.db, cluster=CLUSTER, batch_size=50)
    for kind in kinds:
        source = _source(server, client, kind, page_size)
        await sink.relisted(source, source.pages())


def _claim_checkpoint(handle: LedgerHandle) -> str | None:
    stored = services.load_watch_checkpoints(handle.db, CLUSTER).get("ResourceClaim")
    return stored.resource_version if stored else None


def _relist_origins(handle: LedgerHandle, kind: str) -> list[int]:
    with handle.engine.connect() as conn:
        origins = conn.execute(text("SELECT origin FROM observations WHERE origin LIKE :p"),
                               {"p": f"relist:{kind}:%"}).scalars().all()
    return sorted(int(o.rsplit(":", 1)[1]) for o in origins)


def test_a_list_of_many_pages_records_what_one_page_records(ledger_factory: Callable[[], LedgerHandle]) -> None:
    paged, whole = _seeded(ledger_factory()), _seeded(ledger_factory())
    requests: list[str] = []

    async def scenario() -> None:
        async with _cluster() as (server, client):
            await _relist(server, client, whole, page_size=500)
            await _relist(server, client, paged, page_size=2)
            requests.extend(server.requests)

    run(scenario)
    assert_same_ledger(paged, whole)
    # Not vacuous: the pages of 2 were continued, and the relist deleted and changed things.
    assert sum("/resourceclaims?" in r and "continue=" in r for r in requests) == 2  # 5 claims: 3 pages
    assert len(paged.events(["ClaimDeleted"])) == 1
    assert len(paged.events(["PodDeleted"])) == 3
    # Origins keep counting across pages: 5 listed claims, then the deleted one.
    assert _relist_origins(paged, "ResourceClaim") == _relist_origins(whole, "ResourceClaim") == [1, 2, 3, 4, 5, 6]


def test_a_missing_object_is_deleted_and_the_checkpoint_stored_only_after_the_last_page(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    live = _seeded(ledger_factory())
    after_each_page: list[tuple[int, int, str | None]] = []
    listed_version: list[str] = []

    async def watched(pages: AsyncIterator[ListPage]) -> AsyncIterator[ListPage]:
        async for page in pages:
            yield page
            # The sink asks for the next page only once this one is written.
            after_each_page.append((len(_relist_origins(live, "ResourceClaim")), len(live.events(["ClaimDeleted"])),
                                    _claim_checkpoint(live)))

    async def scenario() -> None:
        async with _cluster() as (server, client):
            listed_version.append(server.resource_version)
            source = _source(server, client, "ResourceClaim", 2)
            listed = await LedgerSink(live.db, cluster=CLUSTER).relisted(source, watched(source.pages()))
            assert (listed.count, listed.resource_version) == (5, server.resource_version)

    run(scenario)
    # Each page was recorded as it came; nothing was deleted and the old checkpoint stayed until the end.
    assert after_each_page == [(2, 0, OLD_VERSION), (4, 0, OLD_VERSION), (5, 0, OLD_VERSION)]
    assert len(live.events(["ClaimDeleted"])) == 1
    assert _claim_checkpoint(live) == listed_version[0] != OLD_VERSION


def test_a_list_cut_by_an_expired_continue_token_keeps_the_checkpoint_and_a_fresh_list_completes_it(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    cut, whole = _seeded(ledger_factory()), _seeded(ledger_factory())
    pages_before_410: list[int] = []

    async def scenario() -> None:
        async with _cluster() as (server, client):
            await _relist(server, client, whole, page_size=500, kinds=["ResourceClaim"])

            async def compacted_after_first(pages: AsyncIterator[ListPage]) -> AsyncIterator[ListPage]:
                async for page in pages:
                    yield page
                    pages_before_410.append(page.offset)
                    server.expire()  # the continue token of the next page answers 410

            source = _source(server, client, "ResourceClaim", 2)
            with pytest.raises(WatchExpired):
                await LedgerSink(cut.db, cluster=CLUSTER).relisted(source, compacted_after_first(source.pages()))
            assert pages_before_410 == [0]
            assert _claim_checkpoint(cut) == OLD_VERSION
            assert cut.events(["ClaimDeleted"]) == []
            # The worker lists again from the start: the first page is recorded twice, which adds nothing.
            await _relist(server, client, cut, page_size=2, kinds=["ResourceClaim"])
            assert _claim_checkpoint(cut) == _claim_checkpoint(whole) == server.resource_version

    run(scenario)
    assert_same_ledger(cut, whole)
