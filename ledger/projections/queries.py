"""Read-side queries over the read models: occupancy, usage, claims and idle claims at any instant.

Every "at time T" question is answered with ``valid @> T`` on the GiST-indexed intervals, never by
replaying events. Results are plain JSON-ready dicts with Kubernetes spelling (``shareID``,
``adminAccess``): the exact bodies the CLI prints with ``--output json`` and the REST API returns.
Times in results are RFC 3339 strings in UTC; device-hours are floats (hours).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Literal

from sqlalchemy import Connection, Row, text

from ledger.errors import Invalid, UnknownDeviceClass, shorten, shorten_repr
from ledger.projections import counts
from ledger.projections.base import TERMINAL, TERMINAL_SQL, key_arrays, request_count
from ledger.projections.base import cluster_filter as _cluster_filter
from ledger.projections.base import json_value as _json
from ledger.projections.counter_sets import counter_set_state
from ledger.projections.selectors import DeviceView, expressions_of, selects
from ledger.projections.split import Interval, allocation_fraction, shares, split, split_columns
from ledger.recorded import seconds_text
from ledger.types import JSONObject, JSONValue

GroupBy = Literal["team", "namespace", "deviceClass", "model", "node", "cluster"]
GROUP_BY: Mapping[str, str] = {"team": "team", "namespace": "namespace", "deviceClass": "device_class",
                               "model": "model", "node": "node", "cluster": "cluster"}
"""``groupBy`` value -> ``device_allocations`` column. ``cluster`` answers per cluster of a ledger that records
several; every other grouping adds the clusters' device-hours together unless a ``cluster`` filter is given."""
IDLE_CATEGORIES = ("unreserved", "inactive-consumers", "unreferenced")
NO_OVERRIDES: Mapping[str, str] = MappingProxyType({})
"""No ``[teams] overrides`` (namespace -> team): every row keeps the team the ledger recorded."""


def rfc3339(value: datetime) -> str:
    """Format an aware datetime as RFC 3339 UTC with a ``Z`` (microseconds only when non-zero)."""
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Consumer:
    """A ``reservedFor`` entry of a claim at an instant, with whether it is live / Running then."""

    claim_uid: str
    resource: str
    name: str
    uid: str | None
    live: bool
    running: bool


def consumers_at(conn: Connection, at: datetime, cluster: str | None,
                 claims: Sequence[tuple[str, str]] | None = None) -> dict[str, list[Consumer]]:
    """Consumers in ``reservedFor`` at ``at`` per claim uid, with liveness of pods at ``at``.

    A pod consumer is live unless the ledger saw it terminal (Succeeded/Failed) or deleted at ``at``;
    a pod never seen is presumed live (DESIGN §11.2: only a pod known to be gone is stale). Non-pod
    consumers are live holders of their own kind.

    Args:
        claims: only these (cluster, claim uid) pairs (read through ``claim_consumers_key_idx``);
            ``None`` reads every claim's consumers at ``at``.

    Returns:
        Consumers by ``"<cluster>\\x00<claim uid>"``, each list ordered by consumer name.
    """
    rows = conn.execute(text(
        "SELECT c.cluster, c.claim_uid, c.resource, c.name, c.uid, "
        " (SELECT p.phase FROM pod_phases p WHERE p.cluster = c.cluster AND p.pod_uid = c.uid AND p.valid @> :at "
        "  LIMIT 1) AS phase, "
        " EXISTS (SELECT 1 FROM pod_phases p WHERE p.cluster = c.cluster AND p.pod_uid = c.uid) AS known "
        "FROM claim_consumers c" + (
            " JOIN unnest(CAST(:claim_clusters AS text[]), CAST(:claim_uids AS text[])) AS k(cluster, claim_uid) "
            "ON k.cluster = c.cluster AND k.claim_uid = c.claim_uid" if claims is not None else "") +
        " WHERE c.valid @> :at" + _cluster_filter(cluster, "c") + " ORDER BY c.name"),
        {"at": at, "cluster": cluster, "claim_clusters": [k[0] for k in claims or ()],
         "claim_uids": [k[1] for k in claims or ()]}).all()
    out: dict[str, list[Consumer]] = defaultdict(list)
    for r in rows:
        if r.resource == "pods":
            live = (r.phase is not None and r.phase not in TERMINAL) or not r.known
            running = r.phase == "Running" or not r.known
        else:
            live = running = True
        out[f"{r.cluster}\x00{r.claim_uid}"].append(
            Consumer(claim_uid=r.claim_uid, resource=r.resource, name=r.name, uid=r.uid, live=live, running=running))
    return out


OCCUPANCY_DEFAULT_LIMIT = 100
"""Devices per occupancy page when the caller does not say (the API's default ``limit``)."""
OCCUPANCY_MAX_LIMIT = 1000
"""Most devices one occupancy page may hold (the API's largest ``limit``)."""

DeviceSortKey = tuple[str, str, str, str]
"""``(cluster, driver, pool, device)``: the order of occupancy pages, and where the next page starts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OccupancyScope:
    """Which devices an occupancy question covers: filters, and optionally the teams a caller may see.

    ``cluster``/``node``/``driver``/``pool`` filter ``device_inventory`` and ``device_allocations`` rows
    on their own columns (a device held on another node than the filtered one shows as ``offSlice``, as
    before paging). ``teams`` limits the answer to allocations billed to those teams (a team-limited API
    token): only devices with at least one such allocation are listed, only those allocations are shown,
    and totals count those devices one by one (no counter-set merging; see :func:`occupancy`).
    ``overrides`` are the configuration's ``[teams] overrides`` as sorted ``(namespace, team)`` pairs: an
    allocation in an overridden namespace is billed to, shown as, and visible to the override's team.
    ``device_class`` names the DeviceClass the question is about and ``members`` are the keys of the
    devices in it at T (:func:`device_class_members`); every statement keeps only those devices
    (``None``: no class filter). The members are computed in Python (CEL), so a scope with a class is
    built by :func:`occupancy_scope`, never by hand.
    """

    cluster: str | None = None
    node: str | None = None
    driver: str | None = None
    pool: str | None = None
    teams: frozenset[str] | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    device_class: str | None = None
    members: frozenset[DeviceSortKey] | None = None

    def params(self) -> dict[str, object]:
        """Bind parameters of the filters (``teams`` as a sorted list; see :meth:`team_filter`; the
        DeviceClass members as one text a key, ``:members``, see :meth:`member_filter`)."""
        granted = [ns for ns, team in self.overrides if self.teams is not None and team in self.teams]
        return {"cluster": self.cluster, "node": self.node, "driver": self.driver, "pool": self.pool,
                "teams": sorted(self.teams) if self.teams is not None else None,
                "overridden": [ns for ns, _ in self.overrides], "granted": granted,
                "members": sorted(_member_text(k) for k in self.members) if self.members is not None else [],
                "device_class": self.device_class}

    def team_filter(self, alias: str) -> str:
        """``AND`` clause keeping the rows of ``alias`` billed to ``teams`` after the overrides ('' if unlimited).

        Without overrides it is ``team = ANY(:teams)`` (index-friendly); with them, a row of an overridden
        namespace is kept when the override's team is visible (``:granted``), whatever team was recorded.
        """
        if self.teams is None:
            return ""
        if not self.overrides:
            return f" AND {alias}.team = ANY(:teams)"
        return (f" AND (({alias}.team = ANY(:teams) AND NOT {alias}.namespace = ANY(:overridden)) "
                f"OR {alias}.namespace = ANY(:granted))")

    def where(self, alias: str, *, members: bool = True) -> str:
        """``AND alias.col = :col`` for every filter that is set (``teams`` excluded), and, with a
        DeviceClass and ``members`` true, ``AND alias``'s device key is one of ``members`` (a statement
        that finds its class's devices another way passes ``members=False``: the key list is matched by a
        join the planner sizes badly, one probe a member)."""
        columns = "".join(f" AND {alias}.{col} = :{col}"
                          for col, value in (("cluster", self.cluster), ("node", self.node), ("driver", self.driver),
                                             ("pool", self.pool)) if value is not None)
        if self.members is None or not members:
            return columns
        return columns + self.member_filter(alias)

    def member_filter(self, alias: str) -> str:
        """``AND alias``'s device key is one of ``members`` ('' without a DeviceClass).

        Written as ``= ANY(:members)`` over one text per key (:func:`_member_text`), not as ``IN`` a join
        of the unnested keys: PostgreSQL tests ``= ANY`` of a large array by a hash lookup per row, so an
        index walk in key order with ``LIMIT`` stays a walk, whereas the join was planned member by member
        (20 s a page after the first on the 10 M-event ledger, for a class of 40,000 devices)."""
        if self.members is None:
            return ""
        return (f" AND ({alias}.cluster || chr(31) || {alias}.driver || chr(31) || {alias}.pool || chr(31) "
                f"|| {alias}.device) = ANY(CAST(:members AS text[]))")


def _member_text(key: DeviceSortKey) -> str:
    """A device key as one text, its parts joined by U+001F, for :meth:`OccupancyScope.member_filter`. Two keys
    give one text only if a part holds U+001F, which the API server's validation of cluster-scoped names,
    driver names and pool and device names never lets through."""
    return "\x1f".join(key)


@dataclass(frozen=True, slots=True, kw_only=True)
class OccupancyPage:
    """One page of an occupancy answer.

    ``body`` is ``{"at", "totals", "devices"}`` (see :func:`occupancy`); ``next_after`` is the sort key
    of the page's last device when more devices follow (pass it as ``after`` for the next page), else
    ``None``.
    """

    body: JSONObject
    next_after: DeviceSortKey | None


_KEY = "{a}.cluster, {a}.driver, {a}.pool, {a}.device"
_ALLOCATION_ORDER = "a.namespace, a.claim, a.request, a.share_id NULLS FIRST, a.row_id"
_LIVE_CONSUMER = (
    "(c.resource <> 'pods' "
    " OR NOT EXISTS (SELECT 1 FROM pod_phases p WHERE p.cluster = c.cluster AND p.pod_uid = c.uid) "
    " OR EXISTS (SELECT 1 FROM pod_phases p WHERE p.cluster = c.cluster AND p.pod_uid = c.uid "
    f"  AND p.valid @> :at AND p.phase NOT IN ({TERMINAL_SQL})))")
"""SQL of :func:`consumers_at`'s liveness: a pod is live unless seen terminal at T or gone; others are live."""


def _multi_consumer_claims(scope: OccupancyScope) -> str:
    """CTE body: (cluster, claim_uid) of claims with more than one live consumer at ``:at``.

    Claims with fewer than two ``reservedFor`` rows at T cannot qualify, so liveness (two ``pod_phases``
    probes per consumer) is checked only for the others.
    """
    return (
        "SELECT c.cluster, c.claim_uid FROM claim_consumers c "
        " JOIN (SELECT m.cluster, m.claim_uid FROM claim_consumers m WHERE m.valid @> :at"
        + _cluster_filter(scope.cluster, "m") + " GROUP BY m.cluster, m.claim_uid HAVING count(*) > 1) AS several "
        " ON several.cluster = c.cluster AND several.claim_uid = c.claim_uid "
        f"WHERE c.valid @> :at AND {_LIVE_CONSUMER} GROUP BY c.cluster, c.claim_uid HAVING count(*) > 1")


