"""``record`` writes the live streams in the recorded format; replaying the file gives the same ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from ledger.testing.handle import LedgerHandle
from tests.workers.harness import FAST, SEED_LAB, api_client, assert_same_ledger, eventually, run, seed_lab
from workers.fake_apiserver import FakeApiServer, Fault
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
