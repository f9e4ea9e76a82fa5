"""Set-based application of a batch of events to the core read models (the fast path of the runner).

Why: applying events one at a time costs about three SQL round trips per event and projection
(close the open interval, open a new one, look something up), which capped a rebuild at ~300-450
events/s. Here each projection folds a whole *segment* of events in memory and writes the result
with a handful of statements:

1. one ``SELECT`` per table loads the open intervals (``upper_inf(valid)``) of the keys the segment
   touches, through the key indexes;
2. the events are folded in global position order over those rows in Python, with exactly the
   semantics of ``apply_event`` in :mod:`ledger.projections.models` (which stays the reference
   implementation; a test checks both give the same rows);
3. one pipelined ``executemany`` ``UPDATE ... WHERE row_id`` closes or changes loaded rows, and one
   pipelined ``executemany`` ``INSERT`` adds the new intervals (already closed when they were opened
   and closed within the segment, so most short-lived rows are written once, never updated).

psycopg 3 pipelines ``executemany`` (no round trip per row), so the cost per event is a few
microseconds of Python plus the row writes themselves.

Ordering invariant: ``device_allocations`` reads ``namespace_teams`` and ``device_inventory`` as of
the event's own global position. Projections run table by table over a segment, so a segment is cut
whenever an event those reads depend on (``TeamAssigned``, ``Device*``) follows a ``ClaimAllocated``
in it: within a segment every such event precedes every allocation, and reading the tables after the
segment's writes gives what reading them at each allocation's position gave. Read models therefore do
not depend on batch boundaries, and live catch-up and ``rebuild`` stay row-for-row identical.

A DevicePublished / DeviceUpdated also writes ``device_allocations``: it fills the rows waiting for the device
(``models.PUBLISHED_EVENTS``), which the batch form does with SQL before it loads any row. That equals the
reference only if no event of the segment changed those rows before it, so a segment is also cut where such an
event follows a ``ClaimAllocated``, ``ClaimDeallocated`` or ``TeamAssigned``: a relabel copies a row before the
fill would reach the copy, a release dated before the start empties a row the fill then skips.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from psycopg.types.range import Range
from sqlalchemy import Connection, Table, text
from sqlalchemy.dialects.postgresql import JSONB

from ledger.events import RecordedEvent
from ledger.projections.base import opt_str_of, str_of
from ledger.projections.models import (
    ALLOCATION_EVENTS,
    FILL_UNPUBLISHED,
    PUBLISHED_EVENTS,
    TAINT_RULE_EVENTS,
    counter_set_of,
    model_of,
    published_fill,
    taint_rule_row,
)
from ledger.store import tables as t
from ledger.store.postgres import copy_rows
from ledger.types import JSONObject, JSONValue

Key = tuple[str, ...]

_DEPENDED_ON = frozenset({"TeamAssigned", "DevicePublished", "DeviceUpdated", "DeviceWithdrawn"})
"""Event types whose rows ``device_allocations`` reads when it applies a ``ClaimAllocated``."""


def _j(value: JSONValue) -> str:
    return json.dumps(value, sort_keys=True)


def segments(batch: Sequence[RecordedEvent]) -> list[Sequence[RecordedEvent]]:
    """Cut ``batch`` so no ``TeamAssigned`` / ``Device*`` event follows a ``ClaimAllocated`` in a segment, and no
    DevicePublished / DeviceUpdated follows a ``ClaimDeallocated`` or ``TeamAssigned``.

    See the module docstring for the invariants this protects. Order is kept; segments are contiguous.
    """
    out: list[Sequence[RecordedEvent]] = []
    start, allocated, changed = 0, False, False
    for i, event in enumerate(batch):
        if (allocated and event.type in _DEPENDED_ON) or (changed and event.type in PUBLISHED_EVENTS):
            out.append(batch[start:i])
            start, allocated, changed = i, False, False
        if event.type in ALLOCATION_EVENTS:
            changed = True
            allocated = allocated or event.type == "ClaimAllocated"
    if start < len(batch):
        out.append(batch[start:])
    return out


@dataclass(slots=True, eq=False)
class _Row:
    """One interval row in memory: loaded (``row_id`` set) or new (inserted at flush)."""

    values: dict[str, object]
    lower: datetime
    upper: datetime | None = None
    row_id: int | None = None
    open: bool = True
    dirty: bool = False

    def close(self, end: datetime) -> None:
        """``valid = [lower, greatest(lower, end))``, as :func:`ledger.projections.base.close_intervals`."""
        self.upper = max(self.lower, end)
        self.open = False
        self.dirty = True


@dataclass(slots=True)
class _Intervals:
    """The open intervals of ``table`` for the keys a segment touches, folded in memory, then written.

    ``group`` names the columns rows are looked up by (a prefix every close/open of the projection
    shares); ``mutable`` names the columns an UPDATE of a loaded row may change besides ``valid``.
    """

    conn: Connection
    table: Table
    group: tuple[str, ...]
    mutable: tuple[str, ...] = ()
    by_group: dict[Key, list[_Row]] = field(default_factory=dict)
    rows: list[_Row] = field(default_factory=list)
    loaded_ids: set[int] = field(default_factory=set)

    @property
    def columns(self) -> list[str]:
        return [c.name for c in self.table.columns if c.name not in ("row_id", "valid")]

    def load(self, groups: Iterable[Key], by: tuple[str, ...] | None = None) -> None:
        """Load the open, non-empty intervals whose ``by`` columns (default: ``group``) are in ``groups``."""
        by = by or self.group
        keys = sorted(set(groups))
        if not keys:
            return
        cols = self.columns
        unnest = ", ".join(f"CAST(:k{i} AS text[])" for i in range(len(by)))
        params = {f"k{i}": [k[i] for k in keys] for i in range(len(by))}
        # Through the key index of the table (``*_key_idx`` / ``*_claim_idx``); open rows only.
        rows = self.conn.execute(text(
            f"SELECT row_id, lower(valid) AS _lo, {', '.join(cols)} FROM {self.table.name} "
            f"WHERE upper_inf(valid) AND NOT isempty(valid) AND ({', '.join(by)}) IN "
            f"(SELECT * FROM unnest({unnest}))"), params).mappings().all()
        json_cols = {c.name for c in self.table.columns if isinstance(c.type, JSONB)}
        for r in rows:
            row_id = int(r["row_id"])
            if row_id in self.loaded_ids:
                continue
            self.loaded_ids.add(row_id)
            values = {c: (_j(r[c]) if c in json_cols else r[c]) for c in cols}
            row = _Row(values=values, lower=r["_lo"], row_id=row_id)
            self.rows.append(row)
            self.by_group.setdefault(self._key(values), []).append(row)

    def _key(self, values: Mapping[str, object]) -> Key:
        return tuple(str(values[c]) for c in self.group)

    def open_rows(self, key: Key) -> list[_Row]:
        """Open rows of one group, oldest first."""
        return [r for r in self.by_group.get(key, ()) if r.open]

    def close(self, key: Key, end: datetime, where: Mapping[str, object] | None = None) -> None:
        """Close the open rows of ``key`` whose columns equal ``where`` at ``end``."""
        for row in self.open_rows(key):
            if where is None or all(row.values.get(c) == v for c, v in where.items()):
                row.close(end)

    def open(self, values: dict[str, object], start: datetime) -> _Row:
        """Add a row ``[start, ∞)``."""
        row = _Row(values=values, lower=start, dirty=True)
        self.rows.append(row)
        self.by_group.setdefault(self._key(values), []).append(row)
        return row

    def flush(self) -> None:
        """Write: one pipelined UPDATE for changed loaded rows, one pipelined INSERT for new rows."""
        cols = self.columns
        updates = [r for r in self.rows if r.row_id is not None and r.dirty]
        if updates:
            sets = "".join(f", {c} = :{c}" for c in self.mutable)
            self.conn.execute(text(
                f"UPDATE {self.table.name} SET valid = tstzrange(lower(valid), :_hi, '[)'){sets} WHERE row_id = :_id"),
                [{"_hi": r.upper, "_id": r.row_id, **{c: r.values[c] for c in self.mutable}} for r in updates])
        inserts = [r for r in self.rows if r.row_id is None]
        if inserts:
            # COPY, not INSERT: new rows are most of a rebuild's writes. Range(lo, lo) is sent as
            # '[lo,lo)', which PostgreSQL stores as 'empty', exactly as closing at lo does.
            copy_rows(self.conn, self.table.name, [*cols, "valid"],
                      ([*(r.values.get(c) for c in cols), Range(r.lower, r.upper, "[)")] for r in inserts))


def _mine(events: Sequence[RecordedEvent], types: Iterable[str]) -> list[RecordedEvent]:
    wanted = frozenset(types)
    return [e for e in events if e.type in wanted]


def apply_namespace_teams(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.NamespaceTeams`."""
    mine = _mine(events, ("TeamAssigned",))
    if not mine:
        return
    iv = _Intervals(conn, t.namespace_teams, ("cluster", "namespace"))
    iv.load((e.cluster, str_of(e.payload, "namespace")) for e in mine)
    for e in mine:
        key = (e.cluster, str_of(e.payload, "namespace"))
        iv.close(key, e.occurred_at)
        iv.open({"cluster": e.cluster, "namespace": key[1], "team": str_of(e.payload, "team")}, e.occurred_at)
    iv.flush()


