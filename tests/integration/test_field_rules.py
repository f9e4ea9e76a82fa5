"""DESIGN §11 rules on hand-made histories through a real database: what the read models say."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger import services
from ledger.errors import StreamConflict
from ledger.recorded import read_history
from ledger.store import postgres as pg
from ledger.testing.handle import LedgerHandle
from ledger.translator.translate import Observation, translate
from ledger.types import GlobalPosition
from tests.factories import at, claim, dig, gpu, history, namespace, pod, resource_slice, uid


def _held(body: Any) -> dict[str, list[str]]:
    return {d["device"]: [a["claim"] for a in d["allocations"]] for d in body["devices"] if d["allocations"]}


def test_a_deletion_timestamp_keeps_the_device_held_and_billed_until_the_claim_is_gone(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    cid, sid = uid("claim"), uid("slice")
    devices = resource_slice(name="s", slice_uid=sid, devices=[gpu("gpu-0")])
    ledger.replay(history(tmp_path / "h.jsonl", [
        ("ADDED", namespace("ml", "vision"), 0),
        ("ADDED", devices, 0),
        ("ADDED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=10), 10),
        ("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=10, deletion=20), 20),
        ("DELETED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=10, deletion=20), 100),
    ]))
    assert _held(ledger.occupancy(at(99))) == {"gpu-0": ["c"]}
    assert _held(ledger.occupancy(at(100))) == {}
    usage: Any = ledger.usage(at(0), at(120))
    # Held from minute 10 to minute 100: 1.5 device-hours, not 10 minutes up to the deletionTimestamp.
    assert [(r["team"], r["deviceHours"]) for r in usage["rows"]] == [("vision", 1.5)]


def test_a_device_leaving_its_slice_while_allocated_is_held_off_slice(ledger: LedgerHandle, tmp_path: Path) -> None:
    cid, sid = uid("claim"), uid("slice")
    ledger.replay(history(tmp_path / "h.jsonl", [
        ("ADDED", resource_slice(name="s", slice_uid=sid, devices=[gpu("gpu-0"), gpu("gpu-1")]), 0),
        ("ADDED", claim(name="c", claim_uid=cid, results=["gpu-1"], allocated_at=5), 5),
        ("MODIFIED", resource_slice(name="s", slice_uid=sid, devices=[gpu("gpu-0")]), 30),
    ]))
    body: Any = ledger.occupancy(at(31))
    assert body["totals"] == {"devices": 2, "allocated": 1, "free": 1, "shared": 0}
    off = [d for d in body["devices"] if d["offSlice"]]
    assert [d["device"] for d in off] == ["gpu-1"]


def test_two_allocations_of_one_device_are_both_kept_flagged_and_split(ledger: LedgerHandle, tmp_path: Path) -> None:
    a, b = uid("claim"), uid("claim")
    ledger.replay(history(tmp_path / "h.jsonl", [
        ("ADDED", namespace("team-a", "alpha"), 0),
        ("ADDED", namespace("team-b", "beta"), 0),
        ("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0),
        ("ADDED", claim(name="a", namespace="team-a", claim_uid=a, results=["gpu-0"], allocated_at=0), 0),
        ("ADDED", claim(name="b", namespace="team-b", claim_uid=b, results=["gpu-0"], allocated_at=30), 30),
    ]))
    body: Any = ledger.occupancy(at(40))
    allocations = body["devices"][0]["allocations"]
    assert [(x["claim"], x["conflict"]) for x in allocations] == [("a", True), ("b", True)]
    assert body["totals"]["allocated"] == 1 and body["totals"]["devices"] == 1
    usage: Any = ledger.usage(at(0), at(60))
    # Minutes 0-30 alpha alone (0.5 h); minutes 30-60 split between alpha and beta (0.25 h each).
    assert {r["team"]: r["deviceHours"] for r in usage["rows"]} == {"alpha": 0.75, "beta": 0.25}


def test_admin_access_is_shown_but_neither_occupies_nor_bills(ledger: LedgerHandle, tmp_path: Path) -> None:
    cid = uid("claim")
    admin = claim(name="monitor", claim_uid=cid, results=["gpu-0"], allocated_at=0)
    results = dig(admin, "status", "allocation", "devices")["results"]
    assert isinstance(results, list) and isinstance(results[0], dict)
    results[0]["adminAccess"] = True
    ledger.replay(history(tmp_path / "h.jsonl", [
        ("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0), ("ADDED", admin, 0)]))
    body: Any = ledger.occupancy(at(10))
    assert body["totals"]["allocated"] == 0 and body["totals"]["free"] == 1
    assert body["devices"][0]["allocations"][0]["adminAccess"] is True
    usage: Any = ledger.usage(at(0), at(60))
    assert usage["rows"] == []


def test_a_relabel_moves_attribution_from_that_moment_only(ledger: LedgerHandle, tmp_path: Path) -> None:
    cid = uid("claim")
    relabelled = namespace("ml", "nlp")
    ledger.replay(history(tmp_path / "h.jsonl", [
        ("ADDED", namespace("ml", "vision"), 0),
        ("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0),
        ("ADDED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=0), 0),
        ("MODIFIED", relabelled, 45),
    ]))
    usage: Any = ledger.usage(at(0), at(60))
    assert {r["team"]: r["deviceHours"] for r in usage["rows"]} == {"vision": 0.75, "nlp": 0.25}


def test_a_flapping_reserved_for_does_not_multiply_device_hours(ledger: LedgerHandle, tmp_path: Path) -> None:
    cid, p = uid("claim"), ("p", uid("pod"))
    events: list[tuple[str, Any, float]] = [
        ("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0),
        ("ADDED", pod(name="p", pod_uid=p[1], claim_name="c"), 0),
    ]
    for minute in range(0, 60, 2):
        events.append(("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=0, reserved=[p]),
                       minute))
        events.append(("MODIFIED", claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=0), minute + 1))
    ledger.replay(history(tmp_path / "h.jsonl", events))
    usage: Any = ledger.usage(at(0), at(60))
    assert [r["deviceHours"] for r in usage["rows"]] == [1.0]
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM device_allocations")).scalar_one() == 1


def test_non_pod_consumers_are_holders_of_their_own_kind(ledger: LedgerHandle, tmp_path: Path) -> None:
    cid = uid("claim")
    obj = claim(name="c", claim_uid=cid, results=["gpu-0"], allocated_at=0)
    dig(obj, "status")["reservedFor"] = [{"apiGroup": "batch.example.com", "resource": "trainjobs",
                                          "name": "tj", "uid": uid("tj")}]
    ledger.replay(history(tmp_path / "h.jsonl", [("ADDED", resource_slice(name="s", devices=[gpu("gpu-0")]), 0),
                                                  ("ADDED", obj, 0)]))
    body: Any = ledger.occupancy(at(5))
    assert body["devices"][0]["allocations"][0]["consumers"] == ["tj"]
    idle: Any = ledger.idle_claims(at(120))
    assert idle["claims"] == []


def test_concurrent_appends_to_one_stream_get_exactly_one_stream_conflict(ledger: LedgerHandle,
                                                                         tmp_path: Path) -> None:
    cid = uid("claim")
    ledger.replay(history(tmp_path / "base.jsonl", [("ADDED", claim(name="c", claim_uid=cid), 0)]))
    states = [ledger.db.load_state("default"), ledger.db.load_state("default")]
    # Each writer's events are translated before its append, against a state read at position 1 (as an event
    # store's append_events(stream, expected=1, events) is called): the stream's unique position decides. (An
    # append that translates under the lock loads a state another writer moved on again first: test_two_writers.)
    translated = [translate(ledger.db.load_state("default"), Observation(
        type="MODIFIED", object=claim(name="c", claim_uid=cid, results=[f"gpu-{i}"], allocated_at=1),
        observed_at=at(1 + i), recorded_at=at(1 + i), digest=f"writer-{i}")) for i in range(2)]
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def append(i: int) -> None:
        barrier.wait()
        try:
            with ledger.db.append("default", states[i]) as batch:
                batch.events.extend(translated[i])
            outcomes.append("ok")
        except StreamConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=append, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(outcomes) == ["conflict", "ok"]
    with ledger.engine.connect() as conn:
        positions = conn.execute(text("SELECT stream_position FROM events WHERE stream = :s ORDER BY 1"),
                                 {"s": f"claim:{cid}"}).scalars().all()
    assert positions == [1, 2]


def test_the_service_retries_a_lost_race_by_re_reading_the_stream(ledger: LedgerHandle, tmp_path: Path) -> None:
    cid = uid("claim")
    ledger.replay(history(tmp_path / "base.jsonl", [("ADDED", claim(name="c", claim_uid=cid), 0)]))
    files = [history(tmp_path / f"w{i}.jsonl", [("MODIFIED", claim(name="c", claim_uid=cid, results=[f"gpu-{i}"],
                                                                   allocated_at=1), 1 + i)]) for i in range(2)]
    states = [ledger.db.load_state("default"), ledger.db.load_state("default")]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def write(i: int) -> None:
        barrier.wait()
        try:
            services.ingest(ledger.db, read_history(files[i]), cluster="default", state=states[i])
        except StreamConflict as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    with ledger.engine.connect() as conn:
        types_ = conn.execute(text("SELECT type FROM events WHERE stream = :s ORDER BY stream_position"),
                              {"s": f"claim:{cid}"}).scalars().all()
    # Whichever writer lost re-read the claim and recorded its change on top: one allocation replaced another.
    assert types_ == ["ClaimCreated", "ClaimAllocated", "ClaimDeallocated", "ClaimAllocated"]


@pytest.mark.parametrize("writers", [4])
def test_a_reader_following_global_positions_never_skips_a_committed_event(ledger: LedgerHandle, tmp_path: Path,
                                                                           writers: int) -> None:
    files = [history(tmp_path / f"w{i}.jsonl", [("ADDED", claim(name=f"c{i}-{n}", claim_uid=uid("claim")), n)
                                               for n in range(40)]) for i in range(writers)]
    seen: list[int] = []
    done = threading.Event()

    def follow() -> None:
        after = 0
        while True:
            finished = done.is_set()
            with ledger.engine.connect() as conn:
                batch = pg.read_all(conn, after=GlobalPosition(after), limit=7)
            seen.extend(e.global_position for e in batch)
            if batch:
                after = batch[-1].global_position
            elif finished:
                return

    def write(i: int) -> None:
        services.ingest(ledger.db, read_history(files[i]), cluster=f"c{i}", batch_size=3)

    reader = threading.Thread(target=follow)
    reader.start()
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done.set()
    reader.join()
    with ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT global_position FROM events ORDER BY 1")).scalars().all()
    assert len(stored) == writers * 40
    assert seen == list(stored)  # every committed event, in order, none skipped
