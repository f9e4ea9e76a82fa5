"""``record`` writes the live streams in the recorded format; replaying the file gives the same ledger."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ledger.recorded import WatchLine
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import (
    FAST,
    SEED_LAB,
    ClaimSource,
    api_client,
    assert_same_ledger,
    eventually,
    run,
    seed_lab,
)
from workers.fake_apiserver import FakeApiServer, Fault
from workers.k8s.client import ListPage, WatchExpired
from workers.main import run_worker
from workers.record import RecordSink


def test_record_then_replay_round_trips_to_the_same_ledger(ledger_factory: Callable[[], LedgerHandle],
                                                           tmp_path: Path) -> None:
    clean, replayed = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    recording = tmp_path / "recorded.jsonl"

    async def scenario() -> None:
        async with FakeApiServer(seed_lab()) as server:
            # A 410 in the middle: the recorder lists again and must not lose or invent anything.
            server.inject(Fault(action="expire", kind="ResourceClaim", verb="watch", after_events=3))
            server.advance(4)
            client = api_client(server.url)
            with recording.open("w", encoding="utf-8") as out:
                sink = RecordSink(out)
                stop = asyncio.Event()
                task = asyncio.ensure_future(run_worker(api_client=client, sink=sink, settings=FAST, stop=stop,
                                                        clock=server.now, elect=False))
                try:
                    while server.peek() is not None:
                        for item in server.advance(1):
                            if item.type != "BOOKMARK":
                                await eventually(
                                    lambda item=item: int(sink.resource_versions.get(item.kind, "0"))  # type: ignore[misc]
                                    >= int(item.resource_version), f"{item.kind} {item.name} recorded")
                    assert server.faults == []
                finally:
                    stop.set()
                    await asyncio.wait_for(task, 10)
                    await client.close()

    run(scenario)
    report = replayed.replay(recording)
    assert report.rejected == []
    assert_same_ledger(replayed, clean)


def test_an_object_written_by_a_list_cut_by_a_410_is_deleted_when_the_next_list_lacks_it() -> None:
    # The first list writes page 1 (claim X, new to the recorder) as ADDED, then its continue token expires
    # (410); X is deleted; the list made again lacks X. The file must carry a DELETED line for X, as the
    # ledger worker records one (its pages commit as they come, and finish_relist deletes what the state
    # holds). The cut list's objects were kept only until the list ended, so X was in neither the objects
    # seen nor the new list: replaying the file left X live for ever.
    claim = next(x.object for x in seed_lab() if isinstance(x, WatchLine) and x.object.get("kind") == "ResourceClaim")
    at = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)
    out = io.StringIO()
    sink = RecordSink(out)

    async def cut_list() -> AsyncIterator[ListPage]:
        yield ListPage(items=[claim], offset=0, resource_version="10", received_at=at, last=False)
        raise WatchExpired("list resourceclaims: HTTP 410 the continue token has expired", status=410)

    async def list_without_x() -> AsyncIterator[ListPage]:
        yield ListPage(items=[], offset=0, resource_version="20", received_at=at, last=True)

    async def scenario() -> None:
        with pytest.raises(WatchExpired):
            await sink.relisted(ClaimSource(), cut_list())  # type: ignore[arg-type]  # a stand-in source
        listed = await sink.relisted(ClaimSource(), list_without_x())  # type: ignore[arg-type]
        assert (listed.count, listed.resource_version) == (0, "20")

    asyncio.run(scenario())
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [x["type"] for x in written] == ["ADDED", "DELETED"], "the claim the cut list wrote is never deleted"
    assert written[1]["object"] == claim


def test_a_list_item_that_is_no_object_is_written_as_listed_and_replay_rejects_that_line_alone(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # The ledger's worker stores such an item as rejected in its place; the recording keeps it for replay to do so.
    claims = [x.object for x in seed_lab() if isinstance(x, WatchLine) and x.object.get("kind") == "ResourceClaim"
              and x.type == "ADDED"][:2]
    at = datetime(2026, 11, 2, 10, 40, tzinfo=UTC)
    recording = tmp_path / "recorded.jsonl"

    async def one_list() -> AsyncIterator[ListPage]:
        yield ListPage(items=[claims[0], "garbage", claims[1]], offset=0, resource_version="10", received_at=at,
                       last=True)

    async def scenario() -> None:
        with recording.open("w", encoding="utf-8") as out:
            listed = await RecordSink(out).relisted(ClaimSource(), one_list())  # type: ignore[arg-type]
        assert listed.count == 2

    asyncio.run(scenario())
    written = [json.loads(line) for line in recording.read_text(encoding="utf-8").splitlines()]
    assert [(x["type"], x["object"]) for x in written] == [("ADDED", claims[0]), ("ADDED", "garbage"),
                                                            ("ADDED", claims[1])]
    report = ledger.replay(recording)
    assert [(r.origin, r.reason) for r in report.rejected] == [(f"{recording}:2", "object: not a JSON object (found "
                                                                                  "string)")]
    assert report.recorded == 2  # the claims on either side of it
