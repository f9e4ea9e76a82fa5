"""A relist is reconciled page by page: real kubernetes-asyncio pages from the fake API server, a real ledger.

The ledger first holds seed-lab up to 09:25 (six claims, seven pods); the server then holds the whole
history, in which one claim and three pods were deleted since. Listing with pages of 2 must record
what one page of 500 records, delete the missing objects only after the last page, and move the
checkpoint only then: with the last batch of deletions, even when a batch of them was retried.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

import pytest
from kubernetes_asyncio import client as k8s
from sqlalchemy import text

from ledger import services
from ledger.errors import StoreUnavailable, StreamConflict
from ledger.recorded import WatchLine
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import (
    CLUSTER,
    api_client,
    assert_same_ledger,
    insert_events_failing,
    lost_connection,
    run,
    seed_lab,
)
from workers.fake_apiserver import FakeApiServer, Fault
from workers.k8s.client import KubeSource, ListPage, WatchExpired
from workers.k8s.kinds import BY_KIND
from workers.sink import LedgerSink

KINDS = ("Namespace", "DeviceClass", "ResourceSlice", "ResourceClaim", "Pod")
SEEDED = 30
"""seed-lab lines the ledger holds before the relist (up to 09:25: nothing deleted yet)."""
OLD_VERSION = "1"
"""The ResourceClaim checkpoint stored before the relist."""


def _claim_list_checkpoint(version: str) -> services.WatchCheckpoint:
    return services.WatchCheckpoint(kind="ResourceClaim", api_version=BY_KIND["ResourceClaim"].api_version("v1"),
                                    resource_version=version)


def _seeded(handle: LedgerHandle) -> LedgerHandle:
    services.ingest(handle.db, seed_lab()[:SEEDED], cluster=CLUSTER)
    services.record_watch_batch(handle.db, [], cluster=CLUSTER, state=services.load_state(handle.db, CLUSTER),
                                checkpoint=_claim_list_checkpoint(OLD_VERSION))
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


def _live_claims(handle: LedgerHandle) -> list[str]:
    state = services.load_state(handle.db, CLUSTER)
    return sorted(k for k in state.entries if k.startswith("claim:") and not state.entries[k].get("deleted"))


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


LISTED_VERSION = "999"
"""The resourceVersion of the list that :func:`services.finish_relist` closes in the tests below."""
LISTED_AT = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)


def test_a_retried_batch_of_deletions_does_not_store_the_checkpoint_before_the_last_deletion(
        ledger_factory: Callable[[], LedgerHandle], monkeypatch: pytest.MonkeyPatch) -> None:
    # Two claims vanished, one deletion per batch. Batch 1 loses a race once (StreamConflict, retried by
    # ingest), then the database goes away during batch 2. The old checkpoint must stay: only a list (which
    # the old, expired checkpoint forces) records the second deletion. The last batch was once picked by
    # counting callbacks, and the retry of batch 1 counted as batch 2: it stored the list's checkpoint, a
    # restart watched from it, and the second claim stayed live in the ledger for ever.
    handle = _seeded(ledger_factory())
    claims = _live_claims(handle)
    state = services.load_state(handle.db, CLUSTER)
    insert_events_failing(monkeypatch, {1: StreamConflict(stream="claim:x", expected=0), 3: lost_connection()})

    with pytest.raises(StoreUnavailable):
        services.finish_relist(handle.db, claims[2:], cluster=CLUSTER, state=state,
                               checkpoint=_claim_list_checkpoint(LISTED_VERSION), observed_at=LISTED_AT,
                               source="relist:ResourceClaim", first_line=4, batch_size=1)

    monkeypatch.undo()
    assert _live_claims(handle) == claims[1:]  # the first deletion committed, the second did not
    assert _relist_origins(handle, "ResourceClaim") == [4]  # numbered from first_line, whatever the batches
    assert _claim_checkpoint(handle) == OLD_VERSION, "the checkpoint committed before the deletion it covers"


def test_a_retried_single_batch_of_deletions_still_stores_the_checkpoint(
        ledger_factory: Callable[[], LedgerHandle], monkeypatch: pytest.MonkeyPatch) -> None:
    # One claim vanished; its only batch loses a race once and is retried. Counted, the retry's callback was
    # the second, never the last (the first): the list's checkpoint was never stored.
    handle = _seeded(ledger_factory())
    claims = _live_claims(handle)
    state = services.load_state(handle.db, CLUSTER)
    insert_events_failing(monkeypatch, {1: StreamConflict(stream="claim:x", expected=0)})

    services.finish_relist(handle.db, claims[1:], cluster=CLUSTER, state=state,
                           checkpoint=_claim_list_checkpoint(LISTED_VERSION), observed_at=LISTED_AT,
                           source="relist:ResourceClaim", first_line=1, batch_size=1)

    monkeypatch.undo()
    assert _live_claims(handle) == claims[1:]
    assert _claim_checkpoint(handle) == LISTED_VERSION, "the list's checkpoint was never stored"


def test_list_items_that_are_no_objects_are_stored_as_rejected_in_their_place(
        ledger_factory: Callable[[], LedgerHandle]) -> None:
    # They were dropped without a trace; a watch line that is no object was stored as rejected all along.
    live = ledger_factory()
    namespaces = [x.object for x in seed_lab() if isinstance(x, WatchLine) and x.object.get("kind") == "Namespace"]
    assert len(namespaces) == 2
    body = {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
            "items": [namespaces[0], "garbage", 7, None, namespaces[1]]}

    async def scenario() -> None:
        async with _cluster() as (server, client):
            server.inject(Fault(action="status", status=200, kind="Namespace", verb="list", page=json.dumps(body)))
            sink = LedgerSink(live.db, cluster=CLUSTER, batch_size=50)
            source = _source(server, client, "Namespace", 500)
            listed = await sink.relisted(source, source.pages())
            assert (listed.count, listed.resource_version) == (5, "7")

    run(scenario)
    with live.engine.connect() as conn:
        rows = conn.execute(text("SELECT origin, status, error FROM observations ORDER BY origin")).all()
    assert [tuple(r) for r in rows] == [
        ("relist:Namespace:1", "recorded", None),
        ("relist:Namespace:2", "rejected", "list item: not a JSON object (found string)"),
        ("relist:Namespace:3", "rejected", "list item: not a JSON object (found number)"),
        ("relist:Namespace:4", "rejected", "list item: not a JSON object (found null)"),
        ("relist:Namespace:5", "recorded", None),
    ]
    assert len(live.events(["TeamAssigned"])) == 2  # both namespaces, on either side of the bad items