def _device_key(e: RecordedEvent) -> Key:
    p = e.payload
    return (e.cluster, str_of(p, "driver"), str_of(p, "pool"), str_of(p, "device"))


def apply_device_inventory(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.DeviceInventory`."""
    mine = _mine(events, ("DevicePublished", "DeviceUpdated", "DeviceWithdrawn"))
    if not mine:
        return
    iv = _Intervals(conn, t.device_inventory, ("cluster", "driver", "pool", "device"))
    iv.load(_device_key(e) for e in mine)
    for e in mine:
        key = _device_key(e)
        iv.close(key, e.occurred_at)
        if e.type == "DeviceWithdrawn":
            continue
        p = e.payload
        attributes, counters = p["attributes"], p["consumesCounters"]
        assert isinstance(attributes, dict) and isinstance(counters, list)
        iv.open({"cluster": key[0], "driver": key[1], "pool": key[2], "device": key[3],
                 "node": opt_str_of(p, "node"), "slice_name": str_of(p, "sliceName"),
                 "model": model_of(attributes), "counter_set": counter_set_of(counters),
                 "allow_multiple_allocations": bool(p["allowMultipleAllocations"]),
                 "attributes": _j(attributes), "capacity": _j(p["capacity"]),
                 "consumes_counters": _j(counters), "taints": _j(p["taints"])}, e.occurred_at)
    iv.flush()


def _apply_named_specs(conn: Connection, events: Sequence[RecordedEvent], table: Table, types: tuple[str, ...],
                       deleted: str, row: Callable[[JSONObject], dict[str, object]]) -> None:
    """Intervals of a cluster-scoped object's spec keyed by (cluster, ``name``): each event closes the name's
    open interval, and every event but ``deleted`` opens the next one with ``row(payload)``."""
    mine = _mine(events, types)
    if not mine:
        return
    iv = _Intervals(conn, table, ("cluster", "name"))
    iv.load((e.cluster, str_of(e.payload, "name")) for e in mine)
    for e in mine:
        key = (e.cluster, str_of(e.payload, "name"))
        iv.close(key, e.occurred_at)
        if e.type != deleted:
            iv.open({"cluster": key[0], "name": key[1], **row(e.payload)}, e.occurred_at)
    iv.flush()


def apply_device_classes(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.DeviceClasses`."""
    _apply_named_specs(conn, events, t.device_classes,
                       ("DeviceClassDefined", "DeviceClassChanged", "DeviceClassDeleted"), "DeviceClassDeleted",
                       lambda payload: {"spec": _j(payload["spec"])})


def apply_device_taint_rules(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.DeviceTaintRules` (table ``device_taint_rules``).

    Raises:
        AssertionError / ledger.errors.Invalid: a payload lacks ``taint`` or ``taint.effect`` (see
            :func:`ledger.projections.models.taint_rule_row`).
    """
    _apply_named_specs(conn, events, t.device_taint_rules, TAINT_RULE_EVENTS, "DeviceTaintRuleDeleted",
                       taint_rule_row)


def apply_pod_phases(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.PodPhases`."""
    mine = _mine(events, ("PodPhaseChanged", "PodDeleted"))
    if not mine:
        return
    iv = _Intervals(conn, t.pod_phases, ("cluster", "pod_uid"))
    iv.load((e.cluster, str_of(e.payload, "uid")) for e in mine)
    for e in mine:
        p = e.payload
        key = (e.cluster, str_of(p, "uid"))
        iv.close(key, e.occurred_at)
        if e.type == "PodPhaseChanged":
            iv.open({"cluster": key[0], "pod_uid": key[1], "namespace": str_of(p, "namespace"),
                     "name": str_of(p, "name"), "phase": str_of(p, "phase"), "node": opt_str_of(p, "node"),
                     "claims": _j(p["claims"])}, e.occurred_at)
    iv.flush()


@dataclass(slots=True)
class _ClaimRow:
    values: dict[str, object]
    stored: bool
    dirty: bool = False


def apply_claims(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.Claims` (tables ``claims`` and ``claim_states``)."""
    mine = [e for e in events if e.type in ("ClaimCreated", "ClaimAllocated", "ClaimDeallocated",
                                            "ClaimDeletionRequested", "ClaimDeleted")]
    if not mine:
        return
    keys = sorted({(e.cluster, str_of(e.payload, "uid")) for e in mine})
    claims: dict[Key, _ClaimRow] = {}
    for r in conn.execute(text(
            "SELECT cluster, uid, state, deletion_requested_at, deleted_at FROM claims WHERE (cluster, uid) IN "
            "(SELECT * FROM unnest(CAST(:c AS text[]), CAST(:u AS text[])))"),
            {"c": [k[0] for k in keys], "u": [k[1] for k in keys]}).mappings():
        claims[(str(r["cluster"]), str(r["uid"]))] = _ClaimRow(values=dict(r), stored=True)
    states = _Intervals(conn, t.claim_states, ("cluster", "claim_uid"))
    states.load(keys)
    for e in mine:
        p, at = e.payload, e.occurred_at
        key = (e.cluster, str_of(p, "uid"))
        row = claims.get(key)
        if e.type == "ClaimCreated":
            if row is None:  # ON CONFLICT DO NOTHING: the first ClaimCreated wins
                claims[key] = _ClaimRow(stored=False, dirty=True, values={
                    "cluster": key[0], "uid": key[1], "namespace": str_of(p, "namespace"),
                    "name": str_of(p, "name"), "origin": str_of(p, "origin"), "owner_pod": opt_str_of(p, "ownerPod"),
                    "owner_pod_uid": opt_str_of(p, "ownerPodUID"), "requests": _j(p["requests"]),
                    "state": "pending", "created_at": at, "deletion_requested_at": None, "deleted_at": None})
            states.open({"cluster": key[0], "claim_uid": key[1], "state": "pending", "node": None}, at)
        elif e.type in ("ClaimAllocated", "ClaimDeallocated"):
            state = "allocated" if e.type == "ClaimAllocated" else "pending"
            states.close(key, at)
            states.open({"cluster": key[0], "claim_uid": key[1], "state": state,
                         "node": opt_str_of(p, "node") if state == "allocated" else None}, at)
            if row is not None:
                row.values["state"], row.dirty = state, True
        elif e.type == "ClaimDeletionRequested":
            if row is not None:
                row.values["deletion_requested_at"], row.dirty = at, True
        else:  # ClaimDeleted
            states.close(key, at)
            if row is not None:
                row.values["state"], row.values["deleted_at"], row.dirty = "deleted", at, True
    states.flush()
    new = [r.values for r in claims.values() if not r.stored]
    if new:
        conn.execute(text(
            "INSERT INTO claims (cluster, uid, namespace, name, origin, owner_pod, owner_pod_uid, requests, state, "
            "created_at, deletion_requested_at, deleted_at) VALUES (:cluster, :uid, :namespace, :name, :origin, "
            ":owner_pod, :owner_pod_uid, :requests, :state, :created_at, :deletion_requested_at, :deleted_at) "
            "ON CONFLICT ON CONSTRAINT claims_pkey DO NOTHING"), new)
    changed = [r.values for r in claims.values() if r.stored and r.dirty]
    if changed:
        conn.execute(text(
            "UPDATE claims SET state = :state, deletion_requested_at = :deletion_requested_at, "
            "deleted_at = :deleted_at WHERE cluster = :cluster AND uid = :uid"), changed)


def apply_claim_consumers(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.ClaimConsumers`."""
    mine = _mine(events, ("ClaimDeleted", "ClaimReserved", "ClaimUnreserved"))
    if not mine:
        return
    iv = _Intervals(conn, t.claim_consumers, ("cluster", "claim_uid"))
    iv.load((e.cluster, str_of(e.payload, "uid")) for e in mine)
    for e in mine:
        p = e.payload
        key = (e.cluster, str_of(p, "uid"))
        if e.type == "ClaimDeleted":
            iv.close(key, e.occurred_at)
            continue
        consumer = p["consumer"]
        assert isinstance(consumer, dict)
        resource, name = str_of(consumer, "resource"), str_of(consumer, "name")
        iv.close(key, e.occurred_at, {"resource": resource, "name": name})
        if e.type == "ClaimReserved":
            iv.open({"cluster": key[0], "claim_uid": key[1], "resource": resource, "name": name,
                     "uid": opt_str_of(consumer, "uid"), "api_group": opt_str_of(consumer, "apiGroup")},
                    e.occurred_at)
    iv.flush()


def _latest_containing(rows: Sequence[tuple[datetime, datetime | None, int, object]], at: datetime) -> object:
    """The payload of the row with the greatest lower bound whose ``[lower, upper)`` contains ``at``."""
    best: tuple[datetime, int, object] | None = None
    for lo, hi, row_id, payload in rows:
        if lo <= at and (hi is None or at < hi) and (best is None or (lo, row_id) > best[:2]):
            best = (lo, row_id, payload)
    return best[2] if best is not None else None


@dataclass(frozen=True, slots=True)
class _Inventory:
    node: str | None
    model: str | None
    allow_multiple_allocations: bool


def _fill_unpublished(conn: Connection, published: Sequence[RecordedEvent]) -> None:
    """Fill the allocations waiting for the devices of ``published`` (DevicePublished / DeviceUpdated), in order.

    First one query (index ``device_allocations_awaiting_device_idx``) for which of those devices have rows waiting at
    all, mostly none; then the reference's UPDATE per event of such a device, pipelined. A segment's device events
    precede its allocations (:func:`segments`), so the rows filled are those the reference fills at each event.
    """
    keys = sorted({_device_key(e) for e in published})
    waiting = {tuple(r) for r in conn.execute(text(
        "SELECT DISTINCT cluster, driver, pool, device FROM device_allocations WHERE awaiting_device_from IS NOT NULL "
        "AND (cluster, driver, pool, device) IN (SELECT * FROM unnest(CAST(:c AS text[]), CAST(:d AS text[]), "
        "CAST(:p AS text[]), CAST(:n AS text[])))"),
        {"c": [k[0] for k in keys], "d": [k[1] for k in keys], "p": [k[2] for k in keys],
         "n": [k[3] for k in keys]})}
    fills: list[dict[str, object]] = []
    for e in published:
        key = _device_key(e)
        if key in waiting:
            model, node, shareable = published_fill(e.payload)
            fills.append({"cluster": key[0], "driver": key[1], "pool": key[2], "device": key[3], "model": model,
                          "node": node, "shareable": shareable, "at": e.occurred_at})
    if fills:
        conn.execute(text(FILL_UNPUBLISHED), fills)


def apply_device_allocations(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Batch form of :class:`ledger.projections.models.DeviceAllocations`.

    Reads ``namespace_teams`` and ``device_inventory`` after their own segment was written (see the
    module docstring for why that equals reading them at each event's position). Allocations waiting for a
    device of the segment's DevicePublished / DeviceUpdated events are filled first, before any row is loaded.
    """
    if published := _mine(events, PUBLISHED_EVENTS):
        _fill_unpublished(conn, published)
    mine = _mine(events, ALLOCATION_EVENTS)
    if not mine:
        return
    allocated = [e for e in mine if e.type == "ClaimAllocated"]
    devices: set[Key] = set()
    for e in allocated:
        results = e.payload["results"]
        assert isinstance(results, list)
        for result in results:
            assert isinstance(result, dict)
            devices.add((e.cluster, str_of(result, "driver"), str_of(result, "pool"), str_of(result, "device")))
    namespaces = sorted({(e.cluster, str_of(e.payload, "namespace")) for e in allocated})
    teams: dict[Key, list[tuple[datetime, datetime | None, int, object]]] = {}
    if namespaces:
        for r in conn.execute(text(
                "SELECT cluster, namespace, team, lower(valid) AS lo, upper(valid) AS hi, row_id FROM namespace_teams "
                "WHERE NOT isempty(valid) AND (cluster, namespace) IN "
                "(SELECT * FROM unnest(CAST(:c AS text[]), CAST(:n AS text[])))"),
                {"c": [k[0] for k in namespaces], "n": [k[1] for k in namespaces]}):
            teams.setdefault((r.cluster, r.namespace), []).append((r.lo, r.hi, r.row_id, r.team))
    inventory: dict[Key, list[tuple[datetime, datetime | None, int, object]]] = {}
    if devices:
        dk = sorted(devices)
        for r in conn.execute(text(
                "SELECT cluster, driver, pool, device, node, model, allow_multiple_allocations, lower(valid) AS lo, "
                "upper(valid) AS hi, row_id FROM device_inventory WHERE NOT isempty(valid) AND "
                "(cluster, driver, pool, device) IN (SELECT * FROM unnest(CAST(:c AS text[]), CAST(:d AS text[]), "
                "CAST(:p AS text[]), CAST(:n AS text[])))"),
                {"c": [k[0] for k in dk], "d": [k[1] for k in dk], "p": [k[2] for k in dk], "n": [k[3] for k in dk]}):
            inventory.setdefault((r.cluster, r.driver, r.pool, r.device), []).append(
                (r.lo, r.hi, r.row_id, _Inventory(r.node, r.model, bool(r.allow_multiple_allocations))))

    # One in-memory set of open rows reached three ways: by device (conflicts), by claim
    # (deallocation) and by namespace (relabel). Rows are loaded once (by row_id) and indexed by all.
    iv = _Intervals(conn, t.device_allocations, ("cluster", "driver", "pool", "device"), mutable=("team", "conflict"))
    iv.load(devices)
    iv.load({(e.cluster, str_of(e.payload, "uid")) for e in mine if e.type == "ClaimDeallocated"},
            by=("cluster", "claim_uid"))
    iv.load({(e.cluster, str_of(e.payload, "namespace")) for e in mine if e.type == "TeamAssigned"},
            by=("cluster", "namespace"))
    by_claim: dict[Key, list[_Row]] = {}
    by_namespace: dict[Key, list[_Row]] = {}

    def index(row: _Row) -> None:
        v = row.values
        by_claim.setdefault((str(v["cluster"]), str(v["claim_uid"])), []).append(row)
        by_namespace.setdefault((str(v["cluster"]), str(v["namespace"])), []).append(row)

    for row in iv.rows:
        index(row)
    for e in mine:
        p, at = e.payload, e.occurred_at
        if e.type == "ClaimAllocated":
            namespace, uid = str_of(p, "namespace"), str_of(p, "uid")
            team = _latest_containing(teams.get((e.cluster, namespace), []), at)
            results = p["results"]
            assert isinstance(results, list)
            for result in results:
                assert isinstance(result, dict)
                key = (e.cluster, str_of(result, "driver"), str_of(result, "pool"), str_of(result, "device"))
                inv = _latest_containing(inventory.get(key, []), at)
                assert inv is None or isinstance(inv, _Inventory)
                admin = bool(result.get("adminAccess"))
                conflict = False
                if not admin and not (inv.allow_multiple_allocations if inv is not None else False):
                    for other in iv.open_rows(key):
                        if not other.values["admin_access"] and other.values["claim_uid"] != uid:
                            other.values["conflict"], other.dirty, conflict = True, True, True
                index(iv.open({
                    "cluster": key[0], "claim_uid": uid, "namespace": namespace, "claim": str_of(p, "name"),
                    "team": str(team) if team is not None else namespace, "request": str_of(result, "request"),
                    "device_class": opt_str_of(result, "deviceClassName"), "driver": key[1], "pool": key[2],
                    "device": key[3], "share_id": opt_str_of(result, "shareID"),
                    "consumed_capacity": _j(result.get("consumedCapacity") or {}), "admin_access": admin,
                    "node": (inv.node if inv is not None else None) or opt_str_of(p, "node"),
                    "model": inv.model if inv is not None else None, "conflict": conflict,
                    "awaiting_device_from": None if inv is not None else at}, at))
        elif e.type == "ClaimDeallocated":
            for row in by_claim.get((e.cluster, str_of(p, "uid")), []):
                if row.open:
                    row.close(at)
        else:  # TeamAssigned: split open intervals of the namespace (see DeviceAllocations._relabel)
            team = str_of(p, "team")
            rows = [r for r in by_namespace.get((e.cluster, str_of(p, "namespace")), []) if r.open]
            for row in rows:
                if row.values["team"] != team and row.lower < at:
                    index(iv.open({**row.values, "team": team}, at))
                    row.upper, row.open, row.dirty = at, False, True
            for row in by_namespace.get((e.cluster, str_of(p, "namespace")), []):
                if row.open and row.lower >= at and row.values["team"] != team:
                    row.values["team"], row.dirty = team, True
    iv.flush()


BATCH_APPLIERS = {
    "namespace_teams": apply_namespace_teams,
    "device_inventory": apply_device_inventory,
    "device_classes": apply_device_classes,
    "device_taint_rules": apply_device_taint_rules,
    "pod_phases": apply_pod_phases,
    "claims": apply_claims,
    "claim_consumers": apply_claim_consumers,
    "device_allocations": apply_device_allocations,
}
"""Projection name -> its batch form; the runner uses it for every projection listed here."""
