"""Whole-history build of the core read models: the fast path of :func:`ledger.projections.runner.rebuild`.

Why: a rebuild starts from empty tables inside one transaction, so it needs none of the "load the open
intervals of the touched keys" reads of the batch path (:mod:`ledger.projections.batch`), and an
interval's end is simply the time of the next event that closes it. Building each table once from the
whole history, instead of folding batches of 5000 events and writing the same rows again and again,
took a rebuild of a simulated 50-node day (47,557 events) from ~12,900 to over 50,000 events/s.

Two techniques, each where it pays:

* **SQL** for the big, independent tables (``pod_phases``, ``claims``, ``claim_states``,
  ``claim_consumers``: about nine events in ten). One ``INSERT ... SELECT`` per table reads the
  ``events`` payloads on the server and finds each interval's end with a window over the key
  (``lead`` / ``min(...) FILTER`` over the following events), so no payload crosses the wire and no
  Python object is made per event.
* **Python** for ``namespace_teams``, ``device_inventory``, ``device_classes``, ``device_taint_rules``
  and ``device_allocations``: conflicts, relabel splits and the team / inventory lookups of an allocation
  are a fold, not a window. One pass over those event types (about one event in six), streamed in
  global position order from a server-side cursor, then one ``COPY`` per table.

Both cores work (:func:`build`): the build's transaction runs the first SQL-built table's ``INSERT ...
SELECT`` while two threads, each on a connection of its own, run the fold and the other tables' queries
(``COPY (query) TO STDOUT`` into temporary files); the transaction then copies those rows in. Only the
build's transaction writes, so the swap stays atomic.

Semantics are exactly those of ``apply_event`` in :mod:`ledger.projections.models` (the reference); a
test compares this path with it, with live catch-up and with the batch path, row for row. The rules
carried over, each stated where it is implemented: an event closes the open intervals of its key at
``greatest(lower, occurred_at)`` (an empty interval, never an inverted one, when events arrive out of
order); ``ClaimCreated`` opens a state interval without closing one and only its first occurrence makes
the ``claims`` row; events of a claim before that row exists do not change it.

Ordering invariant: ``device_allocations`` reads ``namespace_teams`` and ``device_inventory`` *as of the
allocation's own global position* (intervals opened so far, closed only by earlier events). The fold
applies every event type in one global-position-ordered pass, so at each ``ClaimAllocated`` its
in-memory teams and inventory are exactly the tables the reference would read at that position.

Snapshot invariant: every statement reads only ``global_position <= head``, the head read once after
the checkpoints were locked, so the tables built by separate statements (each a new READ COMMITTED
snapshot, on the build's connection or another one) see one and the same history even while appends go
on; appends commit in position order (``ledger.store.postgres``), so no event at or below ``head`` can
appear later, and events are never updated or deleted.
"""

from __future__ import annotations

import pickle
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TypeVar

import msgspec
from sqlalchemy import Connection, Engine, text

from ledger.projections.base import opt_str_of, str_of
from ledger.projections.models import (
    PUBLISHED_EVENTS,
    TAINT_RULE_EVENTS,
    counter_set_of,
    model_of,
    published_fill,
    taint_rule_row,
)
from ledger.store.postgres import as_json, copy_in, copy_out, copy_rows, stream_rows
from ledger.types import GlobalPosition, JSONObject, JSONValue

# _KEY_ORDER: rows are written in the order of their table's key index (cluster, then the key), not
# in time order. Every row also goes into a B-tree on its key and a GiST on ``valid``; in key order
# the B-tree insertions land on neighbouring pages. Measured on the h50 history (17,322 ``pod_phases``
# rows, COPY into the empty table with its four indexes): key order 140-160 ms, random order
# 185-285 ms, time order 190-330 ms. Row ids follow key order after a rebuild (they carry no meaning).

_STR = "CASE WHEN jsonb_typeof({0}) = 'string' THEN {0} #>> '{{}}' END"
"""SQL of ``opt_str_of``: the JSON value as text when it is a string, else NULL."""


def _opt_str(path: str) -> str:
    return _STR.format(path)


# ``upper`` of an interval closed by an event at ``closer_at``: greatest(lower, closer_at), as
# ledger.projections.base.close_intervals. The CASE matters: greatest() ignores NULLs, and an interval
# nothing closes must stay open (upper NULL), not become empty.
_UPPER = "CASE WHEN {closer} IS NOT NULL THEN greatest({lower}, {closer}) END"

@dataclass(frozen=True, slots=True)
class _Built:
    """One table built by SQL: its columns and the query (parameter ``head``) that gives its rows in order."""

    table: str
    columns: tuple[str, ...]
    query: str

    def insert(self) -> str:
        """``INSERT INTO table (columns) <query>``: the rows built by the server in the caller's transaction."""
        return f"INSERT INTO {self.table} ({', '.join(self.columns)}) {self.query}"


