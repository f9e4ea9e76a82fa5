"""Occupancy counts: the occupancy totals of each cluster as a step function over time.

``GET /v1/occupancy`` answers totals over every device (``devices``, ``allocated``, ``free``,
``shared``). Aggregated from the intervals at T (:func:`ledger.projections.queries.occupancy_totals`)
they cost a visit of every device: 60-110 ms at 61,000 devices, 290-700 ms on a 10 M-event ledger
whose rows at T are spread over a large heap. The totals only change at the bounds of the intervals
they are made of, so this module stores them once per change, in table ``occupancy_counts``
(``cluster, at, devices, allocated, shared``: the totals from ``at`` until the next row), and a
question at T reads one row (btree ``(cluster, at)``).

The step function is computed in one SQL statement per cluster, set-based, with the same rules as the
aggregate at T (a test compares both at every change instant of recorded histories):

* a *unit* is a device, or every device consuming one counter set (``device_inventory.counter_set``):
  one piece of hardware; a device held while no inventory row covers it (off-slice) is its own unit;
* a unit is *present* while an inventory row of one of its devices, or a non-``adminAccess`` allocation
  of an off-slice device, covers the instant (``adminAccess`` never occupies: a device held by it alone
  after leaving its slice is not present); *allocated* while a non-``adminAccess`` allocation holds one
  of its devices; *shared* while a device of it is held by two non-``adminAccess`` allocations at once,
  or by one whose claim has more than one live consumer (``claim_consumers`` rows that are live: not pods,
  pods never observed, or pods observed in a non-terminal phase then);
* per unit and kind, the covering pieces are merged (``range_agg``); every merged range adds one at
  its lower bound and removes one at its upper bound, and a running sum over the instants gives the
  totals.

Coverage (table ``occupancy_count_coverage``): the stored rows answer every instant before
``valid_before``. The projection runner lowers it (and deletes the rows from there on) to the earliest
``occurred_at`` of each batch of events that may change the four source tables, in the batch's
transaction, since an event changes the intervals only at or after its own time. One exception: the first phase
recorded for a pod makes its consumer intervals *before* that phase not live (a pod known to the
ledger is live only in a non-terminal phase), so the first ``PodPhaseChanged`` of a pod lowers coverage
to the start of the pod's consumer intervals as well. :func:`refresh` recomputes from ``valid_before`` on (the
``occupancy-counts`` job every minute, ``rebuild``, ``demo``); until then questions at later instants use the aggregate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from sqlalchemy import Connection, text

from ledger.events import RecordedEvent
from ledger.projections.base import TERMINAL_SQL, clusters, earliest_by_cluster

UNCHANGED_BY = frozenset({"DeviceClassDefined", "DeviceClassChanged", "DeviceClassDeleted", "TeamAssigned"})
"""Event types that leave the counts alone: device classes are not read by them, and a team relabel only
changes ``device_allocations.team``, which cluster totals do not read. Every other type lowers coverage
(some, like ``ClaimCreated``, change none of the four tables: forgetting more is only slower)."""



def _at_least_two(name: str, source: str, key: str) -> str:
    """CTE ``name``: ranges ``r`` in which at least two ranges ``r`` of ``source`` with equal ``key``
    overlap, found by a running count over their bounds (linear in the rows, unlike a self-join)."""
    return (
        f"{name}_steps AS (SELECT {key}, t, sum(d) AS d FROM ("
        f"SELECT {key}, lower(r) AS t, 1 AS d FROM {source} "
        f"UNION ALL SELECT {key}, upper(r), -1 FROM {source} WHERE NOT upper_inf(r)) e GROUP BY {key}, t), "
        f"{name}_run AS (SELECT {key}, t, sum(d) OVER (PARTITION BY {key} ORDER BY t) AS n, "
        f"lead(t) OVER (PARTITION BY {key} ORDER BY t) AS next FROM {name}_steps), "
        f"{name} AS (SELECT {key}, tstzrange(t, next, '[)') AS r FROM {name}_run WHERE n >= 2)")


STEPS_SQL = f"""
WITH w AS (SELECT tstzrange(CAST(:t0 AS timestamptz), NULL, '[)') AS r),
inv AS (
    SELECT i.driver, i.pool, i.device, coalesce(i.counter_set, 'device:' || i.device) AS unit, i.valid * w.r AS r
    FROM device_inventory i, w WHERE i.cluster = :cluster AND i.valid && w.r),