def occupancy_totals_statement(scope: OccupancyScope) -> str:
    """The SQL of :func:`occupancy_totals` (parameters ``:at`` plus :meth:`OccupancyScope.params`).

    Exposed so the plan test runs the very statement the query runs.
    """
    teams = scope.team_filter("a")
    # A DeviceClass keeps the member devices after the grouping: tested on each allocation, the member list
    # was joined member by member into the allocations' key index (40,000 probes, ~2 s on the 10 M-event
    # ledger); the allocations held at T come from the GiST index either way.
    held = (
        "SELECT * FROM (SELECT a.cluster, a.driver, a.pool, a.device, "
        " count(*) FILTER (WHERE NOT a.admin_access) AS holding, "
        " min(a.claim_uid) FILTER (WHERE NOT a.admin_access) AS claim_uid "
        f"FROM device_allocations a WHERE a.valid @> :at{scope.where('a', members=False)}{teams} "
        f"GROUP BY a.cluster, a.driver, a.pool, a.device) AS a WHERE true{scope.member_filter('a')}")
    shared = ("(h.holding > 1 OR (h.holding = 1 AND EXISTS (SELECT 1 FROM multi m "
              "WHERE m.cluster = h.cluster AND m.claim_uid = h.claim_uid)))")
    if scope.teams is not None:
        # Team-limited: the devices holding a visible allocation, each counted on its own. One held off-slice
        # (no inventory row at T, the test :func:`_holders` makes) counts only while a visible
        # non-adminAccess allocation holds it: adminAccess never occupies (DESIGN §5, §11.4).
        on_slice = ("EXISTS (SELECT 1 FROM device_inventory i WHERE i.cluster = h.cluster AND i.driver = h.driver "
                    f"AND i.pool = h.pool AND i.device = h.device AND i.valid @> :at{scope.where('i', members=False)})")
        return (f"WITH multi AS ({_multi_consumer_claims(scope)}), held AS ({held}) "
                f"SELECT count(*) FILTER (WHERE h.holding > 0 OR {on_slice}) AS devices, "
                "count(*) FILTER (WHERE h.holding > 0) AS allocated, "
                f"count(*) FILTER (WHERE {shared}) AS shared FROM held h")
    # Devices consuming one counter set are one unit (one piece of hardware); an allocation whose device
    # left its slice (no inventory row at T) is its own unit, named as the old Python code named it, but
    # only while a non-adminAccess allocation holds it: adminAccess never occupies, so a device held by
    # adminAccess alone after leaving its slice is neither in the inventory nor occupied (DESIGN §5, §11.4).
    busy_sets, busy = "", ""
    if scope.members is not None:
        # With a DeviceClass, a unit is also allocated when a device of its counter set outside the class holds
        # it: a GPU allocated whole leaves none of its MIG partitions free, though none of them is allocated.
        busy_sets = (", busy AS (SELECT DISTINCT o.cluster, o.driver, o.pool, o.counter_set AS unit "
                     "FROM device_allocations a JOIN device_inventory o ON o.cluster = a.cluster "
                     "AND o.driver = a.driver AND o.pool = a.pool AND o.device = a.device AND o.valid @> :at "
                     f"WHERE a.valid @> :at AND NOT a.admin_access AND o.counter_set IS NOT NULL"
                     f"{scope.where('a', members=False)})")
        busy = (" OR EXISTS (SELECT 1 FROM busy b WHERE b.cluster = u.cluster AND b.driver = u.driver "
                "AND b.pool = u.pool AND b.unit = u.unit)")
    return (
        f"WITH multi AS ({_multi_consumer_claims(scope)}), held AS ({held}), "
        "inv AS (SELECT i.cluster, i.driver, i.pool, i.device, i.counter_set FROM device_inventory i "
        f" WHERE i.valid @> :at{scope.where('i')}), "
        "dev AS (SELECT coalesce(i.cluster, h.cluster) AS cluster, coalesce(i.driver, h.driver) AS driver, "
        " coalesce(i.pool, h.pool) AS pool, "
        " coalesce(i.counter_set, 'device:' || coalesce(i.device, h.device)) AS unit, "
        f" coalesce(h.holding, 0) > 0 AS allocated, coalesce({shared}, false) AS shared "
        " FROM inv i FULL JOIN held h ON h.cluster = i.cluster AND h.driver = i.driver AND h.pool = i.pool "
        "  AND h.device = i.device WHERE i.device IS NOT NULL OR h.holding > 0), "
        "units AS (SELECT cluster, driver, pool, unit, bool_or(allocated) AS allocated, bool_or(shared) AS shared "
        f" FROM dev GROUP BY cluster, driver, pool, unit){busy_sets} "
        f"SELECT count(*) AS devices, count(*) FILTER (WHERE u.allocated{busy}) AS allocated, "
        "count(*) FILTER (WHERE u.shared) AS shared FROM units u")


Counted = Mapping[str, int] | None
"""The occupancy counts of a cluster at T (:func:`ledger.projections.counts.totals_at`), or ``None``."""
LOOK_UP: Literal["look up"] = "look up"
"""Passed as ``counted``: the function reads the occupancy counts itself."""


def cluster_counts(conn: Connection, at: datetime, scope: OccupancyScope) -> Counted:
    """The occupancy counts of ``scope.cluster`` (all clusters when ``None``) at ``at``, or ``None`` when they
    do not cover ``at`` or ``scope`` has a node or team filter (those list devices the cluster's counts do
    not describe). One lookup serves a page and its totals (:func:`occupancy`). Driver, pool and DeviceClass
    filters only narrow the cluster's devices: their pages still read whether any is off-slice, and their
    totals are aggregated (:func:`occupancy_totals`)."""
    if scope.node is not None or scope.teams is not None:
        return None
    return counts.totals_at(conn, at, scope.cluster)


def occupancy_totals(conn: Connection, *, at: datetime, scope: OccupancyScope = OccupancyScope(),
                     counted: Counted | Literal["look up"] = LOOK_UP) -> JSONObject:
    """Totals of the occupancy at ``at`` over every device of ``scope`` (all pages).

    Sources: for whole clusters, one row of ``occupancy_counts`` when it covers ``at``
    (:mod:`ledger.projections.counts`); otherwise an SQL aggregate of the ``device_inventory``,
    ``device_allocations``, ``claim_consumers`` and ``pod_phases`` intervals containing ``at`` (GiST
    ``valid`` indexes). Both give the same totals (tested).

    Returns:
        ``{"devices", "allocated", "free", "shared"}``, counts (ints). Without ``scope.teams``: a unit is
        a device, or every device consuming one counter set (counted once); ``devices`` counts the units
        in the inventory at T plus devices held off-slice by a non-``adminAccess`` allocation (one held
        by ``adminAccess`` alone is listed, not counted); ``allocated`` the units with a
        non-``adminAccess`` allocation; ``shared`` the units with a device held by more than one
        non-``adminAccess`` allocation or by one whose claim has more than one live consumer;
        ``free = devices - allocated`` (never negative). With ``scope.teams``: the same per device,
        over the devices holding an allocation of those teams (an off-slice one only while a visible
        non-``adminAccess`` allocation holds it) and over those allocations only.
        ``counted``: :func:`cluster_counts` already read by the caller (default: read here).
    """
    if counted == LOOK_UP:
        counted = cluster_counts(conn, at, scope)
    if isinstance(counted, Mapping) and scope.driver is None and scope.pool is None and scope.members is None:
        # Whole clusters: one row of the occupancy counts when they cover ``at`` (equal to the aggregate,
        # tested at every change instant of recorded histories), instead of a visit of every device.
        return {"devices": counted["devices"], "allocated": counted["allocated"],
                "free": counted["devices"] - counted["allocated"], "shared": counted["shared"]}
    with _planner_settings(conn, TOTALS_PLANNER_SETTINGS):
        row = conn.execute(text(occupancy_totals_statement(scope)), {"at": at, **scope.params()}).one()
    return {"devices": int(row.devices), "allocated": int(row.allocated),
            "free": int(row.devices) - int(row.allocated), "shared": int(row.shared)}


def occupancy_page_statements(scope: OccupancyScope, *, after: DeviceSortKey | None,
                              upper: DeviceSortKey | None = None) -> tuple[str, str]:
    """The SQL that picks a page's devices: (listed devices, off-slice devices up to ``upper``).

    Without ``scope.teams`` the first statement walks ``device_inventory`` in key order (btree
    ``device_inventory_key_idx``), the second finds devices held at T without an inventory row, in
    ``(after, upper]``. With ``scope.teams`` the first statement walks the team's allocations and the
    second is unused. Parameters: ``:at``, ``:n`` (rows wanted), :meth:`OccupancyScope.params`, and
    ``:a_cluster``.. / ``:u_cluster``.. for ``after`` / ``upper``.
    """
    def bound(alias: str, op: str, prefix: str) -> str:
        return f" AND ({_KEY.format(a=alias)}) {op} (:{prefix}cluster, :{prefix}driver, :{prefix}pool, :{prefix}device)"

    after_i = bound("i", ">", "a_") if after is not None else ""
    after_a = bound("a", ">", "a_") if after is not None else ""
    upper_a = bound("a", "<=", "u_") if upper is not None else ""
    if scope.teams is not None:
        listed = (f"SELECT DISTINCT ON ({_KEY.format(a='a')}) {_KEY.format(a='a')} FROM device_allocations a "
                  f"WHERE a.valid @> :at{scope.where('a')}{scope.team_filter('a')}{after_a} "
                  f"ORDER BY {_KEY.format(a='a')} LIMIT :n")
        return listed, ""
    # Plain key order, so the btree delivers the rows already sorted and LIMIT stops the walk (a tie-break
    # column would add a sort of every device). One inventory row per device at T is the projection's
    # invariant; should a late event ever make two overlap, the caller keeps the newest (``since``).
    listed = (f"SELECT {_KEY.format(a='i')}, i.node, i.model, lower(i.valid) AS since "
              f"FROM device_inventory i WHERE i.valid @> :at{scope.where('i')}{after_i} "
              f"ORDER BY {_KEY.format(a='i')} LIMIT :n")
    # Bounded by the page's last listed device, the off-slice candidates are the allocations of a few
    # hundred devices in key order; written with bound functions instead of ``@>`` so the planner walks
    # the key btree over (after, upper] rather than the GiST index over every allocation at T (36,000 on
    # the 10 M-event ledger: 40 ms a page, against ~1 ms). The bound test equals ``valid @> :at`` for any
    # range (empty ones included: their bounds are NULL); unbounded (last page), the GiST index finds them.
    holds = ("(lower_inf(a.valid) OR lower(a.valid) < :at OR (lower(a.valid) = :at AND lower_inc(a.valid))) "
             "AND NOT isempty(a.valid) AND (upper_inf(a.valid) "
             "OR upper(a.valid) > :at OR (upper(a.valid) = :at AND upper_inc(a.valid)))"
             if upper is not None else "a.valid @> :at")
    # With a DeviceClass, an off-slice device is in it when an allocation at T was made for the class
    # (:func:`device_class_members`): asked of the page's own candidates, not by matching the member list,
    # which the planner joined member by member (40,000 allocation probes, 2.2 s a page on the 10 M-event
    # ledger). The inventory test needs no member filter either: it looks at the candidate's own key.
    # A scalar subquery, not EXISTS: with row estimates off (tables not analyzed since a bulk load) the planner
    # turned EXISTS into a join driven by every allocation of the class at T, each probing the key btree bounded
    # only by ``upper`` (5,700 probes of ~100 pages, 3.3 s a page on a simulated 1,000-node day, 0.05 s once
    # analyzed); a scalar subquery is asked once per candidate of the page's range whatever the estimates.
    in_class = ("" if scope.device_class is None else
                " AND coalesce((SELECT true FROM device_allocations c WHERE c.cluster = a.cluster "
                "  AND c.driver = a.driver AND c.pool = a.pool AND c.device = a.device AND c.valid @> :at "
                "  AND c.device_class = :device_class LIMIT 1), false)")
    off_slice = (f"SELECT DISTINCT ON ({_KEY.format(a='a')}) {_KEY.format(a='a')}, a.node, a.model "
                 f"FROM device_allocations a WHERE {holds}{scope.where('a', members=False)}{after_a}{upper_a}"
                 f"{in_class} AND NOT EXISTS (SELECT 1 FROM device_inventory i WHERE i.cluster = a.cluster "
                 "  AND i.driver = a.driver AND i.pool = a.pool AND i.device = a.device "
                 f"  AND i.valid @> :at{scope.where('i', members=False)}) "
                 f"ORDER BY {_KEY.format(a='a')}, {_ALLOCATION_ORDER} LIMIT :n")
    return listed, off_slice