_POD_PHASES = _Built(
    "pod_phases", ("cluster", "pod_uid", "namespace", "name", "phase", "node", "claims", "valid"), f"""
SELECT cluster, uid, namespace, name, phase, node, claims,
       tstzrange(occurred_at, {_UPPER.format(closer="next_at", lower="occurred_at")}, '[)')
FROM (SELECT global_position, type, cluster, uid, namespace, name, phase, node, claims, occurred_at,
             -- every PodPhaseChanged / PodDeleted closes the pod's one open interval
             lead(occurred_at) OVER (PARTITION BY cluster, uid ORDER BY global_position) AS next_at
      FROM (SELECT global_position, type, cluster, occurred_at, payload ->> 'uid' AS uid,
                   payload ->> 'namespace' AS namespace, payload ->> 'name' AS name,
                   payload ->> 'phase' AS phase, {_opt_str("payload -> 'node'")} AS node,
                   payload -> 'claims' AS claims
            FROM events
            WHERE global_position <= :head AND type IN ('PodPhaseChanged', 'PodDeleted')) AS e) AS w
WHERE type = 'PodPhaseChanged'
ORDER BY cluster, uid, global_position  -- key order (_KEY_ORDER); the window's order: no extra sort
""")
"""``pod_phases`` (reference: ``models.PodPhases``): one interval per ``PodPhaseChanged``."""

_CLAIM_STATES = _Built(
    "claim_states", ("cluster", "claim_uid", "state", "node", "valid"), f"""
WITH e AS (
    SELECT global_position, type, cluster, occurred_at, payload ->> 'uid' AS uid,
           CASE WHEN type = 'ClaimAllocated' THEN {_opt_str("payload -> 'node'")} END AS node
    FROM events
    WHERE global_position <= :head
      AND type IN ('ClaimCreated', 'ClaimAllocated', 'ClaimDeallocated', 'ClaimDeleted')),
w AS (
    SELECT e.*,
           -- the first later event of the claim that closes intervals (all but ClaimCreated)
           min(global_position) FILTER (WHERE type <> 'ClaimCreated') OVER (
               PARTITION BY cluster, uid ORDER BY global_position DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS closer
    FROM e)
SELECT w.cluster, w.uid, CASE WHEN w.type = 'ClaimAllocated' THEN 'allocated' ELSE 'pending' END, w.node,
       tstzrange(w.occurred_at, {_UPPER.format(closer="c.occurred_at", lower="w.occurred_at")}, '[)')
FROM w LEFT JOIN e AS c ON c.global_position = w.closer
WHERE w.type <> 'ClaimDeleted'
ORDER BY w.cluster, w.uid, w.global_position  -- key order (_KEY_ORDER)
""")
"""``claim_states`` (reference: ``models.Claims``): ``ClaimCreated`` opens (closing nothing);
``ClaimAllocated`` / ``ClaimDeallocated`` close and open; ``ClaimDeleted`` closes."""

_CLAIMS = _Built(
    "claims", ("cluster", "uid", "namespace", "name", "origin", "owner_pod", "owner_pod_uid", "requests", "state",
               "created_at", "deletion_requested_at", "deleted_at"), f"""
WITH e AS (
    SELECT global_position, type, cluster, occurred_at, payload ->> 'uid' AS uid,
           CASE WHEN type = 'ClaimCreated' THEN payload END AS payload  -- only ClaimCreated's is read
    FROM events
    WHERE global_position <= :head
      AND type IN ('ClaimCreated', 'ClaimAllocated', 'ClaimDeallocated', 'ClaimDeletionRequested',
                   'ClaimDeleted')),
created AS (  -- the first ClaimCreated makes the row (the reference's ON CONFLICT DO NOTHING)
    SELECT DISTINCT ON (cluster, uid) * FROM e WHERE type = 'ClaimCreated' ORDER BY cluster, uid, global_position),
later AS (  -- what the events after it changed: the last of each kind wins
    SELECT e.cluster, e.uid,
           (array_agg(CASE e.type WHEN 'ClaimAllocated' THEN 'allocated' WHEN 'ClaimDeallocated' THEN 'pending'
                                  ELSE 'deleted' END ORDER BY e.global_position DESC)
                FILTER (WHERE e.type IN ('ClaimAllocated', 'ClaimDeallocated', 'ClaimDeleted')))[1] AS state,
           (array_agg(e.occurred_at ORDER BY e.global_position DESC)
                FILTER (WHERE e.type = 'ClaimDeletionRequested'))[1] AS deletion_requested_at,
           (array_agg(e.occurred_at ORDER BY e.global_position DESC)
                FILTER (WHERE e.type = 'ClaimDeleted'))[1] AS deleted_at
    FROM e JOIN created AS c ON c.cluster = e.cluster AND c.uid = e.uid AND e.global_position > c.global_position
    WHERE e.type <> 'ClaimCreated'
    GROUP BY e.cluster, e.uid)
SELECT c.cluster, c.uid, c.payload ->> 'namespace', c.payload ->> 'name', c.payload ->> 'origin',
       {_opt_str("c.payload -> 'ownerPod'")}, {_opt_str("c.payload -> 'ownerPodUID'")}, c.payload -> 'requests',
       coalesce(l.state, 'pending'), c.occurred_at, l.deletion_requested_at, l.deleted_at
FROM created AS c LEFT JOIN later AS l ON l.cluster = c.cluster AND l.uid = c.uid
ORDER BY c.cluster, c.uid  -- key order (_KEY_ORDER)
""")
"""``claims`` (reference: ``models.Claims``): the current state of each claim."""

