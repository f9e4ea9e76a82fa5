"""Property-based tests (hypothesis) of replay over random small histories built from factory shapes.

A history is a random sequence of claim lifecycle steps (create, allocate a random GPU, reserve by a
pod, unreserve, request deletion, deallocate, delete) and namespace relabels over one pool. The same
history is then delivered the way a cluster delivers it: with duplicated lines, re-deliveries of
unchanged objects, relists, worker restarts (a new ``TranslatorState`` loaded from the database
mid-way), and ``410 Gone`` relists that stand in for a missed deletion. Properties:

* the delivered history gives exactly the events and read models of a clean replay;
* at every step, each device has the holders the history says, and never more than one
  non-shareable allocation that is not flagged ``conflict`` (double bookings are flagged, never lost);
* device-hours by team add up to the devices' own allocated hours (the union of their intervals).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from ledger import services
from ledger.recorded import read_text
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests import factories as f

CLUSTER = "default"
DEVICES = ("gpu-0", "gpu-1", "gpu-2")
NAMESPACES = (("ns-a", "red"), ("ns-b", "blue"))
EXAMPLES = 25

Op = tuple[str, int, int]
"""(step, claim or namespace index, device index)."""

ops = st.lists(st.tuples(st.sampled_from(["create", "create", "allocate", "allocate", "reserve", "unreserve",
                                          "deallocate", "delete", "request_deletion", "relabel"]),
                         st.integers(0, 4), st.integers(0, len(DEVICES) - 1)), min_size=3, max_size=24)
perturbations = st.lists(st.tuples(st.integers(0, 60), st.sampled_from(["dup", "redeliver", "relist", "restart",
                                                                        "gone410"])), max_size=10)
batch_sizes = st.integers(1, 7)


@dataclass(slots=True)
class Claim:
    uid: str
    namespace: str
    name: str
    rv: int = 0
    device: str | None = None
    allocated_at: float | None = None
    pod: tuple[str, str] | None = None
    deletion: float | None = None
    deleted: bool = False

    def obj(self) -> JSONObject:
        body = f.claim(name=self.name, namespace=self.namespace, claim_uid=self.uid,
                       results=[self.device] if self.device else None, allocated_at=self.allocated_at,
                       reserved=[self.pod] if self.pod else None, deletion=self.deletion, pool=POOL)
        cast(Any, body)["metadata"]["resourceVersion"] = str(self.rv)
        return body


POOL = "prop-pool"


@dataclass(slots=True)
class History:
    """The truth: the recorded lines in order, plus every allocation interval (minutes)."""

    lines: list[tuple[str, str, JSONObject, float]] = field(default_factory=list)
    """(kind, watch type, object, minute)."""
    intervals: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    """(device, claim uid, from, to) with to None = still held."""
    end: float = 0.0


def build(steps: list[Op]) -> History:
    """Turn random steps into a consistent history; impossible steps are skipped."""
    h = History()
    minute = 0.0
    h.lines.append(("ResourceSlice", "ADDED", f.resource_slice(name="prop-slice", pool=POOL, slice_uid="prop-slice",
                                                               devices=[f.gpu(d) for d in DEVICES]), minute))
    labels = {ns: team for ns, team in NAMESPACES}
    for ns, team in NAMESPACES:
        obj = f.namespace(ns, team)
        cast(Any, obj)["metadata"]["uid"] = f"uid-{ns}"
        h.lines.append(("Namespace", "ADDED", obj, minute))
    claims: list[Claim] = []
    rv = 100
    open_at: dict[str, tuple[str, float]] = {}
    for step, index, device in steps:
        minute += 1 + (index + device) % 4
        rv += 1
        live = [c for c in claims if not c.deleted]
        claim = live[index % len(live)] if live else None
        if step == "create":
            ns = NAMESPACES[index % len(NAMESPACES)][0]
            claim = Claim(uid=f.uid("pclaim"), namespace=ns, name=f"c{len(claims)}")
            claims.append(claim)
            claim.rv = rv
            h.lines.append(("ResourceClaim", "ADDED", claim.obj(), minute))
            continue
        if step == "relabel":
            ns = NAMESPACES[index % len(NAMESPACES)][0]
            labels[ns] = "red" if labels[ns] == "blue" else "blue"
            obj = f.namespace(ns, labels[ns])
            cast(Any, obj)["metadata"]["uid"] = f"uid-{ns}"
            h.lines.append(("Namespace", "MODIFIED", obj, minute))
            continue
        if claim is None:
            continue
        if step == "allocate" and claim.device is None and claim.deletion is None:
            claim.device, claim.allocated_at = DEVICES[device], minute
            open_at[claim.uid] = (DEVICES[device], minute)
        elif step == "reserve" and claim.device is not None and claim.pod is None:
            claim.pod = (f"pod-{claim.name}", f.uid("ppod"))
            h.lines.append(("Pod", "ADDED", f.pod(name=claim.pod[0], pod_uid=claim.pod[1], namespace=claim.namespace,
                                                  claim_name=claim.name), minute))
        elif step == "unreserve" and claim.pod is not None:
            claim.pod = None
        elif step == "deallocate" and claim.device is not None and claim.pod is None:
            claim.device = claim.allocated_at = None
            dev, start = open_at.pop(claim.uid)
            h.intervals.append((dev, claim.uid, start, minute))
        elif step == "request_deletion" and claim.deletion is None:
            claim.deletion = minute
        elif step == "delete":
            claim.deleted = True
            claim.rv = rv
            h.lines.append(("ResourceClaim", "DELETED", claim.obj(), minute))
            if claim.uid in open_at:
                dev, start = open_at.pop(claim.uid)
                h.intervals.append((dev, claim.uid, start, minute))
            continue
        else:
            continue
        claim.rv = rv
        h.lines.append(("ResourceClaim", "MODIFIED", claim.obj(), minute))
    h.intervals.extend((dev, uid, start, None) for uid, (dev, start) in open_at.items())
    h.end = minute + 5
    return h


def record(kind_type_obj_minute: tuple[str, str, JSONObject, float]) -> str:
    _, event_type, obj, minute = kind_type_obj_minute
    return json.dumps({"observedAt": f.stamp(minute), "type": event_type, "object": obj})


def alive(lines: list[tuple[str, str, JSONObject, float]]) -> dict[tuple[str, str], tuple[str, str, JSONObject, float]]:
    """The objects alive after ``lines``, by (kind, identity)."""
    out: dict[tuple[str, str], tuple[str, str, JSONObject, float]] = {}
    for entry in lines:
        kind, event_type, obj, _ = entry
        meta = obj["metadata"]
        assert isinstance(meta, dict)
        key = (kind, str(meta.get("uid") or meta["name"]))
        if event_type == "DELETED":
            out.pop(key, None)
        else:
            out[key] = entry
    return out


@dataclass(slots=True)
class Delivery:
    """What a cluster and a restarting worker would do with the history."""

    segments: list[list[str]] = field(default_factory=list)
    """Lines ingested with one translator state; a new segment is a restart."""
    relists_410: dict[int, tuple[list[JSONObject], float]] = field(default_factory=dict)
    """Before segment i: a ResourceClaim relist (the claims alive then) observed at that minute."""


def deliver(h: History, plan: list[tuple[int, str]]) -> Delivery:
    d = Delivery(segments=[[]])
    by_position: dict[int, list[str]] = {}
    for position, what in plan:
        by_position.setdefault(position % (len(h.lines) + 1), []).append(what)
    sent: list[str] = []
    for i, entry in enumerate(h.lines):
        for what in by_position.get(i, []):
            now = h.lines[i - 1][3] if i else 0.0
            if what == "dup" and sent:
                d.segments[-1].append(sent[len(sent) // 2])
            elif what == "redeliver" and i:
                kind, _, obj, _ = h.lines[i - 1]
                if h.lines[i - 1][1] != "DELETED":
                    d.segments[-1].append(record((kind, "MODIFIED", obj, now)))
            elif what == "relist":
                d.segments[-1].extend(record((k, "ADDED", o, now)) for k, _, o, _ in alive(h.lines[:i]).values())
            elif what == "restart":
                d.segments.append([])
        kind, event_type, obj, minute = entry
        if event_type == "DELETED" and any(w == "gone410" for w in by_position.get(i, [])):
            # The watch missed this deletion (410 Gone); the relist right after it finds the claim gone.
            claims = [o for (k, _), (_, _, o, _) in alive(h.lines[: i + 1]).items() if k == "ResourceClaim"]
            d.relists_410[len(d.segments)] = (claims, minute)
            d.segments.append([])
            continue
        line = record(entry)
        d.segments[-1].append(line)
        sent.append(line)
    return d


def replay_clean(ledger: LedgerHandle, h: History) -> None:
    lines = read_text("\n".join(record(e) for e in h.lines), source="clean")
    services.ingest(ledger.db, lines, cluster=CLUSTER)


def replay_delivered(ledger: LedgerHandle, d: Delivery, batch_size: int) -> None:
    state = services.load_state(ledger.db, CLUSTER)
    for n, segment in enumerate(d.segments):
        if n in d.relists_410:
            claims, minute = d.relists_410[n]
            services.reconcile_relist(ledger.db, claims, cluster=CLUSTER, state=state, observed_at=f.at(minute),
                                      source="relist:ResourceClaim", checkpoint=services.WatchCheckpoint(
                                          kind="ResourceClaim", api_version="resource.k8s.io/v1",
                                          resource_version=str(n)))
        elif n:
            state = services.load_state(ledger.db, CLUSTER)  # a restarted worker reads its memory back
        services.ingest(ledger.db, read_text("\n".join(segment), source=f"segment-{n}"), cluster=CLUSTER,
                        state=state, batch_size=batch_size)


def empty(ledger: LedgerHandle) -> None:
    """Back to a fresh ledger (cheaper than a new database per example)."""
    with ledger.engine.begin() as conn:
        tables = conn.execute(text("SELECT string_agg(format('%I', tablename), ', ') FROM pg_tables "
                                   "WHERE schemaname = 'public' AND tablename <> 'alembic_version'")).scalar_one()
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY"))


@pytest.fixture()
def two(ledger_factory: Callable[[], LedgerHandle]) -> Iterator[tuple[LedgerHandle, LedgerHandle]]:
    yield ledger_factory(), ledger_factory()


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=ops, plan=perturbations, batch_size=batch_sizes)
@example(steps=[("create", 0, 0), ("create", 1, 0), ("allocate", 0, 1), ("allocate", 1, 1), ("reserve", 0, 0),
                ("relabel", 1, 0), ("unreserve", 0, 0), ("delete", 0, 0), ("request_deletion", 0, 0),
                ("delete", 0, 0)],
         plan=[(3, "dup"), (4, "redeliver"), (5, "relist"), (6, "restart"), (11, "gone410"), (13, "gone410"),
               (8, "restart"), (9, "dup"), (11, "relist")], batch_size=2)
def test_duplicates_relists_restarts_and_410s_give_the_events_and_read_models_of_a_clean_replay(
        two: tuple[LedgerHandle, LedgerHandle], steps: list[Op], plan: list[tuple[int, str]], batch_size: int) -> None:
    clean, delivered = two
    empty(clean)
    empty(delivered)
    history = build(steps)
    replay_clean(clean, history)
    replay_delivered(delivered, deliver(history, plan), batch_size)
    assert delivered.snapshot() == clean.snapshot()


def _minutes(t: datetime) -> float:
    return (t - f.T0) / timedelta(minutes=1)


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=ops)
def test_occupancy_follows_the_history_and_double_bookings_are_flagged(ledger: LedgerHandle, steps: list[Op]) -> None:
    empty(ledger)
    history = build(steps)
    replay_clean(ledger, history)
    instants = sorted({m + 0.5 for *_, m in history.lines} | {0.25})
    for minute in instants:
        truth: dict[str, set[str]] = {d: set() for d in DEVICES}
        for device, uid, start, end in history.intervals:
            if start <= minute and (end is None or minute < end):
                truth[device].add(uid)
        body: Any = ledger.occupancy(at=f.at(minute), pool=POOL)
        holders = {d["device"]: {a["claim"] for a in d["allocations"]} for d in body["devices"] if d["allocations"]}
        claims: Any = ledger.claims(at=f.at(minute))
        names = {c["uid"]: c["name"] for c in claims["claims"]}
        assert holders == {d: {names[u] for u in uids} for d, uids in truth.items() if uids}, minute
        for dev in body["devices"]:
            flags = [a["conflict"] for a in dev["allocations"] if not a["adminAccess"]]
            assert flags.count(False) <= 1, (minute, dev)
            if len(flags) > 1:
                assert all(flags), (minute, dev)
        assert body["totals"]["allocated"] == sum(1 for uids in truth.values() if uids)
        assert body["totals"]["free"] == len(DEVICES) - body["totals"]["allocated"] >= 0


def _union_minutes(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(steps=ops, window=st.tuples(st.floats(0, 60), st.floats(1, 90)))
def test_device_hours_by_team_add_up_to_the_devices_own_hours(ledger: LedgerHandle, steps: list[Op],
                                                              window: tuple[float, float]) -> None:
    empty(ledger)
    history = build(steps)
    replay_clean(ledger, history)
    start, length = window
    end = start + length
    spans: dict[str, list[tuple[float, float]]] = {d: [] for d in DEVICES}
    for device, _, lo, hi in history.intervals:
        lo, hi = max(lo, start), min(end if hi is None else hi, end)
        if hi > lo:
            spans[device].append((lo, hi))
    device_hours = sum(_union_minutes(s) for s in spans.values()) / 60
    for group_by in ("team", "namespace", "node"):
        body: Any = ledger.usage(f.at(start), f.at(end), group_by=group_by)
        assert sum(r["deviceHours"] for r in body["rows"]) == pytest.approx(device_hours, abs=1e-4), group_by
    teams: Any = ledger.usage(f.at(start), f.at(end), group_by="team")
    assert {r["team"] for r in teams["rows"]} <= {"red", "blue"}