def _key_params(prefix: str, key: DeviceSortKey | None) -> dict[str, object]:
    if key is None:
        return {}
    return {f"{prefix}cluster": key[0], f"{prefix}driver": key[1], f"{prefix}pool": key[2], f"{prefix}device": key[3]}


_Picked = tuple[DeviceSortKey, str | None, str | None, bool | None]


PAGE_PLANNER_SETTINGS: Mapping[str, str] = {
    "enable_seqscan": "off", "enable_bitmapscan": "off", "enable_hashjoin": "off", "enable_mergejoin": "off",
    "max_parallel_workers_per_gather": "0", "jit": "off",
}
"""Planner settings while a page's devices are picked, restored afterwards.

Why: the page statements read a narrow key range (``(a, b, c, d) > (...)``), but PostgreSQL estimates a
row comparison by its first column only, takes the range for the whole table and picks a parallel scan
of every row at T plus a hash or merge anti-join (55-80 ms measured at 61,000 devices instead of < 1 ms walking
the key btree). The statements are written for the key indexes; these settings keep the planner on them.
The same misestimate prices a bounded off-slice walk above ``jit_above_cost``; compiling it took ~11 ms of
a ~20 ms page on the 10 M-event ledger, so JIT is off too.
"""


TOTALS_PLANNER_SETTINGS: Mapping[str, str] = {"jit": "off", "work_mem": "32MB", "enable_sort": "off"}
"""Planner settings while the totals are aggregated, restored afterwards.

Why (measured at 61,000 devices): the statement's cost passes ``jit_above_cost`` and compiling it took
~0.8 s, more than running it; grouping 61,000 devices by unit sorted them on disk under the default
4 MB ``work_mem`` (~100 ms of the ~230 ms), while hashing them needs ~11 MB and takes ~10 ms.
"""


@contextmanager
def _planner_settings(conn: Connection, settings: Mapping[str, str]) -> Iterator[None]:
    """Apply ``settings`` (transaction-local ``set_config``) and restore the previous values when the block ends.

    Restored only when the block ends normally: an error or an interrupt in it ends the transaction the settings
    belong to (a failed statement leaves it unable to run the restore, whose own error then hid the first), and a
    generator closed without its block ever running (a signal between its ``yield`` and the block) met a closed
    connection in its clean-up, reported as "Exception ignored" with a traceback.
    """
    names = list(settings)
    before = conn.execute(text("SELECT " + ", ".join(f"current_setting(:n{i})" for i in range(len(names)))),
                          {f"n{i}": n for i, n in enumerate(names)}).one()
    def apply(values: Sequence[str]) -> None:
        conn.execute(text("SELECT " + ", ".join(f"set_config(:n{i}, :v{i}, true)" for i in range(len(names)))),
                     {**{f"n{i}": n for i, n in enumerate(names)}, **{f"v{i}": v for i, v in enumerate(values)}})
    apply([settings[n] for n in names])
    yield
    apply([str(v) for v in before])


def _page_devices(conn: Connection, *, at: datetime, scope: OccupancyScope, after: DeviceSortKey | None,
                  n: int, counted: Counted) -> list[_Picked]:
    with _planner_settings(conn, PAGE_PLANNER_SETTINGS):
        return _pick_devices(conn, at=at, scope=scope, after=after, n=n, counted=counted)


def _pick_devices(conn: Connection, *, at: datetime, scope: OccupancyScope, after: DeviceSortKey | None,
                  n: int, counted: Counted) -> list[_Picked]:
    """The first ``n`` devices after ``after``: (key, node, model, offSlice); node/model/offSlice are
    ``None`` for a team-limited page (they come from the allocations, see :func:`_holders`)."""
    params: dict[str, object] = {"at": at, "n": n, **scope.params()}
    if scope.teams is not None:
        listed_sql, _ = occupancy_page_statements(scope, after=after)
        listed = conn.execute(text(listed_sql), {**params, **_key_params("a_", after)}).all()
        return [((r.cluster, r.driver, r.pool, r.device), None, None, None) for r in listed]
    newest: dict[DeviceSortKey, tuple[datetime, str | None, str | None]] = {}
    upper: DeviceSortKey | None = None
    start = after
    while True:  # once, unless overlapping inventory rows of one device took some of the n rows
        listed_sql, _ = occupancy_page_statements(scope, after=start)
        listed = conn.execute(text(listed_sql), {**params, **_key_params("a_", start)}).all()
        for r in listed:
            key = (r.cluster, r.driver, r.pool, r.device)
            if key not in newest or r.since > newest[key][0]:
                newest[key] = (r.since, r.node, r.model)
        if len(listed) < n:
            break
        start = upper = (listed[-1].cluster, listed[-1].driver, listed[-1].pool, listed[-1].device)
        if len(newest) >= n:
            break
    rows: list[_Picked] = [(key, node, model, False) for key, (_, node, model) in newest.items()]
    # Off-slice devices sort among the listed ones: those up to the last listed key belong to this page
    # (all of them after ``after`` when the inventory ran out before ``n`` rows). When the occupancy counts
    # cover T and say the cluster has none (as at most instants), the walk for them is skipped: about half
    # of a page's time on the 10 M-event ledger. Driver and pool filters only narrow the cluster's set, so
    # none stays none (so do DeviceClass filters); with a node filter there are no counts (:func:`cluster_counts`),
    # so it looks.
    if counted is None or counted["off_slice"] > 0:
        _, off_sql = occupancy_page_statements(scope, after=after, upper=upper)
        off = conn.execute(text(off_sql), {**params, **_key_params("a_", after), **_key_params("u_", upper)}).all()
        rows += [((r.cluster, r.driver, r.pool, r.device), r.node, r.model, True) for r in off]
    rows.sort(key=lambda r: r[0])
    return rows[:n]


def occupancy_devices(conn: Connection, *, at: datetime, scope: OccupancyScope = OccupancyScope(),
                      after: DeviceSortKey | None = None, limit: int = OCCUPANCY_DEFAULT_LIMIT,
                      counted: Counted | Literal["look up"] = LOOK_UP) -> tuple[list[JSONValue], DeviceSortKey | None]:
    """One page of devices at ``at`` with their holders; returns (devices, key to resume after or None).

    Only the page's devices have their allocations (btree ``device_allocations_key_idx``) and their
    claims' consumers (``claim_consumers_key_idx``) read. Devices are ordered by (cluster, driver,
    pool, device) in the database collation (``C`` for ledgers the ledger creates: code-point order).

    ``counted``: :func:`cluster_counts` already read by the caller (default: read here); when they say the
    cluster has no off-slice device at ``at``, the page does not look for them.

    Raises:
        Invalid: ``limit`` outside 1..:data:`OCCUPANCY_MAX_LIMIT`.
    """
    if not 1 <= limit <= OCCUPANCY_MAX_LIMIT:
        raise Invalid(f"limit must be between 1 and {OCCUPANCY_MAX_LIMIT}, got {limit}")
    if counted == LOOK_UP:
        counted = cluster_counts(conn, at, scope)
    picked = _page_devices(conn, at=at, scope=scope, after=after, n=limit + 1,
                           counted=counted if isinstance(counted, Mapping) else None)
    more = len(picked) > limit
    picked = picked[:limit]
    holders = _holders(conn, at=at, scope=scope, keys=[p[0] for p in picked])
    # One query for a page without counter sets; devices of MIG pools cost one more and a look-up per pool.
    sets = counter_set_state(conn, at=at, keys=[p[0] for p in picked])
    devices: list[JSONValue] = []
    for key, node, model, off_slice in picked:
        allocs, first_node, first_model, on_slice = holders.get(key, ([], None, None, None))
        if off_slice is None:  # team-limited: where the device is comes from the unfiltered page data
            off_slice = not on_slice if on_slice is not None else True
            node, model = (first_node, first_model)
        devices.append({"cluster": key[0], "driver": key[1], "pool": key[2], "device": key[3], "node": node,
                        "model": model, "offSlice": off_slice, "counterSetConflict": key in sets.conflicts,
                        "counterSetHeldBy": list(sets.held_by.get(key, ())) if scope.teams is None else [],
                        "allocations": allocs})
    return devices, (picked[-1][0] if more and picked else None)


_Holders = tuple[list[JSONValue], str | None, str | None, bool | None]


def _holders(conn: Connection, *, at: datetime, scope: OccupancyScope,
             keys: Sequence[DeviceSortKey]) -> dict[DeviceSortKey, _Holders]:
    """Allocations at ``at`` of ``keys`` (visible ones only for a team-limited scope), with live consumers.

    For a team-limited scope also where each device is: (node, model) of its inventory row at T, else
    of its first allocation (any team) as for an off-slice device, and whether it has an inventory row.
    """
    if not keys:
        return {}
    unzipped = {"k_cluster": [k[0] for k in keys], "k_driver": [k[1] for k in keys],
                "k_pool": [k[2] for k in keys], "k_device": [k[3] for k in keys]}
    page = ("JOIN unnest(CAST(:k_cluster AS text[]), CAST(:k_driver AS text[]), CAST(:k_pool AS text[]), "
            "CAST(:k_device AS text[])) AS k(cluster, driver, pool, device) "
            "ON k.cluster = {a}.cluster AND k.driver = {a}.driver AND k.pool = {a}.pool AND k.device = {a}.device")
    params: dict[str, object] = {"at": at, **scope.params(), **unzipped}
    rows = conn.execute(text(
        "SELECT a.cluster, a.driver, a.pool, a.device, a.node, a.model, a.claim_uid, a.namespace, a.claim, a.team, "
        " a.request, a.device_class, a.share_id, a.consumed_capacity, a.admin_access, a.conflict "
        # The page's keys were picked among the DeviceClass's members already: no member filter here.
        f"FROM device_allocations a {page.format(a='a')} WHERE a.valid @> :at{scope.where('a', members=False)} "
        f"ORDER BY {_ALLOCATION_ORDER}"), params).all()
    consumers = consumers_at(conn, at, scope.cluster, claims=sorted({(r.cluster, r.claim_uid) for r in rows}))
    out: dict[DeviceSortKey, _Holders] = {}
    overrides = dict(scope.overrides)
    for r in rows:
        key = (r.cluster, r.driver, r.pool, r.device)
        allocs, node, model, on_slice = out.get(key, ([], r.node, r.model, None))
        team = overrides.get(r.namespace, r.team)
        if scope.teams is None or team in scope.teams:
            live = [c.name for c in consumers.get(f"{r.cluster}\x00{r.claim_uid}", []) if c.live]
            allocs.append({"namespace": r.namespace, "claim": r.claim, "team": team, "request": r.request,
                           "deviceClass": r.device_class, "shareID": r.share_id,
                           "consumedCapacity": r.consumed_capacity, "adminAccess": r.admin_access,
                           "conflict": r.conflict, "consumers": live})
        out[key] = (allocs, node, model, on_slice)
    if scope.teams is not None:
        inventory = conn.execute(text(
            f"SELECT DISTINCT ON ({_KEY.format(a='i')}) {_KEY.format(a='i')}, i.node, i.model "
            f"FROM device_inventory i {page.format(a='i')} WHERE i.valid @> :at{scope.where('i', members=False)} "
            f"ORDER BY {_KEY.format(a='i')}, lower(i.valid) DESC"), params).all()
        for r in inventory:
            key = (r.cluster, r.driver, r.pool, r.device)
            allocs = out.get(key, ([], None, None, None))[0]
            out[key] = (allocs, r.node, r.model, True)
    return out