cover AS (SELECT driver, pool, device, range_agg(r) AS m FROM inv GROUP BY driver, pool, device),
alloc AS (
    SELECT a.row_id, a.driver, a.pool, a.device, a.claim_uid, a.admin_access, a.valid * w.r AS r
    FROM device_allocations a, w WHERE a.cluster = :cluster AND a.valid && w.r AND NOT isempty(a.valid)),
-- When each consumer row of a holding claim is live: pods observed in a phase only in non-terminal ones.
live AS (
    SELECT c.claim_uid, unnest(CASE
        WHEN c.resource <> 'pods' OR NOT EXISTS (
            SELECT 1 FROM pod_phases p WHERE p.cluster = :cluster AND p.pod_uid = c.uid)
        THEN multirange(c.valid * w.r)
        ELSE multirange(c.valid * w.r) * coalesce((
            SELECT range_agg(p.valid) FROM pod_phases p WHERE p.cluster = :cluster AND p.pod_uid = c.uid
              AND p.phase NOT IN ({TERMINAL_SQL})), '{{}}'::tstzmultirange) END) AS r
    FROM claim_consumers c, w
    WHERE c.cluster = :cluster AND c.valid && w.r AND NOT isempty(c.valid)
      AND c.claim_uid IN (SELECT claim_uid FROM alloc WHERE NOT admin_access)),
{_at_least_two('multi', 'live', 'claim_uid')},
busy AS (SELECT driver, pool, device, r FROM alloc WHERE NOT admin_access),
{_at_least_two('doubly_held', 'busy', 'driver, pool, device')},
-- Pieces per device and kind: held (any allocation, adminAccess included: only to count the off-slice
-- devices a page lists), allocated (non-adminAccess; also makes the device present where no inventory
-- row covers it, since adminAccess never occupies), shared (two at once, or one of a claim with several
-- consumers).
pieces AS (
    SELECT 'h' AS kind, driver, pool, device, r FROM alloc
    UNION ALL SELECT 'a', driver, pool, device, r FROM busy
    UNION ALL SELECT 's', driver, pool, device, r FROM doubly_held
    UNION ALL SELECT 's', a.driver, a.pool, a.device, a.r * m.r FROM alloc a
        JOIN multi m ON m.claim_uid = a.claim_uid AND m.r && a.r WHERE NOT a.admin_access),
-- The parts of the pieces no inventory row of their device covers (computed once, read twice below).
outside AS (
    SELECT k.kind, k.driver, k.pool, k.device, unnest(multirange(k.r) - coalesce(c.m, '{{}}'::tstzmultirange)) AS r
    FROM pieces k LEFT JOIN cover c ON c.driver = k.driver AND c.pool = k.pool AND c.device = k.device),
-- The same pieces per unit: inside an inventory row the row's unit, outside every row the device itself.
-- Present: an inventory row, or outside every row a non-adminAccess allocation (DESIGN §11.4).
unit_pieces AS (
    SELECT 'p' AS kind, driver, pool, unit, r FROM inv
    UNION ALL SELECT k.kind, i.driver, i.pool, i.unit, k.r * i.r FROM pieces k JOIN inv i
        ON i.driver = k.driver AND i.pool = k.pool AND i.device = k.device AND i.r && k.r WHERE k.kind <> 'h'
    UNION ALL SELECT kind, driver, pool, 'device:' || device, r FROM outside WHERE kind <> 'h'
    UNION ALL SELECT 'p', driver, pool, 'device:' || device, r FROM outside WHERE kind = 'a'
    -- Off-slice devices (held by any allocation, no inventory row): counted apart, so a page can skip
    -- looking for them; one held by adminAccess alone is listed although it is not present.
    UNION ALL SELECT 'o', driver, pool, device, r FROM outside WHERE kind = 'h'),
unit_ranges AS (
    SELECT kind, unnest(range_agg(r)) AS r FROM unit_pieces WHERE NOT isempty(r) GROUP BY kind, driver, pool, unit),
steps AS (
    SELECT t, sum(dp) AS dp, sum(da) AS da, sum(ds) AS ds, sum(dov) AS dov FROM (
        SELECT lower(r) AS t, (kind = 'p')::int AS dp, (kind = 'a')::int AS da, (kind = 's')::int AS ds,
               (kind = 'o')::int AS dov
        FROM unit_ranges
        UNION ALL SELECT upper(r), -(kind = 'p')::int, -(kind = 'a')::int, -(kind = 's')::int, -(kind = 'o')::int
        FROM unit_ranges WHERE NOT upper_inf(r)
        UNION ALL SELECT CAST(:t0 AS timestamptz), 0, 0, 0, 0) e
    GROUP BY t),