_CLAIM_CONSUMERS = _Built(
    "claim_consumers", ("cluster", "claim_uid", "resource", "api_group", "name", "uid", "valid"), f"""
WITH e AS (
    SELECT global_position, type, cluster, occurred_at, payload ->> 'uid' AS uid,
           payload -> 'consumer' ->> 'resource' AS resource, payload -> 'consumer' ->> 'name' AS name,
           {_opt_str("payload -> 'consumer' -> 'apiGroup'")} AS api_group,
           {_opt_str("payload -> 'consumer' -> 'uid'")} AS consumer_uid
    FROM events
    WHERE global_position <= :head AND type IN ('ClaimReserved', 'ClaimUnreserved', 'ClaimDeleted')),
w AS (
    SELECT e.*,
           -- closed by the first later event that is a ClaimReserved / ClaimUnreserved of the same
           -- consumer (resource, name) or a ClaimDeleted of the claim; least() ignores NULLs
           least(lead(global_position) OVER (PARTITION BY cluster, uid, type = 'ClaimDeleted', resource, name
                                             ORDER BY global_position),
                 min(global_position) FILTER (WHERE type = 'ClaimDeleted') OVER (
                     PARTITION BY cluster, uid ORDER BY global_position DESC
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) AS closer
    FROM e)
SELECT w.cluster, w.uid, w.resource, w.api_group, w.name, w.consumer_uid,
       tstzrange(w.occurred_at, {_UPPER.format(closer="c.occurred_at", lower="w.occurred_at")}, '[)')
FROM w LEFT JOIN e AS c ON c.global_position = w.closer
WHERE w.type = 'ClaimReserved'
ORDER BY w.cluster, w.uid, w.global_position  -- key order (_KEY_ORDER)
""")
"""``claim_consumers`` (reference: ``models.ClaimConsumers``): one interval per ``ClaimReserved``."""

SQL_BUILT: dict[str, tuple[_Built, ...]] = {
    "pod_phases": (_POD_PHASES,),
    "claims": (_CLAIMS, _CLAIM_STATES),
    "claim_consumers": (_CLAIM_CONSUMERS,),
}
"""Projection name -> the tables it has and the queries that fill them from ``events``."""

FOLDED = frozenset({"namespace_teams", "device_inventory", "device_classes", "device_taint_rules",
                    "device_allocations"})
"""Projections built by the Python fold (:class:`_Fold`)."""

_FOLD_TYPES = ("TeamAssigned", "DevicePublished", "DeviceUpdated", "DeviceWithdrawn", "DeviceClassDefined",
               "DeviceClassChanged", "DeviceClassDeleted", *TAINT_RULE_EVENTS, "ClaimAllocated", "ClaimDeallocated")
"""Every event type the folded projections read (``device_allocations`` reads the first four too)."""


def supports(names: Collection[str]) -> bool:
    """Whether :func:`build` can rebuild exactly the projections ``names``.

    ``device_allocations`` needs ``namespace_teams`` and ``device_inventory`` rebuilt with it: the
    reference reads those tables as of each allocation's position, which only holds when they are rebuilt
    in the same pass (rebuilt alone, it would read their current rows instead).
    """
    known = set(SQL_BUILT) | FOLDED
    if not set(names) <= known:
        return False
    return "device_allocations" not in names or {"namespace_teams", "device_inventory"} <= set(names)