def device_class_members(conn: Connection, *, at: datetime, scope: OccupancyScope,
                         device_class: str) -> frozenset[DeviceSortKey]:
    """Keys ``(cluster, driver, pool, device)`` of the devices of ``scope`` in DeviceClass ``device_class``
    at ``at`` (``scope.teams`` is not applied here: the statements that use the members apply it).

    A device in the inventory at T (``device_inventory``, highest pool generation) is in the class when
    the class is defined at T in the device's cluster (``device_classes``: ``DeviceClass.spec``) and
    every ``spec.selectors[].cel.expression`` selects the device as recorded at T (its attributes and
    capacity; :func:`ledger.projections.selectors.selects`; no selectors select every device). An
    expression that does not compile or fails on a device (a missing attribute, a type mismatch) does
    not select it (DESIGN §11.10); a selector that is not CEL selects nothing. A device held at T after
    leaving its ResourceSlice (off-slice: no inventory row to evaluate) is in the class when one of its
    allocations at T was made for a request of that class (``ResourceClaim.status.allocation.devices.
    results[].request`` → the request's ``deviceClassName``), and the class is defined at T in its
    cluster.

    Returns:
        The member keys (unordered, unique); empty when the class selects nothing.

    Raises:
        Invalid: ``device_class`` is empty.
        UnknownDeviceClass: no DeviceClass ``device_class`` is defined at ``at`` in ``scope.cluster``
            (in any cluster when ``None``): a misspelt class, or one created later or deleted earlier.
    """
    if not device_class:
        raise Invalid("deviceClass must not be empty")
    base = replace(scope, members=None, device_class=None, teams=None)
    params: dict[str, object] = {**base.params(), "at": at, "device_class": device_class}
    specs: dict[str, list[str]] = {}
    for r in conn.execute(text(
            "SELECT c.cluster, c.spec FROM device_classes c WHERE c.name = :device_class AND c.valid @> :at"
            + _cluster_filter(scope.cluster, "c") + " ORDER BY c.cluster, lower(c.valid)"), params):
        spec = _json(r.spec)
        specs[r.cluster] = expressions_of(spec.get("selectors") if isinstance(spec, dict) else None)
    if not specs:
        where = f" in cluster {shorten_repr(scope.cluster)}" if scope.cluster is not None else ""
        raise UnknownDeviceClass(f"DeviceClass {shorten_repr(device_class)} is not defined at {rfc3339(at)}{where}")
    params["class_clusters"] = sorted(specs)
    members: set[DeviceSortKey] = set()
    # One inventory row per device at T is the projection's invariant; should two overlap, the newest
    # decides, as on the occupancy pages (:func:`_pick_devices`).
    for r in conn.execute(text(
            f"SELECT DISTINCT ON ({_KEY.format(a='i')}) {_KEY.format(a='i')}, i.attributes, i.capacity, "
            "i.allow_multiple_allocations FROM device_inventory i "
            f"WHERE i.valid @> :at AND i.cluster = ANY(:class_clusters){base.where('i')} "
            f"ORDER BY {_KEY.format(a='i')}, lower(i.valid) DESC"), params):
        attributes, capacity = _json(r.attributes), _json(r.capacity)
        view = DeviceView(driver=r.driver, attributes=attributes if isinstance(attributes, dict) else {},
                          capacity=capacity if isinstance(capacity, dict) else {},
                          allow_multiple_allocations=bool(r.allow_multiple_allocations))
        if selects(specs[r.cluster], view):
            members.add((r.cluster, r.driver, r.pool, r.device))
    # Off-slice: the same devices as the off-slice page statement (held at T, no inventory row at T).
    for r in conn.execute(text(
            f"SELECT DISTINCT {_KEY.format(a='a')} FROM device_allocations a "
            f"WHERE a.valid @> :at AND a.cluster = ANY(:class_clusters) AND a.device_class = :device_class"
            f"{base.where('a')} AND NOT EXISTS (SELECT 1 FROM device_inventory i WHERE i.cluster = a.cluster "
            "  AND i.driver = a.driver AND i.pool = a.pool AND i.device = a.device "
            f"  AND i.valid @> :at{base.where('i')})"), params):
        members.add((r.cluster, r.driver, r.pool, r.device))
    return frozenset(members)


def occupancy_scope(conn: Connection, *, at: datetime, cluster: str | None = None, node: str | None = None,
                    driver: str | None = None, pool: str | None = None, device_class: str | None = None,
                    teams: Collection[str] | None = None, overrides: Mapping[str, str] = NO_OVERRIDES,
                    members: frozenset[DeviceSortKey] | None = None) -> OccupancyScope:
    """The :class:`OccupancyScope` of an occupancy question at ``at``, with the DeviceClass members
    resolved (:func:`device_class_members`) when ``device_class`` is given.

    ``members``: the members of ``device_class`` already computed by the caller for the same ``at``,
    filters and read-model rows (a cache; see ``ledger.services.occupancy_settled``); ``None`` computes them.

    Raises:
        Invalid: ``device_class`` is empty.
        UnknownDeviceClass: ``device_class`` is not defined at ``at`` (see :func:`device_class_members`).
    """
    scope = OccupancyScope(cluster=cluster, node=node, driver=driver, pool=pool,
                           teams=frozenset(teams) if teams is not None else None,
                           overrides=tuple(sorted(overrides.items())))
    if device_class is None:
        return scope
    if members is None:
        members = device_class_members(conn, at=at, scope=scope, device_class=device_class)
    return replace(scope, device_class=device_class, members=members)


def occupancy(conn: Connection, *, at: datetime, cluster: str | None = None, node: str | None = None,
              driver: str | None = None, pool: str | None = None, teams: Collection[str] | None = None,
              after: DeviceSortKey | None = None, limit: int = OCCUPANCY_DEFAULT_LIMIT,
              overrides: Mapping[str, str] = NO_OVERRIDES, device_class: str | None = None,
              class_members: frozenset[DeviceSortKey] | None = None) -> OccupancyPage:
    """One page of devices at ``at`` with their holders, and totals over every device (all pages).

    Sources: ``device_inventory`` (published devices, highest pool generation) and
    ``device_allocations`` (``ResourceClaim.status.allocation.devices.results[]``) intervals containing
    ``at``; consumers from ``claim_consumers`` (``status.reservedFor``) filtered to live pods
    (``pod_phases``). Totals come from the occupancy counts or an SQL aggregate (:func:`occupancy_totals`);
    only the page's devices are read in full (:func:`occupancy_devices`).

    Args:
        cluster, node, driver, pool: filters on the rows' own columns.
        teams: a team-limited caller: only devices holding an allocation billed to one of ``teams`` are
            listed, with only those allocations; totals count those devices one by one (``devices``),
            those with a visible non-``adminAccess`` allocation (``allocated``), and those with more
            than one visible non-``adminAccess`` allocation or more than one live consumer among them
            (``shared``).
        after: sort key of the previous page's last device (``OccupancyPage.next_after``); ``None`` for
            the first page.
        limit: devices per page, 1..:data:`OCCUPANCY_MAX_LIMIT`.
        overrides: ``[teams] overrides`` (namespace -> team): each allocation's ``team`` and the ``teams``
            limit use the overridden team.
        device_class: only the devices in this DeviceClass at ``at`` (:func:`device_class_members`:
            defined at T and every CEL selector matches the device as recorded at T; an off-slice device
            when an allocation at T was made for a request of the class), each with all its allocations
            (whatever class they were made for); totals count only those devices, with the rules below.
            The occupancy counts cannot answer it: totals are aggregated from the intervals.
        class_members: :func:`device_class_members` of ``device_class`` already computed for this ``at``,
            these filters and these read-model rows (the caller's cache); ``None`` computes them.

    Returns:
        An :class:`OccupancyPage` whose body is ``{"at", "totals": {"devices", "allocated", "free",
        "shared"}, "devices": [{"cluster", "driver", "pool", "device", "node", "model", "offSlice",
        "counterSetConflict", "counterSetHeldBy": [device names], "allocations": [{"namespace", "claim", "team",
        "request", "deviceClass", "shareID", "consumedCapacity", "adminAccess", "conflict",
        "consumers": [pod names]}]}]}``, devices sorted by
        (cluster, driver, pool, device), allocations by (namespace, claim, request, shareID);
        ``consumedCapacity`` maps capacity name -> Quantity string (``{}`` for a whole device). Devices
        allocated after leaving their slice appear with ``offSlice: true`` and count in
        ``totals.devices`` while a non-``adminAccess`` allocation holds them (held by ``adminAccess``
        alone they are listed but neither counted nor free); devices consuming the same counter set
        count once (one piece of hardware). ``counterSetConflict`` is true for an allocated device whose
        counter set its allocated devices take more of than it holds at T (the hardware handed out twice:
        :func:`ledger.projections.counter_sets.counter_set_state`); an allocation's ``conflict`` is the
        same flag for two allocations of one device. ``counterSetHeldBy`` names, for a device with no
        allocation but ``adminAccess`` ones, the allocated devices of its pool whose counters leave too little of
        its counter set for it (a MIG partition of a GPU allocated whole: ``["gpu-0"]``); it is ``[]`` for a
        device that could still be allocated as far as counters go, and always for a team-limited caller (the
        devices named may be other teams').
        ``free`` is never negative; ``adminAccess`` never occupies.

    Raises:
        Invalid: ``limit`` outside 1..:data:`OCCUPANCY_MAX_LIMIT`, or an empty ``device_class``.
        UnknownDeviceClass: ``device_class`` is not defined at ``at``.
    """
    scope = occupancy_scope(conn, at=at, cluster=cluster, node=node, driver=driver, pool=pool,
                            device_class=device_class, teams=teams, overrides=overrides, members=class_members)
    counted = cluster_counts(conn, at, scope)  # once for the page and its totals
    devices, next_after = occupancy_devices(conn, at=at, scope=scope, after=after, limit=limit, counted=counted)
    totals = occupancy_totals(conn, at=at, scope=scope, counted=counted)
    return OccupancyPage(body={"at": rfc3339(at), "totals": totals, "devices": devices}, next_after=next_after)


