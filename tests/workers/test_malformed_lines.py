"""A watch stream line that is JSON but no watch event is stored as a rejected observation; the watch goes on.

The fake API server sends the line between the ADDED of claim ``train-0-gpu-4fj8q`` (seed-lab line 7,
resourceVersion 1006, 09:02:01) and its allocation (line 8, 1007, 09:02:05.498), through the real
kubernetes-asyncio client. Before, a line without ``type`` raised KeyError out of the watch loop and
ended the worker; an unknown type failed the kind's task; the others made it watch again; and none of
them was stored.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from ledger.recorded import BrokenLine, WatchLine, read_text
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import (
    SEED_LAB,
    ClaimSource,
    assert_same_ledger,
    fake_cluster,
    lockstep,
    metric_sample,
    run,
    seed_lab,
)
from workers.fake_apiserver import Fault
from workers.health import WorkerMetrics
from workers.k8s.client import MalformedEvent, WatchEvent
from workers.record import RecordSink

CLAIM = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"namespace": "ml-train", "name": "ghost", "uid": "0e5c2a8e-0000-4000-8000-00000000dead",
                      "resourceVersion": "1006"}}

LINES: dict[str, tuple[str, str]] = {
    # name: (the line as sent, the reason stored with it)
    "no type": (json.dumps({"object": CLAIM}), "missing field 'type'"),
    "an unknown type": (json.dumps({"type": "UPDATED", "object": CLAIM}),
                        "type: 'UPDATED' is not ADDED, MODIFIED, DELETED or BOOKMARK"),
    "no object": (json.dumps({"type": "MODIFIED"}), "missing field 'object'"),
    "an object that is a string": (json.dumps({"type": "ADDED", "object": "train-0-gpu-4fj8q"}),
                                   "object: not a JSON object (found string)"),
    "a JSON array": (json.dumps(["ADDED", CLAIM]), "not a JSON object (found array)"),
}

BEFORE = datetime(2026, 11, 2, 9, 2, 1, tzinfo=UTC)
"""observedAt of the claim event sent just before the bad line (seed-lab line 7)."""
AFTER = datetime(2026, 11, 2, 9, 2, 5, 498000, tzinfo=UTC)
"""observedAt of the claim event sent just after it (line 8): the clock may have moved on to it."""


@pytest.mark.parametrize(("line", "reason"), list(LINES.values()), ids=list(LINES))
def test_a_json_line_that_is_no_watch_event_is_recorded_as_rejected_and_the_events_around_it_are_kept(
        ledger_factory: Callable[[], LedgerHandle], line: str, reason: str) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    metrics: list[WorkerMetrics] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.inject(Fault(action="line", kind="ResourceClaim", verb="watch", after_events=1, line=line))
            cluster.server.advance(4)
            worker = cluster.start()
            metrics.append(worker.metrics)
            await lockstep(cluster.server, live.db)
            assert cluster.server.faults == [], "the bad line was sent"
            assert not worker.task.done(), "the worker stopped"

    run(scenario)
    # Both neighbours became ledger events, and so did everything else: the ledger is a clean replay's.
    claim = [e.type for e in live.events() if e.stream == "claim:897a4b4b-03a9-30aa-6df0-70dbf8841cb8"]
    assert claim[:2] == ["ClaimCreated", "ClaimAllocated"]
    assert_same_ledger(live, clean)
    with live.engine.connect() as conn:
        rejected = conn.execute(text(
            "SELECT origin, error, body, observed_at, watch_type FROM observations WHERE status = 'rejected'")).all()
    assert len(rejected) == 1
    origin, error, body, observed_at, watch_type = rejected[0]
    assert origin.startswith("watch:ResourceClaim:")
    assert error == reason
    assert body == line  # the raw text, kept whole
    assert BEFORE <= observed_at <= AFTER  # its receive time
    assert watch_type is None
    assert metric_sample(metrics[0], "dra_ledger_watch_rejected_total", kind="ResourceClaim") == 1
    assert metric_sample(metrics[0], "dra_ledger_watch_restarts_total", kind="ResourceClaim", reason="failed") == 0
    assert metric_sample(metrics[0], "dra_ledger_watch_restarts_total", kind="ResourceClaim", reason="connection") == 0


@pytest.mark.parametrize(("line", "reason"), list(LINES.values()), ids=list(LINES))
def test_record_writes_such_a_line_as_received_and_its_replay_rejects_it_for_the_same_reason(
        line: str, reason: str) -> None:
    added, allocated = (x for x in seed_lab()[6:8] if isinstance(x, WatchLine))
    assert added.observed_at == BEFORE and allocated.observed_at == AFTER
    out = io.StringIO()
    burst = [WatchEvent(type=added.type, object=added.object, resource_version="1006", received_at=BEFORE),
             MalformedEvent(text=line, reason=reason, received_at=BEFORE),
             WatchEvent(type=allocated.type, object=allocated.object, resource_version="1007", received_at=AFTER)]
    asyncio.run(RecordSink(out).observed(ClaimSource(), burst, "1007"))  # type: ignore[arg-type]  # a stand-in
    assert out.getvalue().splitlines()[1] == line
    read = list(read_text(out.getvalue(), source="recorded.jsonl"))
    assert [type(x) for x in read] == [WatchLine, BrokenLine, WatchLine]
    assert [x.digest for x in read if isinstance(x, WatchLine)] == [added.digest, allocated.digest]
    assert isinstance(read[1], BrokenLine) and read[1].reason == reason and read[1].line == 2