# --- the Python fold ---------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Interval:
    """One row of an interval table in memory: its columns (without ``row_id`` and ``valid``) and bounds."""

    values: list[object]
    lower: datetime
    upper: datetime | None = None

    def close(self, end: datetime) -> None:
        """``valid = [lower, greatest(lower, end))``, as :func:`ledger.projections.base.close_intervals`."""
        self.upper = max(self.lower, end)

    @property
    def open(self) -> bool:
        return self.upper is None

    def contains(self, at: datetime) -> bool:
        """``valid @> at`` (an empty interval contains nothing)."""
        return self.lower <= at and (self.upper is None or at < self.upper)

    def row(self) -> list[object]:
        """The row for ``COPY``: the values, then ``valid`` as range text (PostgreSQL parses it)."""
        lower = self.lower.isoformat()
        if self.upper is None:
            valid = f"[{lower},)"
        elif self.upper == self.lower:
            valid = "empty"  # what tstzrange(x, x, '[)') is
        else:
            valid = f"[{lower},{self.upper.isoformat()})"
        return [*self.values, valid]


_I = TypeVar("_I", bound=_Interval)


def _latest_containing(rows: Sequence[_I], at: datetime) -> _I | None:
    """The row with the greatest lower bound containing ``at``; among equal bounds the one opened last.

    Reference: ``... WHERE valid @> :at ORDER BY lower(valid) DESC LIMIT 1``; the batch path breaks ties
    by ``row_id`` (the one inserted last), and so does this.
    """
    best: _I | None = None
    for row in rows:
        if row.contains(at) and (best is None or row.lower >= best.lower):
            best = row
    return best


def _j(value: JSONValue) -> str:
    return as_json(value)  # jsonb normalises key order, spacing and number spelling


_DECODER = msgspec.json.Decoder()
"""Payload decoder of the fold (msgspec, C): payloads come from ``jsonb`` as text, so they are valid JSON
with no NaN; it decodes them to the same values as ``json.loads``, about twice as fast."""


_K = TypeVar("_K", bound=tuple[str, ...])

_TEAM, _ALLOC_TEAM = 2, 4
"""Indexes of ``team`` in a ``namespace_teams`` row and in a ``device_allocations`` row."""
_NODE, _MODEL, _CONFLICT, _AWAITING = 13, 14, 15, 16
"""Indexes of ``node``, ``model``, ``conflict`` and ``awaiting_device_from`` in a ``device_allocations`` row."""

_ALLOCATION_COLUMNS = ("cluster", "claim_uid", "namespace", "claim", "team", "request", "device_class", "driver",
                       "pool", "device", "share_id", "consumed_capacity", "admin_access", "node", "model",
                       "conflict", "awaiting_device_from")
_TAINT_RULE_COLUMNS = ("device_selector", "effect", "taint")
"""The ``device_taint_rules`` columns after cluster and name, as :func:`taint_rule_row` gives them."""
_INVENTORY_COLUMNS = ("cluster", "driver", "pool", "device", "node", "slice_name", "model", "counter_set",
                      "allow_multiple_allocations", "attributes", "capacity", "consumes_counters", "taints")


@dataclass(slots=True, eq=False)
class _Allocation(_Interval):
    """A ``device_allocations`` row, with the lookups the fold makes on it."""

    admin_access: bool = False
    conflict: bool = False
    awaiting_from: datetime | None = None
    """``awaiting_device_from``: the allocation's start when no inventory row held the device then as it was
    applied (a relabel's piece keeps the allocation's start), until a device event fills it."""

    @property
    def waiting(self) -> bool:
        """Whether a device event may still fill the row."""
        return self.awaiting_from is not None

    def row(self) -> list[object]:
        self.values[_CONFLICT] = self.conflict
        self.values[_AWAITING] = self.awaiting_from
        return _Interval.row(self)


@dataclass(slots=True, eq=False)
class _Inventory(_Interval):
    node: str | None = None
    model: str | None = None
    allow_multiple_allocations: bool = False