def occupancy_all(conn: Connection, *, at: datetime, cluster: str | None = None, node: str | None = None,
                  driver: str | None = None, pool: str | None = None,
                  teams: Collection[str] | None = None, overrides: Mapping[str, str] = NO_OVERRIDES,
                  device_class: str | None = None) -> JSONObject:
    """Every device at ``at`` (all pages of :func:`occupancy`, :data:`OCCUPANCY_MAX_LIMIT` at a time).

    For the CLI, the demo and tests that print or compare a whole fleet; the API serves pages. Same
    body, sources and ``device_class`` rule as :func:`occupancy`; totals are computed once.

    Raises:
        Invalid: an empty ``device_class``.
        UnknownDeviceClass: ``device_class`` is not defined at ``at``.
    """
    scope = occupancy_scope(conn, at=at, cluster=cluster, node=node, driver=driver, pool=pool,
                            device_class=device_class, teams=teams, overrides=overrides)
    counted = cluster_counts(conn, at, scope)  # once for every page and the totals
    devices: list[JSONValue] = []
    after: DeviceSortKey | None = None
    while True:
        page, after = occupancy_devices(conn, at=at, scope=scope, after=after, limit=OCCUPANCY_MAX_LIMIT,
                                        counted=counted)
        devices.extend(page)
        if after is None:
            break
    return {"at": rfc3339(at), "totals": occupancy_totals(conn, at=at, scope=scope, counted=counted),
            "devices": devices}


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceTable:
    """Price per device-hour by DeviceClass and by model (a model price wins over a class price)."""

    by_class: Mapping[str, float]
    by_model: Mapping[str, float]
    currency: str = "USD"

    def price(self, device_class: str, model: str) -> float | None:
        """Return the price of one device-hour, or ``None`` when neither key is priced."""
        if model and model in self.by_model:
            return self.by_model[model]
        return self.by_class.get(device_class)


def present(column: str) -> str:
    """SQL for where an interval ``column`` stops counting: its end, else ``:now``, never after ``:now``
    nor after ``:end``.

    ``:now`` is a bound parameter (an aware instant, or ``None`` for the database's ``now()``). An interval
    that ended after ``:now`` is cut there as well, so an answer pinned to an earlier instant does not
    change when an allocation open then is released later; one that starts after ``:now`` ends before it
    starts, and the callers drop those (``e > s``).
    """
    cap = "coalesce(CAST(:now AS timestamptz), now())"
    return f"least(coalesce(upper({column}), {cap}), {cap}, :end)"


def until_now(conn: Connection, at: datetime, now: datetime | None = None) -> datetime:
    """``at``, or the present if ``at`` is later: where a duration measured "up to ``at``" stops.

    An answer for an instant after the present (an idle claim's ``wastedDeviceHours``, a pending claim's
    ``ageSeconds``) may not count time that has not happened, as usage does not (:func:`present`).

    Args:
        at: the instant asked for (aware).
        now: the present (aware); ``None``: the database's ``now()`` (one query).
    """
    if now is None:
        now = conn.execute(text("SELECT now()")).scalar_one()
        assert isinstance(now, datetime)
    return min(at, now)


MAX_STEPS = 10_000
"""Most time buckets one usage query may return (``(to - from) / step``)."""