totals AS (
    SELECT t, sum(dp) OVER o AS devices, sum(da) OVER o AS allocated, sum(ds) OVER o AS shared,
           sum(dov) OVER o AS off_slice
    FROM steps WINDOW o AS (ORDER BY t)),
changes AS (
    SELECT t, devices, allocated, shared, off_slice,
           lag(ROW(devices, allocated, shared, off_slice)) OVER o AS before
    FROM totals WINDOW o AS (ORDER BY t))
SELECT t AS at, devices, allocated, shared, off_slice FROM changes
WHERE before IS NULL OR ROW(devices, allocated, shared, off_slice) IS DISTINCT FROM before
"""
"""The step function of one cluster's totals from ``:t0`` on (``-infinity`` for all of history): rows
``(at, devices, allocated, shared, off_slice)``, the first at ``:t0``, one more per instant where a
total changes."""


REFRESH_WORK_MEM = "256MB"
"""``work_mem`` of a refresh's transaction (PostgreSQL memory per sort or hash before it spills to disk)."""


def forget(conn: Connection, earliest: Mapping[str, datetime]) -> None:
    """Lower each cluster's coverage to ``earliest[cluster]`` and delete its counts from there on.

    Runs in the transaction of the batch that changed the intervals. The coverage row is created at
    ``-infinity`` for a cluster seen for the first time; its row lock orders this against
    :func:`refresh` (a refresh in progress finishes first, then its rows from ``earliest`` on go).
    """
    for cluster, at in sorted(earliest.items()):
        conn.execute(text(
            "INSERT INTO occupancy_count_coverage AS v (cluster, valid_before) VALUES (:c, '-infinity') "
            "ON CONFLICT (cluster) DO UPDATE SET valid_before = least(v.valid_before, :at)"), {"c": cluster, "at": at})
        conn.execute(text("DELETE FROM occupancy_counts WHERE cluster = :c AND at >= :at"), {"c": cluster, "at": at})


def forget_for_batch(conn: Connection, batch: Iterable[RecordedEvent]) -> None:
    """:func:`forget` what a batch of events may change; call it *before* applying the batch.

    Per cluster: the earliest ``occurred_at`` of an event not in :data:`UNCHANGED_BY`; and for each pod
    whose first phase the batch records (a ``PodPhaseChanged`` of a pod without ``pod_phases`` rows yet),
    the earliest start of that pod's consumer rows (``claim_consumers`` by pod uid, index
    ``claim_consumers_consumer_idx``): only the first phase changes whether earlier consumer rows were
    live. Consumer rows the batch itself adds start at or after its earliest event, already covered.
    """
    changing = [event for event in batch if event.type not in UNCHANGED_BY]
    earliest = earliest_by_cluster(changing)
    pods: dict[str, set[str]] = {}
    for event in changing:
        uid = event.payload.get("uid")
        if event.type == "PodPhaseChanged" and isinstance(uid, str):
            pods.setdefault(event.cluster, set()).add(uid)
    for cluster, uids in sorted(pods.items()):
        start = conn.execute(text(
            "SELECT min(lower(c.valid)) FROM claim_consumers c WHERE c.cluster = :c AND c.uid = ANY(:uids) "
            "AND c.resource = 'pods' AND NOT isempty(c.valid) AND NOT EXISTS (SELECT 1 FROM pod_phases p "
            " WHERE p.cluster = c.cluster AND p.pod_uid = c.uid)"), {"c": cluster, "uids": sorted(uids)}).scalar()
        if isinstance(start, datetime) and start < earliest[cluster]:
            earliest[cluster] = start
    forget(conn, earliest)


def forget_all(conn: Connection) -> None:
    """Delete every count and set every cluster's coverage to ``-infinity`` (a rebuild of the intervals)."""
    conn.execute(text("DELETE FROM occupancy_counts"))
    conn.execute(text("UPDATE occupancy_count_coverage SET valid_before = '-infinity'"))
    conn.execute(text(
        "INSERT INTO occupancy_count_coverage (cluster, valid_before) "
        "SELECT unnest(CAST(:clusters AS text[])), '-infinity'::timestamptz ON CONFLICT (cluster) DO NOTHING"),
        {"clusters": clusters(conn)})