class _Fold:
    """The five folded projections over events in global position order (see the module docstring)."""

    def __init__(self) -> None:
        self.teams: dict[tuple[str, str], list[_Interval]] = {}
        self.team_rows: list[_Interval] = []
        self.inventory: dict[tuple[str, str, str, str], list[_Inventory]] = {}
        self.inventory_rows: list[_Inventory] = []
        self.classes: dict[tuple[str, str], _Interval] = {}
        self.class_rows: list[_Interval] = []
        self.rules: dict[tuple[str, str], _Interval] = {}
        self.rule_rows: list[_Interval] = []
        # Open allocations, reached three ways (as the reference's UPDATEs select them): by device for
        # conflicts, by claim for ClaimDeallocated, by namespace for a relabel. Lists keep closed rows
        # until next visited (pruned then); closed rows are final and go to ``closed``.
        self.by_device: dict[tuple[str, str, str, str], list[_Allocation]] = {}
        self.by_claim: dict[tuple[str, str], list[_Allocation]] = {}
        self.by_namespace: dict[tuple[str, str], list[_Allocation]] = {}
        self.open_allocations: dict[int, _Allocation] = {}
        self.closed: list[_Allocation] = []
        # Allocations waiting for their device (``waiting``), open or closed, by device: a later DevicePublished
        # / DeviceUpdated may still fill them, so closed ones are held back from ``closed`` until filled (or the
        # end). Few: only allocations applied before any inventory row of their device held their start.
        self.waiting: dict[tuple[str, str, str, str], list[_Allocation]] = {}
        self.held_back: dict[int, _Allocation] = {}

    def apply(self, event_type: str, cluster: str, at: datetime, p: JSONObject) -> None:
        """Apply one event to every folded projection, in the order of ``models.ALL``."""
        if event_type == "TeamAssigned":
            self._assign_team(cluster, at, p)
            self._relabel(cluster, at, p)
        elif event_type == "ClaimAllocated":
            self._allocate(cluster, at, p)
        elif event_type == "ClaimDeallocated":
            for held in self._open(self.by_claim, (cluster, str_of(p, "uid"))):
                self._close_allocation(held, at)
        elif event_type.startswith("DeviceClass"):
            key = (cluster, str_of(p, "name"))
            if (old := self.classes.pop(key, None)) is not None:
                old.close(at)
            if event_type != "DeviceClassDeleted":
                self.classes[key] = spec = _Interval([cluster, key[1], _j(p["spec"])], at)
                self.class_rows.append(spec)
        elif event_type.startswith("DeviceTaintRule"):
            # device_taint_rules (reference: models.DeviceTaintRules): one interval per rule spec
            key = (cluster, str_of(p, "name"))
            if (old_rule := self.rules.pop(key, None)) is not None:
                old_rule.close(at)
            if event_type != "DeviceTaintRuleDeleted":
                row = taint_rule_row(p)
                self.rules[key] = rule = _Interval([cluster, key[1], *(row[c] for c in _TAINT_RULE_COLUMNS)], at)
                self.rule_rows.append(rule)
        else:
            self._device(event_type, cluster, at, p)
            if event_type in PUBLISHED_EVENTS and self.waiting:
                self._fill(cluster, at, p)

    # namespace_teams (reference: models.NamespaceTeams)
    def _assign_team(self, cluster: str, at: datetime, p: JSONObject) -> None:
        key = (cluster, str_of(p, "namespace"))
        rows = self.teams.setdefault(key, [])
        for row in rows:
            if row.open:
                row.close(at)
        row = _Interval([cluster, key[1], str_of(p, "team")], at)
        rows.append(row)
        self.team_rows.append(row)

    # device_inventory (reference: models.DeviceInventory)
    def _device(self, event_type: str, cluster: str, at: datetime, p: JSONObject) -> None:
        key = (cluster, str_of(p, "driver"), str_of(p, "pool"), str_of(p, "device"))
        rows = self.inventory.setdefault(key, [])
        for old in rows:
            if old.open:
                old.close(at)
        if event_type == "DeviceWithdrawn":
            return
        attributes, counters = p["attributes"], p["consumesCounters"]
        assert isinstance(attributes, dict) and isinstance(counters, list)
        node, model, shareable = opt_str_of(p, "node"), model_of(attributes), bool(p["allowMultipleAllocations"])
        row = _Inventory([*key, node, str_of(p, "sliceName"), model, counter_set_of(counters), shareable,
                          _j(attributes), _j(p["capacity"]), _j(counters), _j(p["taints"])], at,
                         node=node, model=model, allow_multiple_allocations=shareable)
        rows.append(row)
        self.inventory_rows.append(row)

    # device_allocations (reference: models.DeviceAllocations)
    @staticmethod
    def _open(index: dict[_K, list[_Allocation]], key: _K) -> list[_Allocation]:
        rows = index.get(key)
        if not rows:
            return []
        live = [r for r in rows if r.upper is None]
        if len(live) != len(rows):
            index[key] = live
        return live

    def _close_allocation(self, row: _Allocation, end: datetime) -> None:
        row.close(end)
        del self.open_allocations[id(row)]
        if row.waiting and row.upper != row.lower:  # an empty row is never filled (the reference: NOT isempty)
            self.held_back[id(row)] = row
        else:
            self.closed.append(row)

    def _add_allocation(self, row: _Allocation) -> None:
        v = row.values
        cluster, namespace = str(v[0]), str(v[2])
        device = (cluster, str(v[7]), str(v[8]), str(v[9]))
        self.by_device.setdefault(device, []).append(row)
        self.by_claim.setdefault((cluster, str(v[1])), []).append(row)
        self.by_namespace.setdefault((cluster, namespace), []).append(row)
        self.open_allocations[id(row)] = row
        if row.waiting:
            self.waiting.setdefault(device, []).append(row)

    def _fill(self, cluster: str, at: datetime, p: JSONObject) -> None:
        """Fill the rows waiting for this device whose allocation began at or after ``at`` (reference:
        ``models.FILL_UNPUBLISHED``): model, node unless the device has none, no conflict on a shareable device, no
        longer waiting."""
        key = (cluster, str_of(p, "driver"), str_of(p, "pool"), str_of(p, "device"))
        rows = self.waiting.get(key)
        if not rows:
            return
        model, node, shareable = published_fill(p)
        still: list[_Allocation] = []
        for row in rows:
            if row.upper == row.lower:  # empty (closed where it began: already in ``closed``): never filled
                continue
            assert row.awaiting_from is not None  # only waiting rows are listed
            if row.awaiting_from < at:  # the allocation began before the device's event (not only this piece)
                still.append(row)
                continue
            row.values[_MODEL] = model
            if node is not None:
                row.values[_NODE] = node
            row.conflict = row.conflict and not shareable
            row.awaiting_from = None
            self._release(row)
        if still:
            self.waiting[key] = still
        else:
            del self.waiting[key]

    def _release(self, row: _Allocation) -> None:
        """A row that no fill can change any more goes to ``closed`` once it is closed."""
        if self.held_back.pop(id(row), None) is not None:
            self.closed.append(row)

    def _allocate(self, cluster: str, at: datetime, p: JSONObject) -> None:
        namespace, uid, claim = str_of(p, "namespace"), str_of(p, "uid"), str_of(p, "name")
        held = _latest_containing(self.teams.get((cluster, namespace), ()), at)
        team = str(held.values[_TEAM]) if held is not None else namespace
        results = p["results"]
        assert isinstance(results, list)
        for result in results:
            assert isinstance(result, dict)
            key = (cluster, str_of(result, "driver"), str_of(result, "pool"), str_of(result, "device"))
            inv = _latest_containing(self.inventory.get(key, ()), at)
            admin = bool(result.get("adminAccess"))
            conflict = False
            if not admin and not (inv is not None and inv.allow_multiple_allocations):
                # Reference: UPDATE ... SET conflict = true WHERE <device> AND upper_inf(valid)
                # AND NOT admin_access AND claim_uid <> :uid
                for other in self._open(self.by_device, key):
                    if not other.admin_access and other.values[1] != uid:
                        other.conflict = conflict = True
            node = (inv.node if inv is not None else None) or opt_str_of(p, "node")
            self._add_allocation(_Allocation(
                [cluster, uid, namespace, claim, team, str_of(result, "request"), opt_str_of(result, "deviceClassName"),
                 key[1], key[2], key[3], opt_str_of(result, "shareID"), _j(result.get("consumedCapacity") or {}), admin,
                 node, inv.model if inv is not None else None, False, None], at, admin_access=admin,
                conflict=conflict, awaiting_from=at if inv is None else None))

    def _relabel(self, cluster: str, at: datetime, p: JSONObject) -> None:
        """Split the namespace's open intervals whose team differs (``DeviceAllocations._relabel``)."""
        team = str_of(p, "team")
        for row in list(self._open(self.by_namespace, (cluster, str_of(p, "namespace")))):
            if row.values[_ALLOC_TEAM] == team:
                continue
            if row.lower < at:  # close at `at` and reopen with the new team from `at`
                copy = _Allocation(list(row.values), at, admin_access=row.admin_access, conflict=row.conflict,
                                   awaiting_from=row.awaiting_from)
                copy.values[_ALLOC_TEAM] = team
                self._close_allocation(row, at)
                self._add_allocation(copy)
            else:  # it starts at or after `at` (out of order): it just takes the new team
                row.values[_ALLOC_TEAM] = team

    def take_closed(self) -> list[list[object]]:
        """Rows of the allocations closed so far and final (a closed row changes only while it waits for its
        device, and those are held back); forgets them."""
        rows = [r.row() for r in self.closed]
        self.closed.clear()
        return rows

    def take_rest(self) -> list[list[object]]:
        """At the end of the fold: the rows of every allocation not taken yet (closed, held back, open)."""
        return [*self.take_closed(), *(r.row() for r in self.held_back.values()),
                *(r.row() for r in self.open_allocations.values())]