def usage(conn: Connection, *, start: datetime, end: datetime, group_by: str, cluster: str | None = None,
          teams: Sequence[str] | None = None, step: timedelta | None = None,
          prices: PriceTable | None = None, overrides: Mapping[str, str] = NO_OVERRIDES,
          now: datetime | None = None) -> JSONObject:
    """Device-hours over ``[start, end)`` grouped by ``group_by`` and always by DeviceClass and driver.

    Source: ``device_allocations`` intervals clipped exactly to the window (no rounding to hours) and to
    the present (:func:`present`): nothing counts after ``now``, default the database's ``now()`` (a
    window that ends later bills only the hours that have happened). ``adminAccess`` allocations are not billed.
    When several allocations hold one device at once (shares, or a double booking), each device-second
    is split among them by :mod:`ledger.projections.split`: by their ``consumedCapacity`` fractions of the
    device when every one states one (capacity nobody consumed is not billed), else equally, so that the rows
    then add up to the device's own hours (DESIGN §5, §11.5).

    Args:
        teams: only allocations billed to these teams (a team-limited API token), after ``overrides``.
        step: split the window into buckets of this length; rows then carry ``start``/``end``.
        prices: adds ``cost`` (device-hours x price) and ``currency`` to priced rows.
        overrides: ``[teams] overrides`` (namespace -> team), applied to every interval at query time
            (retroactively), before grouping by team and before the ``teams`` limit.
        now: the instant the answer is for (aware); an API page token pins it, so a later page is cut
            from the same result even while allocations stay open or end.

    Returns:
        ``{"from", "to", "groupBy", "step" (seconds or None), "rows": [{<groupBy>: value, "deviceClass",
        "driver", "deviceHours", ["start", "end"], ["cost", "currency"]}]}`` sorted by bucket, group value,
        class; hours rounded to 6 decimals; a group billed nothing in a bucket (its only allocations consumed 0 of
        a shared device) has no row there.

    Raises:
        Invalid: ``group_by`` unknown, ``start`` not before ``end``, ``step`` under one microsecond (not
            positive) or giving more than :data:`MAX_STEPS` buckets.
    """
    if group_by not in GROUP_BY:
        raise Invalid(f"groupBy must be one of {', '.join(GROUP_BY)}, got {shorten_repr(group_by)}")
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    if step is not None and step <= timedelta(0):
        raise Invalid("step must be at least one microsecond (PT0.000001S)")
    if step is not None and (end - start) / step > MAX_STEPS:
        # The smallest step accepted, rounded up to the microsecond (a step is one): that step gives at most
        # MAX_STEPS buckets, and one microsecond less gives more.
        smallest = timedelta(microseconds=-(-(end - start) // timedelta(microseconds=MAX_STEPS)))
        raise Invalid(f"step {seconds_text(step)} s gives {math.ceil((end - start) / step)} buckets over this "
                      f"window; at most {MAX_STEPS} are answered, so the step must be at least "
                      f"{seconds_text(smallest)} s here")
    col = GROUP_BY[group_by]
    rows = conn.execute(text(
        f"SELECT cluster, driver, pool, device, device_class, coalesce(model, '') AS model, {col} AS grp, team, "
        " namespace, claim_uid, " + split_columns("device_allocations") + ", "
        " greatest(lower(valid), :start) AS s, " + present("valid") + " AS e "
        "FROM device_allocations WHERE NOT admin_access AND NOT isempty(valid) "
        " AND valid && tstzrange(:start, :end, '[)')" + _cluster_filter(cluster)),
        {"start": start, "end": end, "cluster": cluster, "now": now}).all()
    # Other teams' allocations are read too and dropped only after the split: a device another team also held
    # is billed to ``teams`` at its share, exactly as an unrestricted caller sees it (DESIGN §11.5).
    hidden = ("\x00hidden", "", "", "")
    per_device: dict[tuple[str, str, str, str], list[Interval[tuple[str, str, str, str]]]] = defaultdict(list)
    for r in rows:
        if r.e > r.s:
            team = overrides.get(r.namespace, r.team)
            grp = team if group_by == "team" else r.grp
            per_device[(r.cluster, r.driver, r.pool, r.device)].append(
                (r.s, r.e, (str(grp) if grp is not None else "", r.device_class or "", r.driver, r.model)
                 if teams is None or team in teams else hidden,
                 allocation_fraction(r.consumed, r.capacity, driver=r.driver), r.claim_uid))
    buckets = [(start, end)]
    if step is not None:
        buckets = []
        lo = start
        while lo < end:
            # Never lo + step past end: near the year 9999 that sum is past the last datetime.
            hi = end if end - lo <= step else lo + step
            buckets.append((lo, hi))
            lo = hi
    # Each device's billed pieces (ledger.projections.split) go to the buckets they overlap, found by arithmetic
    # on the bucket width; the whole buckets inside a piece are counted per (group, weight) and summed once per
    # bucket, so the
    # work grows with the allocations and the buckets, not their product (10,000 buckets over a day of
    # 400 GPUs took 12 s of Python a request bucket by bucket; a month of hours at 61,000 devices would
    # have taken minutes).
    width = step if step is not None else end - start
    per_bucket: list[dict[tuple[str, str, str, str], float]] = [defaultdict(float) for _ in buckets]
    whole: dict[tuple[tuple[str, str, str, str], float], list[int]] = {}
    for intervals in per_device.values():
        for s, e, g, w in shares(intervals):
            first, last = (s - start) // width, -((start - e) // width) - 1  # last: ceil((e - start) / width) - 1
            if first == last:
                per_bucket[first][g] += (e - s).total_seconds() * w
                continue
            per_bucket[first][g] += (buckets[first][1] - s).total_seconds() * w
            per_bucket[last][g] += (e - buckets[last][0]).total_seconds() * w
            if last - first > 1:  # buckets first + 1 .. last - 1 are whole (only the last bucket can be short)
                starts = whole.setdefault((g, w), [0] * (len(buckets) + 1))
                starts[first + 1] += 1
                starts[last] -= 1
    width_s = width.total_seconds()
    for (g, w), starts in whole.items():
        pieces = 0
        for b in range(len(buckets)):
            pieces += starts[b]
            if pieces:
                per_bucket[b][g] += pieces * width_s * w
    out: list[JSONValue] = []
    for (lo, hi), seconds in zip(buckets, per_bucket, strict=True):
        merged: dict[tuple[str, str, str], tuple[float, float | None]] = {}
        for (grp, cls, drv, model), secs in seconds.items():
            if (grp, cls, drv, model) == hidden:
                continue
            hours = secs / 3600
            price = prices.price(cls, model) if prices is not None else None
            before_h, before_cost = merged.get((grp, cls, drv), (0.0, None))
            cost = before_cost if price is None else (before_cost or 0.0) + hours * price
            merged[(grp, cls, drv)] = (before_h + hours, cost)
        for (grp, cls, drv), (hours, cost) in sorted(merged.items()):
            if hours <= 0:  # only shares that consumed nothing (a fraction of 0): no row, as from the rollups
                continue
            row: JSONObject = {group_by: grp or None, "deviceClass": cls or None, "driver": drv,
                               "deviceHours": round(hours, 6)}
            if step is not None:
                row["start"], row["end"] = rfc3339(lo), rfc3339(hi)
            if cost is not None and prices is not None:
                row["cost"], row["currency"] = round(cost, 6), prices.currency
            out.append(row)
    return {"from": rfc3339(start), "to": rfc3339(end), "groupBy": group_by,
            "step": step.total_seconds() if step is not None else None, "rows": out}


def claims_device_seconds(conn: Connection, *, claims: Sequence[tuple[str, str, datetime]], end: datetime,
                          now: datetime | None = None) -> dict[tuple[str, str], float]:
    """Device-seconds that :func:`usage` bills each of ``claims`` from its own start up to ``end``.

    Source: ``device_allocations``: each claim's intervals (not ``adminAccess``) and those of every other
    allocation of the same devices, clipped to the claim's window and to ``now`` by :func:`present` as usage
    clips them, then divided by :func:`ledger.projections.split.split`, the split usage and the rollups use: of a
    device held by several allocations at once (shares, a double booking), the claim gets its ``consumedCapacity``
    fraction or its equal part of each second (the whole second when it holds the device alone, through one
    result or several), so a claim never gets more of a device than usage bills it.
    One query for all the claims (the idle-claim report asks for hundreds at once).

    Args:
        claims: (ledger cluster, claim ``metadata.uid``, window start (aware, inclusive)) triples; a pair
            given twice keeps its last start.
        end: every window's end (aware, exclusive); a window whose start is not before it gives 0.
        now: nothing counts after this instant (aware); ``None``: the database's ``now()``.

    Returns:
        Float seconds >= 0 per (cluster, claim uid) of ``claims`` (device-seconds: a device held alone for an
        hour is 3600).
    """
    starts = {(c, u): s for c, u, s in claims}
    out = dict.fromkeys(starts, 0.0)
    asked = [(c, u, s) for (c, u), s in starts.items() if s < end]
    if not asked:
        return out
    # ``held``: the devices each claim held in its window; then every allocation of those devices in that window,
    # the claim's own (``mine``) and the others it shares each second with.
    rows = conn.execute(text(
        "WITH k AS (SELECT * FROM unnest(CAST(:cl AS text[]), CAST(:u AS text[]), CAST(:s AS timestamptz[])) "
        "  AS k(cluster, claim_uid, start)), "
        "held AS (SELECT DISTINCT k.cluster, k.claim_uid, k.start, d.driver, d.pool, d.device FROM k "
        "  JOIN device_allocations d ON d.cluster = k.cluster AND d.claim_uid = k.claim_uid AND NOT d.admin_access "
        "  AND NOT isempty(d.valid) AND d.valid && tstzrange(k.start, :end)) "
        "SELECT h.cluster, h.claim_uid AS owner, a.claim_uid = h.claim_uid AS mine, a.claim_uid, a.driver, a.pool, "
        " a.device, "
        " greatest(lower(a.valid), h.start) AS s, " + present("a.valid") + " AS e, " + split_columns("a") + " "
        "FROM held h "
        "JOIN device_allocations a ON a.cluster = h.cluster AND a.driver = h.driver AND a.pool = h.pool "
        " AND a.device = h.device AND NOT a.admin_access AND NOT isempty(a.valid) "
        " AND a.valid && tstzrange(h.start, :end)"),
        {"cl": [c for c, _, _ in asked], "u": [u for _, u, _ in asked], "s": [s for _, _, s in asked],
         "end": end, "now": now}).all()
    per_device: dict[tuple[str, str], dict[tuple[str, str, str], list[Interval[bool]]]] = (
        defaultdict(lambda: defaultdict(list)))
    for r in rows:
        if r.e > r.s:
            per_device[(r.cluster, r.owner)][(r.driver, r.pool, r.device)].append(
                (r.s, r.e, bool(r.mine), allocation_fraction(r.consumed, r.capacity, driver=r.driver), r.claim_uid))
    for key, devices in per_device.items():
        seconds: dict[bool, float] = defaultdict(float)
        for intervals in devices.values():
            split(intervals, seconds)
        out[key] = seconds[True]
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TeamBook:
    """Every namespace's team over time (table ``namespace_teams``), read once for a query that names many claims.

    Asking the database once a claim, a listing of every claim ever created (``/v1/claims``, 81,000 of them after
    a simulated 1,000-node day) spent 30 s of its 36 there. Teams change rarely, so all of a cluster's intervals
    fit in memory (one row a namespace and relabel).
    """

    intervals: Mapping[tuple[str, str], Sequence[tuple[datetime | None, datetime | None, str]]]
    """(lower, upper, team) per (cluster, namespace), ``[lower, upper)``, ``None`` for an open end; by lower."""
    overrides: Mapping[str, str]
    """``[teams] overrides``: namespace -> team, winning over the intervals."""

    def team(self, cluster: str, namespace: str, at: datetime) -> str:
        """The team billed for ``namespace`` at ``at`` (aware): its override, else its ``namespace_teams`` interval
        containing ``at``, else the namespace's name."""
        if namespace in self.overrides:
            return self.overrides[namespace]
        for lower, upper, team in self.intervals.get((cluster, namespace), ()):
            if (lower is None or lower <= at) and (upper is None or at < upper):
                return team
        return namespace

    def namespaces_of(self, teams: Collection[str]) -> list[str]:
        """Every namespace whose claims :meth:`team` may bill to one of ``teams`` at some instant, sorted: one
        overridden to one of them; else one with an interval of one of them (in any cluster of the book), or
        named as one of them (its team outside its intervals, or when no Namespace of that name was recorded).
        A superset (a namespace relabelled away still lists), so a listing filters by it and then by :meth:`team`.
        """
        wanted = set(teams)
        out = {ns for ns, team in self.overrides.items() if team in wanted}
        out.update(ns for ns in wanted if ns not in self.overrides)
        for (_, namespace), intervals in self.intervals.items():
            if namespace not in self.overrides and any(team in wanted for _, _, team in intervals):
                out.add(namespace)
        return sorted(out)


def read_team_book(conn: Connection, *, cluster: str | None,
                   overrides: Mapping[str, str] = NO_OVERRIDES) -> TeamBook:
    """Read :class:`TeamBook` for ``cluster`` (``None``: every cluster) from table ``namespace_teams``.

    The ranges are the projection's ``tstzrange(from, to)``, lower bound included and upper excluded; empty ones
    are skipped.
    """
    rows = conn.execute(text(
        "SELECT cluster, namespace, team, lower(valid) AS lo, upper(valid) AS hi FROM namespace_teams "
        "WHERE NOT isempty(valid)" + _cluster_filter(cluster) + " ORDER BY cluster, namespace, lower(valid)"),
        {"cluster": cluster}).all()
    intervals: dict[tuple[str, str], list[tuple[datetime | None, datetime | None, str]]] = defaultdict(list)
    for r in rows:
        intervals[(r.cluster, r.namespace)].append((r.lo, r.hi, r.team))
    return TeamBook(intervals=intervals, overrides=overrides)


def requested_counts(requests: Sequence[JSONValue]) -> dict[str, int]:
    """Devices requested per DeviceClass from ``ResourceClaim.spec.devices.requests[]`` (v1 shape).

    ``exactly`` with ``allocationMode: ExactCount`` counts ``count`` (default 1); ``All`` counts 0
    (unknown until allocated); ``firstAvailable`` counts its first sub-request. ``adminAccess``
    requests count 0 (they never occupy a device).
    """
    out: dict[str, int] = defaultdict(int)
    for req in requests:
        if not isinstance(req, dict):
            continue
        spec = req.get("exactly")
        if not isinstance(spec, dict):
            subs = req.get("firstAvailable")
            spec = subs[0] if isinstance(subs, list) and subs and isinstance(subs[0], dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("deviceClassName"), str):
            continue
        mode = spec.get("allocationMode") or "ExactCount"
        n = request_count(spec) if mode == "ExactCount" else 0
        if spec.get("adminAccess") is True:
            n = 0
        out[str(spec["deviceClassName"])] += n
    return dict(out)


def claims(conn: Connection, *, at: datetime, state: str = "all", cluster: str | None = None,
           namespace: str | None = None, name: str | None = None,
           overrides: Mapping[str, str] = NO_OVERRIDES) -> JSONObject:
    """Every claim known at ``at`` with its state, devices and live consumers: :func:`claims_page` unpaged.

    Returns:
        As :func:`claims_page`'s body.

    Raises:
        Invalid: unknown ``state``.
    """
    return claims_page(conn, at=at, state=state, cluster=cluster, namespace=namespace, name=name,
                       overrides=overrides).body


ClaimKey = tuple[str, str, str, str]
"""Where a claim sits in the claims listing: (cluster, ``metadata.namespace``, ``metadata.name``, ``metadata.uid``),
the order of index ``claims_listing_idx``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimsPage:
    """One page of :func:`claims_page`: the body, whether claims follow it, and the key of its last claim."""

    body: JSONObject
    more: bool
    last: ClaimKey | None
    """:data:`ClaimKey` of the page's last claim (pass it as ``after`` for the next page); ``None`` for an empty
    page."""


_CLAIM_CHUNK = 500
"""Claims read by the first statement of an unpaged listing. Each statement ends with a ``LIMIT`` so the planner
walks index ``claims_listing_idx`` in order and stops early (a cursor without one may be planned as a sort of every
claim); a page whose filters are decided in Python (team, token) reads further chunks from the last key read."""

_CLAIM_CHUNK_MAX = 20_000
"""Most claims one statement reads. Each chunk after the first reads four times as many as the one before, up
to this: a team's page among other teams' claims (one claim in 18 on the simulated 1,000-node day) took 18
statements of 101 claims, and every statement of the ``pending``/``allocated`` listing finds and sorts all
claims alive at T again (40 ms for 7,300), which made one team's first page of allocated claims 1.8 s."""

_LISTING_ORDER = " ORDER BY c.cluster, c.namespace, c.name, c.uid LIMIT :chunk"
_AFTER_KEY = " AND (c.cluster, c.namespace, c.name, c.uid) > (:k_cluster, :k_namespace, :k_name, :k_uid)"


def claims_listing_statement(state: str, *, cluster: bool = False, namespace: bool = False, name: bool = False,
                             origin: bool = False, team_namespaces: bool = False, after: bool = False) -> str:
    """The statement :func:`claims_page` reads its next chunk of claims with, in :data:`ClaimKey` order with their
    state at ``:at`` (columns ``cluster, uid, namespace, name, origin, deleted_at, st``; ``st`` is ``pending``,
    ``allocated``, ``deleted`` or NULL for a claim created by T whose first state starts later).

    Args:
        state: ``pending``, ``allocated``, ``deleted`` or ``all`` (bound as ``:state`` too).
        cluster, namespace, name, origin: whether the filter of that name applies (bound as ``:cluster``...).
        team_namespaces: only claims in the namespaces bound as ``:team_namespaces`` (a ``text[]``).
        after: start after the key bound as ``:k_cluster``, ``:k_namespace``, ``:k_name``, ``:k_uid``.

    ``:chunk`` binds the ``LIMIT``.

    ``pending`` / ``allocated`` start from the claims alive at T (``claim_states`` through its GiST index: a few
    thousand rows however long the history); ``deleted`` and ``all`` walk every claim created by T in key order
    (index ``claims_listing_idx``), so a page reads about its own claims and not the claims before it. A claim's
    ``claim_states`` intervals end when it is deleted, so a claim deleted by T has no state there: ``all`` looks
    one up only for a claim still alive at T. Of two intervals containing T (the projection never writes such,
    but a replay of bad data must still answer), the later one wins.
    """
    filters = ((" AND c.cluster = :cluster" if cluster else "") + (" AND c.namespace = :namespace" if namespace else "")
               + (" AND c.name = :name" if name else "") + (" AND c.origin = :origin" if origin else "")
               + (" AND c.namespace = ANY(CAST(:team_namespaces AS text[]))" if team_namespaces else ""))
    key = _AFTER_KEY if after else ""
    extra = filters + key
    latest_state = ("SELECT s.state FROM claim_states s WHERE s.cluster = c.cluster AND s.claim_uid = c.uid "
                    "AND s.valid @> :at ORDER BY lower(s.valid) DESC, s.row_id DESC LIMIT 1")
    columns = "c.cluster, c.uid, c.namespace, c.name, c.origin, c.deleted_at"
    if state in ("pending", "allocated"):
        # The live claims at T are found, joined and sorted whole (a few thousand), and the key applies after:
        # given the key first, the planner misjudged how many claims follow it (one) and walked the index of
        # every claim against each live one (9 s for a page of 81,000 claims, 7,300 alive).
        return (f"SELECT * FROM (SELECT DISTINCT ON (s.cluster, s.claim_uid) {columns}, s.state AS st "
                "FROM claim_states s JOIN claims c ON c.cluster = s.cluster AND c.uid = s.claim_uid "
                "WHERE s.valid @> :at AND c.created_at <= :at" + filters
                + " ORDER BY s.cluster, s.claim_uid, lower(s.valid) DESC, s.row_id DESC) c WHERE c.st = :state"
                + key + _LISTING_ORDER)
    if state == "deleted":
        return (f"SELECT {columns}, 'deleted' AS st FROM claims c WHERE c.created_at <= :at "
                "AND c.deleted_at <= :at" + extra + _LISTING_ORDER)
    return (f"SELECT {columns}, CASE WHEN c.deleted_at <= :at THEN 'deleted' ELSE ({latest_state}) END AS st "
            "FROM claims c WHERE c.created_at <= :at" + extra + _LISTING_ORDER)


def claims_page(conn: Connection, *, at: datetime, state: str = "all", cluster: str | None = None,
                namespace: str | None = None, name: str | None = None, origin: str | None = None,
                team: str | None = None, visible_teams: Collection[str] | None = None,
                overrides: Mapping[str, str] = NO_OVERRIDES, after: ClaimKey | None = None,
                limit: int | None = None) -> ClaimsPage:
    """Claims known at ``at`` with their state, devices and live consumers: ``limit`` of them after the claim
    ``after``.

    Sources: ``claims`` (origin, requests), ``claim_states`` (pending/allocated intervals),
    ``device_allocations`` and ``claim_consumers`` at ``at``, ``namespace_teams`` (:class:`TeamBook`). A claim
    deleted before ``at`` has state ``deleted``; one created after ``at`` is not listed.

    Why paged by key: a ledger lists every claim it ever recorded (81,000 after a simulated 1,000-node day,
    millions after a year). A page starts at the key after the previous page's last claim, found in index
    ``claims_listing_idx``, so page 800 costs what page 1 does (an offset read and dropped every claim before
    it), and a claim recorded between two pages neither repeats nor hides one. Each claim is first told apart by
    its state, origin and team from a few columns; only the page's claims are then read in full (requests,
    devices, consumers).

    Args:
        state: ``pending``, ``allocated``, ``deleted`` or ``all``.
        name: only claims of this ``metadata.name`` (every claim ever recorded under it); ``None``: all.
        origin: only claims of this origin (``manual``, ``template``, ``extended``); ``None``: all.
        team: only claims billed to this team (after ``overrides``); ``None``: all.
        visible_teams: only claims billed to one of these teams (a team-limited API token); ``None``: all.
        overrides: ``[teams] overrides`` (namespace -> team): ``team`` is the override where one exists.
        after: start after the claim of this key (exclusive; it need not exist); ``None``: from the first claim.
        limit: most claims returned, >= 1; ``None``: all from there.

    Returns:
        ``body`` ``{"at", "claims": [{"cluster", "namespace", "name", "uid", "origin", "state", "team",
        "requested": {deviceClassName: count}, "devices": [{"driver", "pool", "device", "request",
        "shareID", "consumedCapacity", "adminAccess"}], "consumers": [names]}]}`` sorted by cluster, namespace,
        name, uid (:data:`ClaimKey`, in the database's collation); ``consumedCapacity`` maps capacity name ->
        Quantity string (``{}`` for a whole device). ``more``: matching claims follow the page. ``last``: the
        last claim's key.

    Raises:
        Invalid: unknown ``state``.
    """
    if state not in ("pending", "allocated", "deleted", "all"):
        raise Invalid(f"state must be pending, allocated, deleted or all, got {shorten_repr(state)}")
    chunk = _CLAIM_CHUNK if limit is None else max(limit + 1, _CLAIM_CHUNK // 5)
    params: dict[str, object] = {"at": at, "cluster": cluster, "namespace": namespace, "name": name,
                                 "origin": origin, "state": state, "chunk": chunk}
    teams = read_team_book(conn, cluster=cluster, overrides=overrides)
    allowed = None if team is None else {team}
    if visible_teams is not None:
        allowed = set(visible_teams) if allowed is None else allowed & set(visible_teams)
    if allowed is not None:
        # The namespaces that can hold such claims, in SQL: one team's page among 18 teams' claims read every
        # claim before the team's first namespace (548 ms on the simulated 1,000-node day). The team of each
        # claim read is still checked below.
        params["team_namespaces"] = teams.namespaces_of(allowed)
    filters = {"cluster": cluster is not None, "namespace": namespace is not None, "name": name is not None,
               "origin": origin is not None, "team_namespaces": allowed is not None}
    first = claims_listing_statement(state, **filters)
    following = claims_listing_statement(state, **filters, after=True)
    picked: list[tuple[Row[tuple[str, str, str, str, str, datetime | None, str | None]], str, str]] = []
    more = False
    key = after
    while not more:
        if key is not None:
            params.update(k_cluster=key[0], k_namespace=key[1], k_name=key[2], k_uid=key[3])
        rows = conn.execute(text(first if key is None else following), params).all()
        for r in rows:
            key = (r.cluster, r.namespace, r.name, r.uid)
            st = r.st
            if st is None or (state != "all" and st != state):
                continue  # created by T, but neither alive nor deleted then (its first state starts later)
            # A deleted claim stays billed to the team of its last moment (a later relabel of its namespace must
            # not hand it, and its history, to another team).
            billed = teams.team(r.cluster, r.namespace, at if st != "deleted" or r.deleted_at is None
                                else min(at, r.deleted_at - timedelta(microseconds=1)))
            if allowed is not None and billed not in allowed:
                continue
            if limit is not None and len(picked) == limit:
                more = True
                break
            picked.append((r, st, billed))
        if len(rows) < chunk:
            break
        chunk = params["chunk"] = min(chunk * 4, _CLAIM_CHUNK_MAX)
    keys = [(r.cluster, r.uid) for r, _, _ in picked]
    last = picked[-1][0] if picked else None
    return ClaimsPage(body={"at": rfc3339(at), "claims": _claim_details(conn, at=at, picked=picked, keys=keys)},
                      more=more, last=None if last is None else (last.cluster, last.namespace, last.name, last.uid))


def _claim_details(conn: Connection, *, at: datetime,
                   picked: Sequence[tuple[Row[tuple[str, str, str, str, str, datetime | None, str | None]], str, str]],
                   keys: Sequence[tuple[str, str]]) -> list[JSONValue]:
    """The rows of :func:`claims_page` for its page's claims: requests, devices and consumers read for them only."""
    if not picked:
        return []
    bind = {"at": at, **key_arrays(keys)}
    requests = {(r.cluster, r.uid): r.requests for r in conn.execute(text(
        "SELECT c.cluster, c.uid, c.requests FROM unnest(CAST(:k0 AS text[]), CAST(:k1 AS text[])) AS k(cluster, uid) "
        "JOIN claims c ON c.cluster = k.cluster AND c.uid = k.uid"), bind)}
    allocs = conn.execute(text(
        "SELECT a.cluster, a.claim_uid, a.driver, a.pool, a.device, a.request, a.share_id, a.consumed_capacity, "
        "a.admin_access FROM unnest(CAST(:k0 AS text[]), CAST(:k1 AS text[])) AS k(cluster, claim_uid) "
        "JOIN device_allocations a ON a.cluster = k.cluster AND a.claim_uid = k.claim_uid AND a.valid @> :at "
        "ORDER BY a.driver, a.pool, a.device, a.share_id"), bind).all()
    by_claim: dict[tuple[str, str], list[JSONValue]] = defaultdict(list)
    for a in allocs:
        by_claim[(a.cluster, a.claim_uid)].append(
            {"driver": a.driver, "pool": a.pool, "device": a.device, "request": a.request,
             "shareID": a.share_id, "consumedCapacity": a.consumed_capacity, "adminAccess": a.admin_access})
    consumers = consumers_at(conn, at, None, keys)
    out: list[JSONValue] = []
    for r, st, billed in picked:
        key = f"{r.cluster}\x00{r.uid}"
        out.append({"cluster": r.cluster, "namespace": r.namespace, "name": r.name, "uid": r.uid,
                    "origin": r.origin, "state": st, "team": billed,
                    "requested": dict(requested_counts(requests[(r.cluster, r.uid)])),
                    "devices": by_claim.get((r.cluster, r.uid), []),
                    "consumers": [c.name for c in consumers.get(key, []) if c.live]})
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class IdleThresholds:
    """How long a claim must be idle before it is listed, per category (seconds)."""

    unreserved_s: float = 1800.0
    """Allocated with empty ``reservedFor``; 30 min covers a normal pod start."""
    inactive_consumers_s: float = 1800.0
    """Reserved only by pods that are not Running; 30 min covers image pulls and restarts."""
    unreferenced_s: float = 1800.0
    """Manual claims no pod references."""

    def for_category(self, category: str) -> float:
        """Return the threshold of ``category`` in seconds."""
        return {"unreserved": self.unreserved_s, "inactive-consumers": self.inactive_consumers_s,
                "unreferenced": self.unreferenced_s}[category]


def idle_claims(conn: Connection, *, at: datetime, min_idle: timedelta | None = None,
                thresholds: IdleThresholds = IdleThresholds(), cluster: str | None = None,
                overrides: Mapping[str, str] = NO_OVERRIDES, now: datetime | None = None) -> JSONObject:
    """The idle-claim report at ``at``: one row per claim, first matching category wins (DESIGN §11.7).

    Categories: ``unreserved`` (allocated, ``reservedFor`` empty), ``inactive-consumers`` (reserved
    only by pods not Running: Pending, Succeeded, Failed or deleted), ``unreferenced`` (manual claims
    no existing pod references by name, listed with 0 wasted hours when unallocated). ``idleSince`` is
    when the claim became idle; the threshold (or ``min_idle``) only decides whether it is listed.
    ``wastedDeviceHours`` (float hours, 6 decimals) = the device-hours :func:`usage` bills the claim from
    ``idleSince`` (:func:`claim_device_seconds`): a device it holds alone counts 1 per hour, a device held by
    several allocations at once (shares, a double booking, a device listed twice) counts the claim's equal
    parts of it, and ``adminAccess`` allocations count 0; a claim holding no device at ``at`` wastes 0. They are
    counted up to ``at`` or ``now`` (aware; default the database's ``now()``), whichever is earlier: for an ``at``
    in the future the claims are those idle now, and no hour that has not happened is counted (:func:`until_now`).
    Sources: tables ``claims``, ``claim_states``, ``claim_consumers``, ``pod_phases``, ``device_allocations``.
    ``team`` is the namespace's ``overrides`` entry when it has one (``[teams] overrides``).

    Returns:
        ``{"at", "claims": [{"cluster", "namespace", "name", "team", "category", "idleSince", "devices",
        "wastedDeviceHours"}]}`` sorted by namespace, name, cluster, uid (``cluster``: the ledger cluster the
        claim was recorded in, so that a report over every cluster tells same-named claims apart, and lists
        them in the same order every time).
    """
    until = until_now(conn, at, now)
    params: dict[str, object] = {"at": at, "cluster": cluster}
    rows = conn.execute(text(
        "SELECT c.cluster, c.uid, c.namespace, c.name, c.origin, c.created_at, s.state, lower(s.valid) AS since "
        "FROM claims c JOIN claim_states s ON s.cluster = c.cluster AND s.claim_uid = c.uid AND s.valid @> :at "
        "WHERE true" + _cluster_filter(cluster, "c") + " ORDER BY c.namespace, c.name, c.cluster, c.uid"),
        params).all()
    consumers = consumers_at(conn, at, cluster)
    # Set-based, a few queries per report however many claims are live: each category's evidence is read for the
    # claims that may fall in it, all at once, and the listed rows' devices and waste for the listed claims only.
    # (One query per live claim made a report over 5,600 live claims take seconds.)
    mine_of = {(r.cluster, r.uid): consumers.get(f"{r.cluster}\x00{r.uid}", []) for r in rows}
    unused = [(r.cluster, r.uid) for r in rows if not mine_of[(r.cluster, r.uid)]
              and (r.state == "allocated" or r.origin == "manual")]
    reserved_end = _last_reserved_ends(conn, unused, at)
    # Only claims whose consumers are all not Running can be ``inactive-consumers``: the others are not asked about.
    stopped = _stopped_running(conn, [(r.cluster, r.uid, c.uid) for r in rows if r.state == "allocated"
                                      and not any(x.running for x in mine_of[(r.cluster, r.uid)])
                                      for c in mine_of[(r.cluster, r.uid)] if c.uid], at)
    refs = _pod_references(conn, [(r.cluster, r.namespace, r.name) for r in rows
                                  if r.state != "allocated" and r.origin == "manual"
                                  and not mine_of[(r.cluster, r.uid)]], at)
    listed: list[tuple[_LiveClaim, str, datetime]] = []  # (claim, category, idle since)
    for r in rows:
        key = (r.cluster, r.uid)
        mine = mine_of[key]
        category: str | None = None
        since: datetime = r.since
        if r.state == "allocated" and not mine:
            category = "unreserved"
            since = max(x for x in (r.since, reserved_end.get(key)) if x is not None)
        elif r.state == "allocated" and not any(c.running for c in mine):
            category = "inactive-consumers"
            last_running = stopped.get(key)
            since = max(r.since, last_running) if last_running is not None else r.since
        elif r.origin == "manual" and not mine:
            referenced_now, last_reference = refs.get((r.cluster, r.namespace, r.name), (False, None))
            if not referenced_now:
                category = "unreferenced"
                since = max(x for x in (r.created_at, last_reference, reserved_end.get(key)) if x is not None)
        if category is None:
            continue
        limit = min_idle.total_seconds() if min_idle is not None else thresholds.for_category(category)
        if max((until - since).total_seconds(), 0.0) >= limit:
            listed.append((_LiveClaim(cluster=r.cluster, uid=r.uid, namespace=r.namespace, name=r.name),
                           category, since))
    devices = _devices_held(conn, [(claim.cluster, claim.uid) for claim, _, _ in listed], at)
    wasted = claims_device_seconds(conn, claims=[(claim.cluster, claim.uid, since) for claim, _, since in listed
                                                 if devices.get((claim.cluster, claim.uid))], end=until, now=until)
    teams = read_team_book(conn, cluster=cluster, overrides=overrides)
    out: list[JSONValue] = []
    for claim, category, since in listed:
        held = devices.get((claim.cluster, claim.uid), [])
        out.append({"cluster": claim.cluster, "namespace": claim.namespace, "name": claim.name,
                    "team": teams.team(claim.cluster, claim.namespace, at), "category": category,
                    "idleSince": rfc3339(since),
                    "devices": list[JSONValue](held),
                    # Only a claim holding devices at ``at`` wastes any (DESIGN §11.7: an unallocated one, 0).
                    "wastedDeviceHours": round(wasted[(claim.cluster, claim.uid)] / 3600, 6) if held else 0.0})
    return {"at": rfc3339(at), "claims": out}


@dataclass(frozen=True, slots=True, kw_only=True)
class _LiveClaim:
    """A claim of the idle-claim report: its ledger cluster, ``metadata.uid``, namespace and name."""

    cluster: str
    uid: str
    namespace: str
    name: str


def _last_reserved_ends(conn: Connection, claims: Sequence[tuple[str, str]],
                        at: datetime) -> dict[tuple[str, str], datetime]:
    """When each claim's last ``reservedFor`` entry that ended by ``at`` ended (table ``claim_consumers``).

    Args:
        claims: (cluster, claim uid) pairs; asked for the claims without a consumer at ``at`` only.

    Returns:
        The end (aware) per pair; a claim never reserved before ``at`` is missing.
    """
    if not claims:
        return {}
    rows = conn.execute(text(
        "SELECT c.cluster, c.claim_uid, max(upper(c.valid)) AS last FROM unnest(CAST(:k0 AS text[]), "
        "CAST(:k1 AS text[])) AS k(cluster, claim_uid) JOIN claim_consumers c ON c.cluster = k.cluster "
        "AND c.claim_uid = k.claim_uid AND upper(c.valid) <= :at GROUP BY c.cluster, c.claim_uid"),
        {**key_arrays(claims), "at": at}).all()
    return {(r.cluster, r.claim_uid): r.last for r in rows}


def _stopped_running(conn: Connection, consumers: Sequence[tuple[str, str, str]],
                     at: datetime) -> dict[tuple[str, str], datetime]:
    """When the last of each claim's consumer pods stopped Running before ``at`` (table ``pod_phases``).

    Args:
        consumers: (cluster, claim uid, consumer pod uid) triples, the claims' ``reservedFor`` at ``at``.

    Returns:
        The end of the last Running interval (aware) per (cluster, claim uid); a claim none of whose pods was
        seen Running is missing (its idle time runs from the allocation).
    """
    if not consumers:
        return {}
    rows = conn.execute(text(
        "SELECT k.cluster, k.claim_uid, max(upper(p.valid)) AS last FROM unnest(CAST(:k0 AS text[]), "
        "CAST(:k1 AS text[]), CAST(:k2 AS text[])) AS k(cluster, claim_uid, pod_uid) JOIN pod_phases p "
        "ON p.cluster = k.cluster AND p.pod_uid = k.pod_uid AND p.phase = 'Running' AND upper(p.valid) <= :at "
        "GROUP BY k.cluster, k.claim_uid"), {**key_arrays(consumers), "at": at}).all()
    return {(r.cluster, r.claim_uid): r.last for r in rows}


def _pod_references(conn: Connection, claims: Sequence[tuple[str, str, str]],
                    at: datetime) -> dict[tuple[str, str, str], tuple[bool, datetime | None]]:
    """Whether a pod references each claim by name at ``at``, and when the last reference before it ended.

    Source: ``pod_phases.claims`` (the claim names a pod's ``spec.resourceClaims`` and ``status`` give).

    Args:
        claims: (cluster, namespace, claim name) triples.

    Returns:
        (referenced at ``at``, end of the last reference that ended by then or ``None``) per triple; a claim no
        pod ever referenced is missing.
    """
    if not claims:
        return {}
    rows = conn.execute(text(
        "SELECT k.cluster, k.namespace, k.name, bool_or(p.valid @> :at) AS now, "
        " max(upper(p.valid)) FILTER (WHERE upper(p.valid) <= :at) AS last FROM unnest(CAST(:k0 AS text[]), "
        "CAST(:k1 AS text[]), CAST(:k2 AS text[])) AS k(cluster, namespace, name) JOIN pod_phases p "
        "ON p.cluster = k.cluster AND p.namespace = k.namespace AND p.claims ? k.name AND lower(p.valid) <= :at "
        "GROUP BY k.cluster, k.namespace, k.name"), {**key_arrays(claims), "at": at}).all()
    return {(r.cluster, r.namespace, r.name): (bool(r.now), r.last) for r in rows}


def _devices_held(conn: Connection, claims: Sequence[tuple[str, str]],
                  at: datetime) -> dict[tuple[str, str], list[str]]:
    """``driver/pool/device`` of each claim's allocations at ``at`` (not ``adminAccess``), sorted.

    Source: ``device_allocations``. A claim holding none is missing.
    """
    if not claims:
        return {}
    rows = conn.execute(text(
        "SELECT a.cluster, a.claim_uid, a.driver, a.pool, a.device FROM unnest(CAST(:k0 AS text[]), "
        "CAST(:k1 AS text[])) AS k(cluster, claim_uid) JOIN device_allocations a ON a.cluster = k.cluster "
        "AND a.claim_uid = k.claim_uid AND a.valid @> :at AND NOT a.admin_access "
        "ORDER BY a.driver, a.pool, a.device"), {**key_arrays(claims), "at": at}).all()
    out: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in rows:
        out[(r.cluster, r.claim_uid)].append(f"{r.driver}/{r.pool}/{r.device}")
    return out


def device_timeline(conn: Connection, *, driver: str, pool: str, device: str, start: datetime, end: datetime,
                    cluster: str | None = None, overrides: Mapping[str, str] = NO_OVERRIDES) -> JSONObject:
    """Inventory and allocation intervals of one device overlapping ``[start, end)``, by start time.

    Sources: ``device_inventory`` (``kind: inventory``: published by a slice, with node and slice) and
    ``device_allocations`` (``kind: allocation``: held by a claim). ``to`` is ``None`` while open. Each
    entry names its ``cluster`` (without ``cluster``, devices of one name in several clusters all show).
    An allocation's ``team`` is its namespace's ``overrides`` entry when there is one.

    Raises:
        UnknownDevice: the ledger never recorded the device (in inventory or in an allocation).
    """
    from ledger.errors import UnknownDevice

    params: dict[str, object] = {"d": driver, "p": pool, "n": device, "start": start, "end": end,
                                 "cluster": cluster}
    key = "driver = :d AND pool = :p AND device = :n" + _cluster_filter(cluster)
    known = conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM device_inventory WHERE {key}) "
                              f"OR EXISTS (SELECT 1 FROM device_allocations WHERE {key})"), params).scalar()
    if not known:
        raise UnknownDevice(f"no device {shorten(driver)}/{shorten(pool)}/{shorten(device)} was ever recorded")
    window = " AND NOT isempty(valid) AND valid && tstzrange(:start, :end, '[)')"
    inventory = conn.execute(text(
        f"SELECT cluster, lower(valid) AS s, upper(valid) AS e, node, slice_name FROM device_inventory "
        f"WHERE {key}{window}"),
        params).all()
    allocations = conn.execute(text(
        f"SELECT cluster, lower(valid) AS s, upper(valid) AS e, namespace, claim, team, share_id, admin_access, node "
        f"FROM device_allocations WHERE {key}{window}"), params).all()
    entries: list[tuple[datetime, int, JSONObject]] = []
    for r in inventory:
        entries.append((r.s, 0, {"cluster": r.cluster, "kind": "inventory", "from": rfc3339(r.s),
                                 "to": rfc3339(r.e) if r.e else None, "node": r.node, "sliceName": r.slice_name}))
    for r in allocations:
        entries.append((r.s, 1, {"cluster": r.cluster, "kind": "allocation", "from": rfc3339(r.s),
                                 "to": rfc3339(r.e) if r.e else None, "namespace": r.namespace, "claim": r.claim,
                                 "team": overrides.get(r.namespace, r.team), "shareID": r.share_id,
                                 "adminAccess": r.admin_access, "node": r.node}))
    entries.sort(key=lambda e: (e[0], e[1], str(e[2]["cluster"]), str(e[2].get("claim"))))
    return {"driver": driver, "pool": pool, "device": device, "from": rfc3339(start), "to": rfc3339(end),
            "entries": [e[2] for e in entries]}


def claim_uids(conn: Connection, *, namespace: str, name: str, cluster: str | None = None) -> list[tuple[str, str]]:
    """(cluster, uid) of every claim ever recorded as ``namespace/name``, oldest first (table ``claims``).

    Raises:
        UnknownClaim: none was recorded.
    """
    from ledger.errors import UnknownClaim

    rows = conn.execute(text("SELECT cluster, uid FROM claims WHERE namespace = :ns AND name = :n"
                             + _cluster_filter(cluster) + " ORDER BY created_at, uid"),
                        {"ns": namespace, "n": name, "cluster": cluster}).all()
    if not rows:
        raise UnknownClaim(f"no ResourceClaim {shorten(namespace)}/{shorten(name)} was ever recorded")
    return [(str(r.cluster), str(r.uid)) for r in rows]