def uncovered_clusters(conn: Connection) -> list[str]:
    """Clusters whose counts do not cover every instant (``occupancy_count_coverage``), sorted."""
    return [str(c) for c in conn.execute(text(
        "SELECT cluster FROM occupancy_count_coverage WHERE valid_before <> 'infinity' ORDER BY cluster")).scalars()]


def refresh(conn: Connection, cluster: str) -> int:
    """Recompute ``cluster``'s counts from its coverage on, and cover every instant; returns rows written.

    Locks the cluster's coverage row first (``FOR UPDATE``), so a batch applied meanwhile waits and
    then forgets what it changes. Sources: ``device_inventory``, ``device_allocations``,
    ``claim_consumers`` and ``pod_phases`` intervals overlapping ``[valid_before, ∞)`` (:data:`STEPS_SQL`).
    """
    conn.execute(text("INSERT INTO occupancy_count_coverage (cluster, valid_before) VALUES (:c, '-infinity') "
                      "ON CONFLICT (cluster) DO NOTHING"), {"c": cluster})
    # As text: psycopg cannot load the infinite timestamps coverage uses; PostgreSQL reads them back.
    t0 = conn.execute(text("SELECT CAST(valid_before AS text) FROM occupancy_count_coverage WHERE cluster = :c "
                           "FOR UPDATE"), {"c": cluster}).scalar_one()
    if t0 == "infinity":
        return 0
    # Sorting and aggregating every interval of a long history (millions of ranges on a 10 M-event ledger)
    # spills to disk under the default 4 MB; the setting ends with the caller's transaction.
    conn.execute(text("SELECT set_config('work_mem', :mem, true)"), {"mem": REFRESH_WORK_MEM})
    conn.execute(text("DELETE FROM occupancy_counts WHERE cluster = :cluster AND at >= CAST(:t0 AS timestamptz)"),
                 {"cluster": cluster, "t0": t0})
    written = conn.execute(text(
        "INSERT INTO occupancy_counts (cluster, at, devices, allocated, shared, off_slice) "
        f"SELECT :cluster, at, devices, allocated, shared, off_slice FROM ({STEPS_SQL}) AS steps"),
        {"cluster": cluster, "t0": t0}).rowcount
    conn.execute(text("UPDATE occupancy_count_coverage SET valid_before = 'infinity' WHERE cluster = :c"),
                 {"c": cluster})
    return int(written)


TOTALS_AT_SQL = (
    "SELECT count(*) AS clusters, count(*) FILTER (WHERE :at < v.valid_before) AS covered, "
    " coalesce(sum(c.devices), 0) AS devices, coalesce(sum(c.allocated), 0) AS allocated, "
    " coalesce(sum(c.shared), 0) AS shared, coalesce(sum(c.off_slice), 0) AS off_slice "
    "FROM occupancy_count_coverage v LEFT JOIN LATERAL (SELECT o.devices, o.allocated, o.shared, o.off_slice "
    " FROM occupancy_counts o WHERE o.cluster = v.cluster AND o.at <= :at ORDER BY o.at DESC LIMIT 1) c ON true "
    "WHERE CAST(:cluster AS text) IS NULL OR v.cluster = :cluster")
"""What :func:`totals_at` runs (``:at``, ``:cluster``): per covered cluster the last row at or before ``:at``
(btree ``occupancy_counts_pkey`` walked backwards from ``(cluster, :at)``, one entry)."""


def totals_at(conn: Connection, at: datetime, cluster: str | None) -> dict[str, int] | None:
    """The totals at ``at`` from ``occupancy_counts``, or ``None`` when a cluster asked for is not covered.

    ``cluster=None`` sums every cluster, and needs every coverage row to cover ``at``.

    Returns:
        ``{"devices", "allocated", "shared", "off_slice"}``: counts of units (see the module docstring),
        and of devices held (by any allocation, ``adminAccess`` included: the devices a page lists
        off-slice) while no inventory row covers them.
    """
    row = conn.execute(text(TOTALS_AT_SQL), {"at": at, "cluster": cluster}).one()
    if row.clusters == 0 or row.covered < row.clusters:
        return None
    return {"devices": int(row.devices), "allocated": int(row.allocated), "shared": int(row.shared),
            "off_slice": int(row.off_slice)}