_FETCH_ROWS = 5000
"""Events fetched per round trip from the server-side cursor (bounds the fold's input in memory)."""
_FLUSH_ROWS = 50_000
"""Closed ``device_allocations`` rows kept before they are spooled (bounds the fold's output in memory)."""


class _Stopped(Exception):
    """The build gave up (a statement failed or was interrupted): the fold thread stops early."""


@dataclass(slots=True)
class _Folded:
    """What the fold thread hands back: the rows of each folded table, ready for ``COPY``.

    ``allocation_chunks`` allocation chunks wait in the spool file; ``allocations`` are the rest.
    """

    teams: list[list[object]]
    inventory: list[list[object]]
    classes: list[list[object]]
    taint_rules: list[list[object]]
    allocations: list[list[object]]
    allocation_chunks: int


def _fold_events(engine: Engine, head: GlobalPosition, spool: IO[bytes], stop: threading.Event, *,
                 allocations: bool) -> _Folded:
    """Fold the events of :data:`_FOLD_TYPES` up to ``head`` on a connection of its own (the fold thread).

    Closed ``device_allocations`` rows are pickled to ``spool`` in chunks of about :data:`_FLUSH_ROWS`,
    each already in key order (:func:`_by_device`), or dropped unless ``allocations``; the other rows come
    back formatted, so that the build's transaction only has to copy them.

    Why its own connection: a connection runs one statement at a time, and the build's transaction is busy
    with the SQL-built tables meanwhile (see :func:`build`). Reading ``events`` outside that transaction
    is safe: events are never updated or deleted, and every event at or below ``head`` was committed before
    ``head`` was read (appends commit in position order), so this snapshot holds exactly those events.

    Raises:
        _Stopped: ``stop`` was set.
        AssertionError: a payload lacks a field the translator always writes.
        sqlalchemy.exc.SQLAlchemyError: reading the events failed.
    """
    fold, chunks = _Fold(), 0
    with engine.begin() as conn:
        for batch in stream_rows(conn, "SELECT type, cluster, occurred_at, payload::text FROM events "
                                 "WHERE global_position <= %s AND type = ANY(%s) ORDER BY global_position",
                                 (head, list(_FOLD_TYPES)), size=_FETCH_ROWS):
            if stop.is_set():
                raise _Stopped
            for event_type, cluster, at, payload in batch:
                assert isinstance(event_type, str) and isinstance(cluster, str) and isinstance(at, datetime)
                assert isinstance(payload, str)
                fold.apply(event_type, cluster, at, _DECODER.decode(payload))
            if len(fold.closed) >= _FLUSH_ROWS:
                closed = fold.take_closed()
                if allocations:
                    pickle.dump(_by_device(closed), spool, protocol=pickle.HIGHEST_PROTOCOL)
                    chunks += 1
    # namespace_teams and device_inventory keep creation order, not _KEY_ORDER: the batch path of later
    # catch-ups breaks ties between intervals of one key with equal starts by row id (the one inserted
    # last), as _latest_containing does here.
    return _Folded(teams=[r.row() for r in fold.team_rows], inventory=[r.row() for r in fold.inventory_rows],
                   classes=[r.row() for r in fold.class_rows], taint_rules=[r.row() for r in fold.rule_rows],
                   allocations=_by_device(fold.take_rest()),
                   allocation_chunks=chunks)


