"""A watch stream line that is no watch event is stored as a rejected observation; the watch reads on.

The fake API server sends the line between the ADDED of claim ``train-0-gpu-4fj8q`` (seed-lab line 7,
resourceVersion 1006, 09:02:01) and its allocation (line 8, 1007, 09:02:05.498), through the real
kubernetes-asyncio client. Before, a JSON line without ``type`` raised KeyError out of the watch loop and
ended the worker; an unknown type failed the kind's task; a line that is not JSON (or not UTF-8), an
``ERROR`` whose object is no Status and the other JSON lines made it back off and watch again; and none
of them was stored. A line cut by a dropped connection is still a transient fault, never a rejected line.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from ledger import services
from ledger.recorded import BrokenLine, WatchLine, read_text
from ledger.testing.handle import LedgerHandle
from tests.workers.harness import (
    CLUSTER,
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

_ADDED = json.dumps({"type": "ADDED", "object": CLAIM})

NOT_JSON: dict[str, tuple[str, str]] = {
    # name: (the line as sent, the reason stored with it: what a replay of the line says)
    "an event cut short": ('{"type": "ADDED", "object": {',
                           "invalid JSON: Expecting property name enclosed in double quotes (column 30)"),
    "garbage": ("garbage", "invalid JSON: Expecting value (column 1)"),
    "a proxy's error page": ("<html><body>502 Bad Gateway</body></html>", "invalid JSON: Expecting value (column 1)"),
    "two events on one line": (_ADDED * 2, f"invalid JSON: Extra data (column {len(_ADDED) + 1})"),
}

NOT_UTF8: dict[str, tuple[str, str]] = {
    # The lone surrogate is the byte 0xff on the wire (Fault.line); it is stored as U+FFFD.
    "bytes that are not UTF-8": ("\udcff" + _ADDED,
                                 "not UTF-8: invalid start byte at byte 0"),
}

ERRORS_WITHOUT_STATUS: dict[str, tuple[str, str]] = {
    "an ERROR whose object is no Status": (json.dumps({"type": "ERROR", "object": {"foo": 1}}),
                                           "type: ERROR without a Status: object has neither kind 'Status' nor "
                                           "an integer 'code'"),
    "an ERROR without object": (json.dumps({"type": "ERROR"}), "type: ERROR without a Status: missing field 'object'"),
    "an ERROR whose object is a string": (json.dumps({"type": "ERROR", "object": "etcd is down"}),
                                          "type: ERROR without a Status: object: not a JSON object (found string)"),
}

ALL_LINES = {**LINES, **NOT_JSON, **NOT_UTF8, **ERRORS_WITHOUT_STATUS}
REPLAYABLE = {**LINES, **NOT_JSON}
"""Lines that a replay of a recorded file rejects for the reason the live watch gives (it refuses every
ERROR line, and a recording keeps a byte that is not UTF-8 as U+FFFD)."""

BEFORE = datetime(2026, 11, 2, 9, 2, 1, tzinfo=UTC)
"""observedAt of the claim event sent just before the bad line (seed-lab line 7)."""
AFTER = datetime(2026, 11, 2, 9, 2, 5, 498000, tzinfo=UTC)
"""observedAt of the claim event sent just after it (line 8): the clock may have moved on to it."""


def _claim_watches(requests: list[str]) -> int:
    return sum(1 for r in requests if r.startswith("GET /apis/resource.k8s.io/v1/resourceclaims?") and "watch=" in r)


def _follow(live: LedgerHandle, fault: Fault) -> tuple[WorkerMetrics, int]:
    """Follow the seed lab's first four lines into ``live`` through the fake API server with ``fault``
    queued; the worker's metrics and how many watches of the claims it made. Asserts that the fault fired
    and that the worker is still running."""
    metrics: list[WorkerMetrics] = []
    watches: list[int] = []

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            cluster.server.inject(fault)
            cluster.server.advance(4)
            worker = cluster.start()
            metrics.append(worker.metrics)
            await lockstep(cluster.server, live.db)
            assert cluster.server.faults == [], "the fault fired"
            assert not worker.task.done(), "the worker stopped"
            watches.append(_claim_watches(cluster.server.requests))

    run(scenario)
    return metrics[0], watches[0]


@pytest.mark.parametrize(("line", "reason"), list(ALL_LINES.values()), ids=list(ALL_LINES))
def test_a_line_that_is_no_watch_event_is_recorded_as_rejected_and_the_watch_reads_on_from_the_next_line(
        ledger_factory: Callable[[], LedgerHandle], line: str, reason: str) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    metrics, watches = _follow(live, Fault(action="line", kind="ResourceClaim", verb="watch", after_events=1,
                                           line=line))
    # Both neighbours became ledger events, once each, and so did everything else: the ledger is a clean
    # replay's (same events, no duplicate, none missing).
    claim = [e.type for e in live.events() if e.stream == "claim:897a4b4b-03a9-30aa-6df0-70dbf8841cb8"]
    assert claim[:2] == ["ClaimCreated", "ClaimAllocated"]
    assert_same_ledger(live, clean)
    with live.engine.connect() as conn:
        rejected = conn.execute(text(
            "SELECT origin, error, body, observed_at, watch_type FROM observations WHERE status = 'rejected'")).all()
        neighbours = conn.execute(text(
            "SELECT resource_version, watch_type, status FROM observations WHERE kind = 'ResourceClaim' "
            "AND resource_version IN ('1006', '1007') ORDER BY resource_version")).all()
    assert [tuple(r) for r in neighbours] == [("1006", "ADDED", "recorded"), ("1007", "MODIFIED", "recorded")]
    assert len(rejected) == 1
    origin, error, body, observed_at, watch_type = rejected[0]
    assert origin.startswith("watch:ResourceClaim:")
    assert error == reason
    # The raw text, kept whole (a byte that is not UTF-8 kept as U+FFFD).
    assert body == line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    assert BEFORE <= observed_at <= AFTER  # its receive time
    assert watch_type is None
    assert metric_sample(metrics, "dra_ledger_watch_rejected_total", kind="ResourceClaim") == 1
    # Read on from the next line: the first watch of the claims never ended (no backoff, no watch again).
    assert watches == 1
    assert metric_sample(metrics, "dra_ledger_watch_restarts_total", kind="ResourceClaim") == 0


_STATUS_500 = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "etcd leader changed", "reason": "InternalError", "code": 500}

TRANSIENT: dict[str, tuple[Fault, str]] = {
    # name: (the fault, the reason the watch of the claims starts again)
    # The server writes half of the allocation's line (1007) and dies: no newline ever ends it. That is a
    # broken connection, not a broken line: watch again from 1006 and receive the whole line then.
    "a line cut by a dropped connection": (
        Fault(action="drop", kind="ResourceClaim", verb="watch", after_events=1, partial=True), "connection"),
    # An ERROR that carries a Status is the server's word on the watch, not a broken line.
    "an in-stream ERROR Status 500": (
        Fault(action="line", kind="ResourceClaim", verb="watch", after_events=1,
              line=json.dumps({"type": "ERROR", "object": _STATUS_500})), "http-500"),
    "an in-stream ERROR Status without a code": (
        Fault(action="line", kind="ResourceClaim", verb="watch", after_events=1,
              line=json.dumps({"type": "ERROR", "object": {**_STATUS_500, "code": None}})), "http-500"),
    # A proxy answers the watch with 200 and its login page: no watch stream at all. Read line by line, its
    # lines were each stored as rejected and, the page ending at once, watched again and stored again.
    "a proxy's HTML page in place of the watch": (
        Fault(action="status", status=200, kind="ResourceClaim", verb="watch",
              page="<html>\n<body>Sign in to continue</body>\n</html>\n"), "connection"),
}

NOT_A_LIST = {
    # JSON, but not shaped as a List: the worker ended in an AttributeError or TypeError traceback, or stored a
    # mapping as its resourceVersion checkpoint.
    "metadata a number": '{"kind": "List", "metadata": 5, "items": []}',
    "items a number": '{"kind": "List", "metadata": {"resourceVersion": "1"}, "items": 5}',
    "resourceVersion an object": '{"kind": "List", "metadata": {"resourceVersion": {"a": 1}}, "items": []}',
}


@pytest.mark.parametrize("body", list(NOT_A_LIST.values()), ids=list(NOT_A_LIST))
def test_a_list_answer_that_is_json_but_no_list_is_a_transient_fault(ledger_factory: Callable[[], LedgerHandle],
                                                                     body: str) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    _follow(live, Fault(action="status", status=200, kind="ResourceClaim", verb="list", page=body))

    assert_same_ledger(live, clean)  # listed again after the backoff, and followed as if nothing had happened
    assert services.load_watch_checkpoints(live.db, CLUSTER)["ResourceClaim"].resource_version.isdigit()


@pytest.mark.parametrize(("fault", "restart_reason"), list(TRANSIENT.values()), ids=list(TRANSIENT))
def test_a_broken_connection_or_an_error_status_is_a_transient_fault_and_no_rejected_line(
        ledger_factory: Callable[[], LedgerHandle], fault: Fault, restart_reason: str) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    metrics, watches = _follow(live, fault)
    assert_same_ledger(live, clean)
    with live.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM observations WHERE status = 'rejected'")).scalar_one() == 0
    assert metric_sample(metrics, "dra_ledger_watch_rejected_total") == 0
    assert metric_sample(metrics, "dra_ledger_watch_restarts_total", kind="ResourceClaim",
                         reason=restart_reason) == 1
    assert watches >= 2  # watched again (from 1006, the last stored resourceVersion)


@pytest.mark.parametrize(("line", "reason"), list(REPLAYABLE.values()), ids=list(REPLAYABLE))
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
