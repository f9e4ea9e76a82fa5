"""A rebuild gives, row for row, what live catch-up and one-event-at-a-time application give.

Three ways rebuild the read models (``ledger.projections.runner.rebuild``): built once from the whole
history (the default, ``ledger.projections.whole_history``), the set-based batch path
(``whole_history=False``, tiny batches so boundaries fall everywhere) and the per-event reference
(``set_based=False``). Each must reproduce the rows live catch-up made, on the recorded histories, on the
real fixtures, on a simulated fleet, and on hand-made events that the translator would rarely emit
(out-of-order times, duplicates, events before a claim exists, conflicts, relabels that split intervals).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DataError

from ledger.events import (
    ClaimAllocated,
    ClaimCreated,
    ClaimDeallocated,
    ClaimDeleted,
    ClaimDeletionRequested,
    ClaimReserved,
    ClaimUnreserved,
    DeviceClassChanged,
    DeviceClassDefined,
    DeviceClassDeleted,
    DevicePublished,
    DeviceTaintRuleChanged,
    DeviceTaintRuleDefined,
    DeviceTaintRuleDeleted,
    DeviceUpdated,
    DeviceWithdrawn,
    Event,
    EventSource,
    NewEvent,
    PodDeleted,
    PodPhaseChanged,
    TeamAssigned,
)
from ledger.projections import runner, whole_history
from ledger.projections.models import ALL
from ledger.simulate import FleetSpec, write_history
from ledger.store.postgres import insert_events, lock_appends
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject, JSONValue, StreamId, StreamPosition
from tests.factories import at
from tests.paths import HISTORIES, REAL

FLEET = FleetSpec(nodes=6, gpus_per_node=4, hours=6, seed=11, mig_node_fraction=0.5, restarts_per_node_day=6.0,
                  relabels=2, idle_fraction=0.1, pending_fraction=0.05)
"""A small simulated fleet with MIG, driver restarts, relabels, idle and pending claims."""


def _assert_every_rebuild_gives_the_live_rows(ledger: LedgerHandle) -> dict[str, list[tuple[object, ...]]]:
    live = ledger.snapshot()  # caught up by the set-based batch path, 2000 events per batch
    events = len(live["events"])
    assert runner.rebuild(ledger.engine) == events
    assert runner.lag(ledger.engine) == {p.name: 0 for p in ALL}  # checkpoints at the head: nothing re-applied
    assert ledger.snapshot() == live
    assert runner.rebuild(ledger.engine, set_based=False) == events
    assert ledger.snapshot() == live
    assert runner.rebuild(ledger.engine, whole_history=False, batch_size=7) == events
    assert ledger.snapshot() == live
    runner.rebuild(ledger.engine)  # and once more from the other paths' rows: the same again
    assert ledger.snapshot() == live
    return live


def _seed_lab(ledger: LedgerHandle, tmp_path: Path) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")


def _real_fixtures(ledger: LedgerHandle, tmp_path: Path) -> None:
    for fixture in sorted(REAL.glob("*.yaml")):
        ledger.replay(fixture)


def _simulated(ledger: LedgerHandle, tmp_path: Path) -> None:
    write_history(FLEET, tmp_path / "fleet.jsonl")
    ledger.replay(tmp_path / "fleet.jsonl")


@pytest.mark.parametrize("load", [_seed_lab, _real_fixtures, _simulated], ids=["seed-lab", "real", "simulated"])
def test_every_rebuild_gives_the_rows_of_live_catch_up(ledger: LedgerHandle, tmp_path: Path,
                                                       load: Callable[[LedgerHandle, Path], None]) -> None:
    load(ledger, tmp_path)
    live = _assert_every_rebuild_gives_the_live_rows(ledger)
    assert live["device_inventory"] and live["claims"] and live["claim_states"]


@pytest.mark.parametrize("history", sorted(HISTORIES.glob("*.jsonl")), ids=lambda p: p.stem)
def test_every_recorded_history_rebuilds_to_its_live_rows(ledger: LedgerHandle, history: Path) -> None:
    ledger.replay(history)
    live = _assert_every_rebuild_gives_the_live_rows(ledger)
    assert live["device_allocations"] and live["claim_consumers"] and live["pod_phases"]


# --- hand-made events, appended as they are (no translator) -------------------------------------------------


def _append(ledger: LedgerHandle, events: Sequence[tuple[str, Event, float]]) -> None:
    """Append (cluster, event, minutes after T0) in this order, each in a stream of its own."""
    with ledger.engine.begin() as conn:
        lock_appends(conn)
        for cluster, event, minutes in events:
            insert_events(conn, cluster, [NewEvent(
                stream=StreamId(f"test:{uuid.uuid4()}"), stream_position=StreamPosition(1), event=event,
                occurred_at=at(minutes), recorded_at=at(minutes), event_id=uuid.uuid4(),
                source=EventSource(kind="Test", uid=None, resource_version=None, watch_type="ADDED", digest="d"))])


def _device(name: str, *, model: str = "A100", shareable: bool = False, node: str | None = "node-a",
            event: type[DevicePublished] = DevicePublished) -> DevicePublished:
    attributes: JSONObject = {"gpu.example.com/productName": {"string": f"{model}-long"}, "model": {"string": model},
                              "index": {"int": 0}}
    counters: list[JSONValue] = [{"counterSet": f"{name}-set", "counters": {"memory": {"value": "80Gi"}}}]
    return event(driver="gpu.example.com", pool="pool-a", device=name, node=node, slice_name="slice-a",
                 attributes=attributes, capacity={"memory": {"value": "80Gi"}}, allow_multiple_allocations=shareable,
                 consumes_counters=counters, taints=[])


def _result(device: str, *, admin: bool = False, share: str | None = None, capacity: JSONObject | None = None,
            driver: str = "gpu.example.com") -> JSONValue:
    return {"request": "gpu", "driver": driver, "pool": "pool-a", "device": device, "adminAccess": admin,
            "shareID": share, "consumedCapacity": capacity or {}, "deviceClassName": "gpu.example.com"}


def _allocated(uid: str, *results: JSONValue, namespace: str = "ml", node: str | None = "node-a") -> ClaimAllocated:
    return ClaimAllocated(uid=uid, namespace=namespace, name=f"claim-{uid}", results=list(results), node=node,
                          allocation_timestamp=None)


def _created(uid: str, *, namespace: str = "ml", origin: str = "manual") -> ClaimCreated:
    return ClaimCreated(uid=uid, namespace=namespace, name=f"claim-{uid}", origin=origin, owner_pod=None,
                        owner_pod_uid=None, requests=[{"name": "gpu", "exactly": {"count": 1}}])


def _pod(uid: str, name: str = "consumer") -> JSONObject:
    return {"resource": "pods", "name": name, "uid": uid, "apiGroup": None}


def _phase(uid: str, phase: str, *, claims: list[JSONValue] | None = None) -> PodPhaseChanged:
    return PodPhaseChanged(uid=uid, namespace="ml", name=f"pod-{uid}", phase=phase, node="node-a",
                           claims=claims if claims is not None else ["c1"])


def _edge_cases(cluster: str) -> list[tuple[str, Event, float]]:
    """Every rule the projections implement, with times out of order where a rule concerns them."""
    return [(cluster, event, minutes) for event, minutes in [
        (DeviceClassDefined(name="gpu.example.com", spec={"selectors": []}), 0),
        (TeamAssigned(namespace="ml", team="alpha", label="team"), 0),
        (_device("gpu-0"), 0),
        (_device("gpu-1"), 0),
        (_device("nic-0", shareable=True), 0),
        (_device("gpu-0", event=DeviceUpdated, model="H100"), -5),  # earlier than its publication: empty interval
        (_device("gpu-1", event=DeviceUpdated, model="H100", node=None), 5),
        # c1: allocated, consumers flap, deletion requested twice, released, deleted, then a late reservation
        (_created("c1"), 1),
        (_phase("p1", "Pending"), 1),
        (_allocated("c1", _result("gpu-0")), 2),
        (ClaimReserved(uid="c1", consumer=_pod("p1", "pod-p1")), 3),
        (_phase("p1", "Running"), 3),
        (ClaimReserved(uid="c1", consumer=_pod("p2", "pod-p2")), 4),
        (ClaimUnreserved(uid="c1", consumer=_pod("p1", "pod-p1")), 6),
        (ClaimReserved(uid="c1", consumer=_pod("p1", "pod-p1")), 7),
        (ClaimReserved(uid="c1", consumer=_pod("p1", "pod-p1")), 7),  # the same reservation twice
        (ClaimDeletionRequested(uid="c1", deletion_timestamp="t8"), 8),
        (ClaimDeletionRequested(uid="c1", deletion_timestamp="t9"), 9),
        # c2: a second, non-shareable allocation of gpu-0: both flagged; c3 holds it with adminAccess
        (_created("c2", namespace="vision"), 9),
        (_allocated("c2", _result("gpu-0"), namespace="vision"), 10),
        (_created("c3"), 11),
        (_allocated("c3", _result("gpu-0", admin=True)), 11),
        # c4: two shares of a shareable device, never a conflict
        (_created("c4"), 11),
        (_allocated("c4", _result("nic-0", share="s1", capacity={"bandwidth": "1G"}),
                    _result("nic-0", share="s2", capacity={"bandwidth": "2G"})), 11),
        # c5: events before its ClaimCreated, then ClaimCreated twice
        (_allocated("c5", _result("gpu-1")), 12),
        (ClaimReserved(uid="c5", consumer=_pod("p3")), 12),
        (_created("c5"), 13),
        (_created("c5", origin="template"), 14),
        (TeamAssigned(namespace="ml", team="alpha", label="team"), 14),  # unchanged team: nothing is split
        (ClaimDeallocated(uid="c5"), 15),
        (_allocated("c5", _result("gpu-1")), 16),
        # c7: released "before" it was allocated (times out of order): an empty interval
        (_created("c7", namespace="vision"), 17),
        (_allocated("c7", _result("gpu-1"), namespace="vision"), 18),
        (ClaimDeallocated(uid="c7"), 17),
        (ClaimDeleted(uid="c7"), 16),
        # c8: a device the inventory never saw, and one from another driver
        (_created("c8"), 19),
        (_allocated("c8", _result("ghost-0"), _result("nic-9", driver="net.example.com"), node="node-z"), 19),
        (ClaimReserved(uid="c8", consumer={"resource": "jobs", "name": "batch", "uid": None, "apiGroup": "batch"}),
         19),
        # relabels: one now, one dated before c6's allocation that arrives after it (out of order)
        (TeamAssigned(namespace="ml", team="beta", label="team"), 25),
        (_created("c6"), 29),
        (_allocated("c6", _result("gpu-1")), 30),
        (TeamAssigned(namespace="ml", team="gamma", label="team"), 20),
        (TeamAssigned(namespace="ml", team="gamma", label="team"), 21),  # the same team again
        (TeamAssigned(namespace="vision", team="vision-team", label="team"), 22),
        # c10: a third holder of gpu-0 while c3's adminAccess allocation is open (c3 stays unflagged)
        (_created("c10", namespace="vision"), 35),
        (_allocated("c10", _result("gpu-0"), namespace="vision"), 35),
        # the device leaves and comes back; an allocation while it is away has no inventory row
        (DeviceWithdrawn(driver="gpu.example.com", pool="pool-a", device="gpu-1"), 50),
        (_created("c9"), 55),
        (_allocated("c9", _result("gpu-1"), node=None), 55),
        (_device("gpu-1"), 60),
        (_device("gpu-1", event=DeviceUpdated, shareable=True), 61),
        # c1 released and deleted, then a reservation after the deletion
        (ClaimDeallocated(uid="c1"), 45),
        (ClaimDeleted(uid="c1"), 46),
        (ClaimReserved(uid="c1", consumer=_pod("p2", "pod-p2")), 47),
        (ClaimDeleted(uid="c1"), 48),
        # pods: deleted, then seen again; a phase dated before the one it replaces
        (_phase("p1", "Succeeded", claims=[]), 40),
        (PodDeleted(uid="p1", namespace="ml", name="pod-p1"), 50),
        (_phase("p1", "Running"), 51),
        (_phase("p2", "Running"), 30),
        (_phase("p2", "Failed"), 20),
        (PodDeleted(uid="p2", namespace="ml", name="pod-p2"), 20),
        # classes change, go, come back
        (DeviceClassChanged(name="gpu.example.com", spec={"selectors": [{"cel": {"expression": "true"}}]}), 10),
        (DeviceClassDeleted(name="gpu.example.com"), 20),
        (DeviceClassDefined(name="gpu.example.com", spec={}), 30),
        # taint rules: changed, deleted, defined again; one without a selector; a change dated before its definition
        (_rule("r1", {"driver": "gpu.example.com", "device": "gpu-0"}), 5),
        (_rule("r1", {"driver": "gpu.example.com"}, effect="NoExecute", event=DeviceTaintRuleChanged), 15),
        (DeviceTaintRuleDeleted(name="r1"), 25),
        (_rule("r1", {}), 35),
        (_rule("r2", None, effect="None"), 10),
        (_rule("r2", None, event=DeviceTaintRuleChanged), 8),  # earlier than its definition: empty interval
        # allocations applied before their device was published (claims recorded before their slice)
        (TeamAssigned(namespace="late", team="early", label="team"), 0),
        (_created("c11", namespace="late"), 70),
        (_allocated("c11", _result("late-0"), namespace="late", node="node-z"), 70),
        (_created("c12", namespace="late"), 71),
        (_allocated("c12", _result("late-0"), namespace="late", node="node-z"), 71),
        (_created("c13", namespace="late"), 70),
        (_allocated("c13", _result("late-1"), namespace="late"), 70),
        (_created("c14", namespace="late"), 70),
        (_allocated("c14", _result("late-2"), namespace="late"), 70),
        (_created("c15", namespace="late"), 70),
        (_allocated("c15", _result("late-3"), namespace="late"), 70),
        (ClaimDeallocated(uid="c15"), 69),  # released "before" allocated: an empty interval, never filled
        # c20 as c14 below, but its device's event (dated after its start: no fill) comes before the relabel
        (_created("c20", namespace="late"), 70),
        (_allocated("c20", _result("late-6"), namespace="late"), 70),
        (_device("late-6", model="L4"), 71),
        (TeamAssigned(namespace="late", team="later", label="team"), 72),  # splits c11, c12, c13, c14 and c20
        (ClaimDeallocated(uid="c14"), 74),
        # after c14's start, before the relabel: fills neither piece (the second begins after the event, but the
        # allocation did not), as for c20 whose device's event came before the relabel split it
        (_device("late-2", model="L4"), 71),
        (_device("late-3", model="L4"), 60),
        (_device("late-0", model="B200", node="node-b"), 65),  # before both starts: fills c11 and c12, all pieces
        (_device("late-1", model="L4"), 75),  # after c13's start: fills nothing ...
        (_device("late-1", event=DeviceUpdated, model="H200"), 68),  # ... an update dated before it fills c13
        # two claims' shares of a shareable device recorded before it: flagged as a conflict until it comes
        (_created("c16", namespace="late"), 76),
        (_allocated("c16", _result("late-4", share="s1"), namespace="late"), 76),
        (_created("c17", namespace="late"), 77),
        (_allocated("c17", _result("late-4", share="s2"), namespace="late"), 77),
        (_device("late-4", shareable=True), 60),
        # and of one that does not allow it: the flags stay
        (_created("c18", namespace="late"), 76),
        (_allocated("c18", _result("late-5"), namespace="late"), 76),
        (_created("c19", namespace="late"), 77),
        (_allocated("c19", _result("late-5"), namespace="late"), 77),
        (_device("late-5"), 60),
    ]]


def _rule(name: str, selector: JSONObject | None, *, effect: str = "NoSchedule",
          event: type[DeviceTaintRuleDefined] = DeviceTaintRuleDefined) -> DeviceTaintRuleDefined:
    return event(name=name, device_selector=selector,
                 taint={"key": "example.com/broken", "value": None, "effect": effect, "timeAdded": None})


def test_hand_made_edge_cases_rebuild_to_the_rows_of_every_other_path(ledger: LedgerHandle) -> None:
    # The same keys in a second cluster, interleaved: every key of every read model starts with the cluster.
    ours, other = _edge_cases(ledger.cluster), _edge_cases("other")
    _append(ledger, [e for pair in zip(ours, other, strict=True) for e in pair])
    live = _assert_every_rebuild_gives_the_live_rows(ledger)
    assert all(live.values()), [name for name, rows in live.items() if not rows]
    # The cases are really there: flagged conflicts, split relabels, empty intervals, off-inventory devices.
    with ledger.engine.connect() as conn:
        def count(sql: str) -> int:
            return int(conn.execute(text(f"SELECT count(*) FROM {sql} AND cluster = 'other'")).scalar_one())
        assert count("device_allocations WHERE claim_uid = 'c2' AND conflict") == 2  # gpu-0, held by c1 too
        assert count("device_allocations WHERE claim_uid = 'c10' AND conflict") == 1  # gpu-0, held by c2 too
        assert count("device_allocations WHERE claim_uid IN ('c3', 'c4') AND conflict") == 0  # adminAccess, shares
        assert count("device_allocations WHERE claim_uid = 'c1'") == 2  # split by the relabel at minute 25
        assert count("device_allocations WHERE claim_uid = 'c6' AND team = 'gamma'") == 1  # relabel dated before
        assert count("device_allocations WHERE isempty(valid)") == 2  # c7 and c15, released "before" allocated
        assert count("device_allocations WHERE model IS NULL AND namespace <> 'late'") == 5  # no inventory row then
        # filled by the device's publication when it came, or left waiting (before it, or empty)
        assert count("device_allocations WHERE claim_uid IN ('c11', 'c12') AND model = 'B200' AND node = 'node-b' "
                     "AND awaiting_device_from IS NULL") == 4
        assert count("device_allocations WHERE claim_uid = 'c13' AND model = 'H200' "
                     "AND awaiting_device_from IS NULL") == 2
        assert count("device_allocations WHERE claim_uid IN ('c14', 'c20') AND model IS NULL "
                     "AND awaiting_device_from IS NOT NULL") == 4  # two pieces each, split by the relabel
        assert count("device_allocations WHERE claim_uid = 'c15' AND model IS NULL AND isempty(valid) "
                     "AND awaiting_device_from IS NOT NULL") == 1
        assert count("device_allocations WHERE claim_uid IN ('c16', 'c17') AND NOT conflict AND model = 'A100'") == 2
        assert count("device_allocations WHERE claim_uid IN ('c18', 'c19') AND conflict AND model = 'A100'") == 2
        assert count("device_inventory WHERE isempty(valid)") == 2  # gpu-0 and late-1: updates dated before
        assert count("claim_states WHERE isempty(valid)") >= 1
        assert count("pod_phases WHERE isempty(valid)") >= 1
        assert count("claims WHERE uid = 'c5' AND origin = 'manual' AND state = 'allocated'") == 1
        assert count("claim_consumers WHERE upper_inf(valid)") >= 1
        assert count("device_taint_rules WHERE name = 'r1'") == 3  # defined, changed, (deleted,) defined again
        assert count("device_taint_rules WHERE name = 'r1' AND upper_inf(valid) AND device_selector = '{}'") == 1
        assert count("device_taint_rules WHERE name = 'r2' AND device_selector IS NULL AND isempty(valid)") == 1
        assert count("device_taint_rules WHERE name = 'r1' AND effect = 'NoExecute' "
                     "AND device_selector = '{\"driver\": \"gpu.example.com\"}'") == 1


def test_allocations_written_while_the_fold_reads_give_the_same_rows(ledger: LedgerHandle, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Tiny fetches and flushes: closed allocations are spooled in many chunks between fetches of the
    # server-side cursor, as they are on a long history, and open ones come at the end.
    _simulated(ledger, tmp_path)
    _append(ledger, _edge_cases(ledger.cluster))
    live = ledger.snapshot()
    monkeypatch.setattr(whole_history, "_FETCH_ROWS", 3)
    monkeypatch.setattr(whole_history, "_FLUSH_ROWS", 2)
    runner.rebuild(ledger.engine)
    assert ledger.snapshot() == live


def _fold_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ledger-rebuild")]


def test_a_failing_fold_rolls_the_rebuild_back_and_leaves_no_thread(ledger: LedgerHandle, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The fold runs in a thread of its own; its failure (here the 50th event, as a corrupt payload would)
    # must reach the caller, roll back every table built so far and keep the old read models.
    _simulated(ledger, tmp_path)
    live = ledger.snapshot()
    original, calls = whole_history._Fold.apply, 0

    def failing(self: whole_history._Fold, event_type: str, *args: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 50:
            raise AssertionError("corrupt payload")
        original(self, event_type, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(whole_history._Fold, "apply", failing)
    with pytest.raises(AssertionError, match="corrupt payload"):
        runner.rebuild(ledger.engine)
    assert calls == 50
    assert _fold_threads() == []
    assert runner.lag(ledger.engine) == {p.name: 0 for p in ALL}  # checkpoints not reset
    assert ledger.snapshot() == live


def test_a_failing_statement_stops_the_other_threads_at_their_next_read(ledger: LedgerHandle, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The statement the build's own connection runs fails at once while the fold is slow (10 ms an event, one
    # event a fetch): the error reaches the caller, and the fold gives up at its next fetch instead of
    # reading the whole history.
    _simulated(ledger, tmp_path)
    live = ledger.snapshot()
    folded = sum(1 for e in ledger.events() if e.type in whole_history._FOLD_TYPES)
    original, calls = whole_history._Fold.apply, 0

    def slow(self: whole_history._Fold, event_type: str, *args: object) -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.01)
        original(self, event_type, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(whole_history._Fold, "apply", slow)
    monkeypatch.setattr(whole_history, "_FETCH_ROWS", 1)
    failing = whole_history._Built("pod_phases", ("pod_uid",), "SELECT CAST(:head AS bigint) / 0")
    monkeypatch.setitem(whole_history.SQL_BUILT, "pod_phases", (failing,))
    with pytest.raises(DataError, match="division by zero"):
        runner.rebuild(ledger.engine)
    assert folded > 100
    assert 0 <= calls < folded
    assert _fold_threads() == []
    assert ledger.snapshot() == live


@pytest.mark.parametrize("table", ["claims", "claim_states", "claim_consumers"])
def test_a_failing_query_of_another_connection_fails_the_rebuild(ledger: LedgerHandle, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, table: str) -> None:
    # The tables after the first are queried on connections of their own and copied in: a failure there is
    # the same SQLAlchemy error as on the build's own connection, and the rebuild rolls back whole.
    _simulated(ledger, tmp_path)
    live = ledger.snapshot()
    name = next(n for n, group in whole_history.SQL_BUILT.items() if any(b.table == table for b in group))
    group = tuple(whole_history._Built(table, ("cluster",), "SELECT CAST(:head AS bigint) / 0")
                  if b.table == table else b for b in whole_history.SQL_BUILT[name])
    monkeypatch.setitem(whole_history.SQL_BUILT, name, group)
    with pytest.raises(DataError, match="division by zero"):
        runner.rebuild(ledger.engine)
    assert _fold_threads() == []
    assert ledger.snapshot() == live


def test_equal_interval_starts_resolve_to_the_interval_opened_last_as_in_live_catch_up(ledger: LedgerHandle) -> None:
    # Two team intervals start at minute 10 and both contain minute 15 (the second relabel, dated back
    # to 10, left the one of minute 30 empty). The reference's ORDER BY lower(valid) DESC LIMIT 1 leaves
    # the tie to the heap order; the batch path takes the row inserted last, and the rebuild must agree.
    _append(ledger, [(ledger.cluster, event, minutes) for event, minutes in [
        (TeamAssigned(namespace="ml", team="first", label="team"), 10),
        (TeamAssigned(namespace="ml", team="second", label="team"), 30),
        (TeamAssigned(namespace="ml", team="third", label="team"), 10),
        (_device("gpu-0"), 0), (_device("gpu-0", event=DeviceUpdated, model="B200"), 30),
        (_device("gpu-0", event=DeviceUpdated, model="H100"), 0),
        (_created("c1"), 15), (_allocated("c1", _result("gpu-0")), 15),
    ]])
    live = ledger.snapshot()
    runner.rebuild(ledger.engine)
    assert ledger.snapshot() == live
    assert [(row[4], row[14]) for row in live["device_allocations"]] == [("third", "H100")]