def _spooled(spool: IO[bytes], chunks: int) -> Iterator[list[list[object]]]:
    """The allocation chunks :func:`_fold_events` pickled to ``spool``, read back in order."""
    spool.seek(0)
    for _ in range(chunks):
        rows: list[list[object]] = pickle.load(spool)  # our own temporary file, written above
        yield rows


def _write_folded(conn: Connection, names: Collection[str], folded: _Folded, spool: IO[bytes],
                  built: Callable[[str], None]) -> None:
    """COPY the folded tables in ``names`` in the build's transaction, telling ``built`` each table's name."""
    if "namespace_teams" in names:
        copy_rows(conn, "namespace_teams", ["cluster", "namespace", "team", "valid"], folded.teams)
        built("namespace_teams")
    if "device_inventory" in names:
        copy_rows(conn, "device_inventory", [*_INVENTORY_COLUMNS, "valid"], folded.inventory)
        built("device_inventory")
    if "device_classes" in names:
        copy_rows(conn, "device_classes", ["cluster", "name", "spec", "valid"], folded.classes)
        built("device_classes")
    if "device_taint_rules" in names:
        copy_rows(conn, "device_taint_rules", ["cluster", "name", *_TAINT_RULE_COLUMNS, "valid"], folded.taint_rules)
        built("device_taint_rules")
    if "device_allocations" in names:
        columns = [*_ALLOCATION_COLUMNS, "valid"]
        for chunk in _spooled(spool, folded.allocation_chunks):
            copy_rows(conn, "device_allocations", columns, chunk)
        copy_rows(conn, "device_allocations", columns, folded.allocations)
        built("device_allocations")


def _by_device(rows: list[list[object]]) -> list[list[object]]:
    """``device_allocations`` rows in the order of its key index (cluster, driver, pool, device): _KEY_ORDER."""
    rows.sort(key=lambda r: (str(r[0]), str(r[7]), str(r[8]), str(r[9])))
    return rows


def build(conn: Connection, *, names: Collection[str], head: GlobalPosition,
          built: Callable[[str], None] | None = None) -> None:
    """Fill the (empty) tables of the projections ``names`` from the events up to ``head``.

    The caller has emptied those tables and holds their checkpoints in the same transaction; this
    writes rows only (no checkpoint). Row ids follow no particular order (they carry no meaning).

    Args:
        conn: the rebuild's transaction.
        names: projection names; :func:`supports` must accept them.
        head: the last global position to apply (1-based; events above it are left for catch-up).
        built: told each table's name once its rows are written (in this transaction, from the caller's thread),
            so that a long build shows its steps: the tables are filled by single statements and a fold whose
            share of the work depends on the history, so no count of events could say how far it is.

    Raises:
        ValueError: :func:`supports` refuses ``names``.
        AssertionError: a payload lacks a field the translator always writes (a corrupt event stops the
            rebuild, which rolls back whole).
        sqlalchemy.exc.SQLAlchemyError: a statement, a query of another connection or a ``COPY`` failed (e.g.
            a NOT NULL column got no value from a payload); the transaction rolls back and the old read
            models stay.
    """
    if not supports(names):
        raise ValueError(f"cannot rebuild {sorted(names)} from the whole history at once")
    # Sorts of the window statements stay in memory at this size (the default 4 MB spills them to disk);
    # SET LOCAL ends with the transaction.
    conn.execute(text("SET LOCAL work_mem = '64MB'"))
    by_sql = [b for name, group in SQL_BUILT.items() if name in names for b in group]
    folded = bool(FOLDED & set(names))
    # Work spread over both cores: this transaction's connection runs the first table's INSERT ... SELECT;
    # meanwhile two threads with connections of their own run the fold (Python) and the queries of the
    # other SQL-built tables, whose rows they spool to temporary files as COPY text; this connection then
    # copies the spools in, as raw bytes (one connection runs one statement at a time, and only this
    # one writes, so the swap stays atomic). psycopg releases the GIL while it waits on the server.
    direct, piped = by_sql[:1], by_sql[1:]
    stop = threading.Event()
    with ExitStack() as stack:
        spool = stack.enter_context(tempfile.TemporaryFile(prefix="ledger-rebuild-"))
        outs: list[IO[bytes]] = [stack.enter_context(tempfile.TemporaryFile(prefix=f"ledger-rebuild-{b.table}-"))
                                 for b in piped]
        # Entered after the files, so left before them: the threads are done before their files close.
        executor = stack.enter_context(ThreadPoolExecutor(2, thread_name_prefix="ledger-rebuild"))
        folding = (executor.submit(_fold_events, conn.engine, head, spool, stop,
                                   allocations="device_allocations" in names) if folded else None)
        copying = [executor.submit(_copy_out, conn.engine, b, head, out, stop)
                   for b, out in zip(piped, outs, strict=True)]
        work: list[Future[_Folded] | Future[None]] = [*copying, *([folding] if folding is not None else [])]
        told = built if built is not None else _quiet
        try:
            for b in direct:
                _raise_failed(work)  # a failed thread stops the build now rather than at the end
                conn.execute(text(b.insert()), {"head": head})
                told(b.table)
            for b, out, copied in zip(piped, outs, copying, strict=True):
                copied.result()
                out.seek(0)
                copy_in(conn, b.table, b.columns, out)
                told(b.table)
            if folding is not None:
                _write_folded(conn, names, folding.result(), spool, told)
        except BaseException:
            stop.set()  # the executor's exit then waits at most one read for the threads to give up
            raise


def _quiet(table: str) -> None:
    """The ``built`` callback of a build nobody watches."""


def _raise_failed(work: Sequence[Future[_Folded] | Future[None]]) -> None:
    """Raise the error of the first finished thread that failed, if any."""
    for future in work:
        if future.done():
            future.result()


def _copy_out(engine: Engine, built: _Built, head: GlobalPosition, out: IO[bytes], stop: threading.Event) -> None:
    """Run ``built``'s query on a connection of its own and write its rows to ``out`` as ``COPY`` text.

    Events up to ``head`` are committed and never change (see :func:`_fold_events`), so this snapshot
    gives the rows the build's transaction would.

    Raises:
        _Stopped: ``stop`` was set.
        sqlalchemy.exc.DBAPIError: the query failed.
    """

    def write(block: bytes) -> None:
        if stop.is_set():
            raise _Stopped
        out.write(block)

    with engine.begin() as conn:
        conn.execute(text("SET LOCAL work_mem = '64MB'"))  # as the build's transaction
        # head is an int (GlobalPosition), formatted into the statement: COPY takes no parameters.
        copy_out(conn, built.query.replace(":head", str(int(head))), write)
