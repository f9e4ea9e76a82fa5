"""Hourly usage rollups: device-seconds per hour per (team, namespace, DeviceClass, model, node, driver).

The hourly job (``workers/jobs.py``) recomputes whole hours from the ``device_allocations``
intervals into table ``usage_rollups`` and, summed over nodes, into ``usage_rollups_by_team`` (delete +
insert per hour in one transaction, so a re-run replaces them, both tables always hold the same hours,
and a late event is absorbed by the next run over that hour). Every transaction that writes or forgets rolled
hours holds :func:`ledger.store.locks.lock_rolled_hours` first, so two runs at once (two ``dra-ledger jobs``,
or ``watch`` and ``jobs``) take turns instead of each inserting a copy, and a projection batch forgets the rows
of a chunk that summed the intervals before the batch changed them. A run covers its hours in chunks of at
most :data:`ROLLUP_MAX_PIECES` interval-hours (:func:`next_chunk`), each in its own transaction
(``ledger.services.rollup_chunks``), so memory stays bounded however far back the oldest interval starts,
and a run stopped between chunks keeps the chunks it committed. :func:`usage_from_rollups` answers a usage
question from the rolled hours inside the window plus the live intervals for the partial hours at its
edges (and for any whole hour not rolled up), so it is exact at the window edges and equal to
:func:`ledger.projections.queries.usage` on the same data.

Splitting rule (as ``queries.usage``, :mod:`ledger.projections.split`): when several allocations hold one
device at once, each device-second goes to them by their ``consumedCapacity`` fractions of the device when
every one states one, else equally; ``adminAccess`` allocations are not billed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text

from ledger.errors import Invalid, shorten_repr
from ledger.events import RecordedEvent
from ledger.projections.base import cluster_filter as _cluster_filter
from ledger.projections.models import PUBLISHED_EVENTS
from ledger.projections.queries import GROUP_BY, NO_OVERRIDES, present, rfc3339
from ledger.projections.split import Interval, allocation_fraction, split, split_columns
from ledger.store.locks import lock_rolled_hours
from ledger.store.tables import usage_rollups, usage_rollups_by_team
from ledger.types import JSONObject, JSONValue

HOUR = timedelta(hours=1)
KEY_COLUMNS = ("team", "namespace", "device_class", "model", "node", "driver")
"""The key of a ``usage_rollups`` row after (cluster, hour)."""
KEYABLE = (*KEY_COLUMNS, "cluster")
"""Columns :func:`live_seconds` may key by: the rollup key, and ``cluster`` for ``groupBy=cluster``."""
Key = tuple[str, ...]
"""Values of the asked key columns, in their order; '' stands for an unknown value."""
Seconds = dict[tuple[str, datetime | None, Key], float]
"""Device-seconds (float s) per (cluster, UTC hour or ``None``, key)."""
ROLLUP_TABLES = (usage_rollups.name, usage_rollups_by_team.name)
"""Written and forgotten together, hour by hour, so both always hold the same hours."""
ROLLUP_MAX_PIECES = 20_000
"""Most (allocation interval, hour) pieces one chunk of the hourly rollup reads (:func:`next_chunk`), so the
rollup's memory does not grow with the hours it covers: an allocation dated decades back (a bad
``allocationTimestamp``) is rolled up in many bounded chunks, not as millions of hours at once. Measured
with tracemalloc on one GPU held for three years: ~18 MB peak at 20,000, ~38 MB for the 26,284 hours in one
statement; a year-1 allocation (17.7 M hours) ran at ~180 MB RSS, against 6+ GB before. A chunk of one hour
is always whole (the 10 M-event ledger has ~34,000 ``usage_rollups`` rows an hour)."""


def floor_hour(t: datetime) -> datetime:
    """Start of the UTC hour containing ``t``."""
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(t: datetime) -> datetime:
    """Smallest UTC hour boundary at or after ``t``."""
    floor = floor_hour(t)
    return floor if floor == t else floor + HOUR


def live_seconds(conn: Connection, *, start: datetime, end: datetime, cluster: str | None, by_hour: bool,
                 columns: Sequence[str] = KEY_COLUMNS, now: datetime | None = None) -> Seconds:
    """Device-seconds in ``[start, end)`` from the live intervals, per (cluster, UTC hour or None, key).

    Source: ``device_allocations`` (not ``adminAccess``), clipped exactly to the window and to ``now``
    (default the database's ``now()``) as in :func:`ledger.projections.queries.usage`; concurrent
    allocations of one device share each second by :func:`ledger.projections.split.split`.

    Args:
        by_hour: split the seconds by the UTC hour they fall in (else the hour is ``None``).
        columns: the key, a sequence of :data:`KEYABLE` (``driver`` and the grouping column of a
            usage question, say); fewer columns mean fewer rows from the database.
        now: nothing counts after this instant (aware); ``None``: the database's ``now()``.

    Returns:
        Float seconds > 0 per ``(cluster, hour, key)``; the key holds ``columns``' values in their order.

    Raises:
        ValueError: a column outside :data:`KEYABLE` (a programming error: columns go into the SQL).
    """
    if not set(columns) <= set(KEYABLE):
        raise ValueError(f"key columns must be among {KEYABLE}, got {columns}")
    keys = ", ".join(f"k{i}" for i in range(len(columns)))
    # Only seconds held by more than one allocation of a device need the split, done in Python
    # (ledger.projections.split), and only they need the consumed capacity and the device's capacity. An interval
    # that overlaps no other interval of its device is billed whole to its own key, so those are summed in SQL per
    # key (and hour): on the 10 M-event ledger the partial hour at the end of a 30-day window holds ~40,000
    # intervals, and fetching them all into Python was most of the 1,057 ms the usage query took. The overlapping
    # ones go to Python, and only they: the isolated intervals of the same device cover no second of theirs, so the
    # sweep splits theirs the same without. Sorted by start within a device, an interval overlaps an earlier one
    # when it starts before the latest earlier end, and a later one when the next start comes before its own end;
    # touching intervals [a, b) [b, c) share nothing, as in the sweep. One window frame serves both (lead() ignores
    # the frame), so PostgreSQL sorts and scans once. Devices are told apart by a 64-bit hash of their key, not by
    # the four text columns: on 18,000 edge intervals the text sort took 36 ms of the query's 70 ms; the hash made
    # it 57 ms, and with the single frame 50 ms. A collision can only merge two devices' intervals into one
    # partition, which marks more intervals as overlapping (never fewer); Python then splits by the real device key,
    # so the result is the same.
    hours = ("CROSS JOIN LATERAL generate_series(date_trunc('hour', s, 'UTC'), e, interval '1 hour') AS p(hour) "
             "WHERE p.hour < e AND" if by_hour else "CROSS JOIN (VALUES (CAST(NULL AS timestamptz))) AS p(hour) WHERE")
    rows = conn.execute(text(
        "WITH clipped AS ("
        " SELECT cluster, driver, pool, device, hash_record_extended((cluster, driver, pool, device), 0) AS hashed, "
        + ", ".join(f"coalesce({c}, '') AS k{i}" for i, c in enumerate(columns)) + ", "
        " greatest(lower(valid), :start) AS s, " + present("valid") + " AS e, valid, consumed_capacity, claim_uid "
        " FROM device_allocations WHERE NOT admin_access AND NOT isempty(valid) "
        " AND valid && tstzrange(:start, :end, '[)')" + _cluster_filter(cluster) + "), "
        "marked AS (SELECT *, coalesce(s < max(e) OVER earlier, false) OR coalesce(lead(s) OVER earlier < e, false) "
        " AS shared FROM clipped WHERE e > s "
        " WINDOW earlier AS (PARTITION BY hashed ORDER BY s ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)) "
        # GREATEST/LEAST skip NULLs: with no hour (by_hour False) a piece is the whole clipped interval.
        f"SELECT cluster, {keys}, p.hour, extract(epoch FROM sum(least(e, p.hour + interval '1 hour') "
        " - greatest(s, p.hour))) AS seconds, NULL AS driver, NULL AS pool, NULL AS device, NULL AS s, NULL AS e, "
        " NULL AS claim_uid, NULL::jsonb AS consumed, NULL::jsonb AS capacity "
        f"FROM marked {hours} NOT shared GROUP BY cluster, {keys}, p.hour "
        f"UNION ALL SELECT cluster, {keys}, NULL, NULL, driver, pool, device, s, e, claim_uid, "
        + split_columns("marked") + " "
        "FROM marked WHERE shared"),
        {"start": start, "end": end, "cluster": cluster, "now": now}).all()
    width = len(columns)
    out: Seconds = defaultdict(float)
    # (cluster, driver, pool, device) -> its overlapping intervals, billed to (cluster, hour, key)
    per_device: dict[tuple[str, str, str, str], list[Interval[tuple[str, datetime | None, Key]]]] = defaultdict(list)
    for r in rows:
        cluster_name, key = str(r[0]), tuple(str(v) for v in r[1:1 + width])
        hour, seconds, driver, pool, device, s, e, claim, consumed, capacity = r[1 + width:]
        if driver is None:
            out[(cluster_name, hour.astimezone(UTC) if hour is not None else None, key)] += float(seconds)
            continue
        pieces = per_device[(cluster_name, driver, pool, device)]
        fraction = allocation_fraction(consumed, capacity, driver=driver)
        if not by_hour:
            pieces.append((s, e, (cluster_name, None, key), fraction, claim))
            continue
        h = floor_hour(s)
        while h < e:  # cut at hour boundaries, so no elementary span of the sweep crosses an hour
            pieces.append((max(s, h), min(e, h + HOUR), (cluster_name, h, key), fraction, claim))
            h += HOUR
    for intervals in per_device.values():
        split(intervals, out)
    return out


def hour_pieces(conn: Connection, *, start: datetime, end: datetime, cluster: str | None = None) -> int:
    """How many (allocation interval, UTC hour) pieces :func:`rollup_usage` over ``[start, end)`` would read.

    An upper bound, >= 0, on the rows of a rollup of those hours: every ``usage_rollups`` row, and every
    piece of an interval shared with others that :func:`live_seconds` cuts in Python, is at least one such
    piece. Source: ``device_allocations`` (not ``adminAccess``), clipped to the window and to the database's
    ``now()`` as :func:`live_seconds` clips them; computed from the interval ends alone (no row per hour),
    so it costs a scan of the intervals overlapping the window however many hours they span.
    """
    value = conn.execute(text(
        "SELECT coalesce(sum(ceil(extract(epoch FROM e - date_trunc('hour', s, 'UTC')) / 3600)), 0) FROM ("
        " SELECT greatest(lower(valid), :start) AS s, " + present("valid") + " AS e FROM device_allocations"
        " WHERE NOT admin_access AND NOT isempty(valid) AND valid && tstzrange(:start, :end, '[)')"
        + _cluster_filter(cluster) + ") AS clipped WHERE e > s"),
        {"start": start, "end": end, "cluster": cluster, "now": None}).scalar_one()
    return int(value)


def next_chunk(conn: Connection, *, start: datetime, end: datetime, hours: int, cluster: str | None = None,
               max_pieces: int = ROLLUP_MAX_PIECES) -> tuple[datetime, int | None]:
    """Where the next chunk of a rollup from the hour ``start`` towards the hour ``end`` stops.

    The chunk is ``hours`` hours (at least 1, never past ``end``), shortened until :func:`hour_pieces` is at
    most ``max_pieces`` or it is one hour long: a single hour is always rolled up whole, however many
    pieces it holds (a bound of ``max_pieces`` or one hour's pieces, whichever is larger).

    Args:
        start: a UTC hour boundary before ``end``.
        end: a UTC hour boundary.
        hours: the length to try first, in hours (the caller's guess from the previous chunk).
        max_pieces: the bound, in pieces (see :func:`hour_pieces`).

    Returns:
        The chunk's end (a UTC hour boundary in ``(start, end]``) and its pieces, ``None`` when a one-hour
        chunk was not counted.
    """
    length = max(1, min(hours, (end - start) // HOUR))
    while length > 1:
        pieces = hour_pieces(conn, start=start, end=start + length * HOUR, cluster=cluster)
        if pieces <= max_pieces:
            return start + length * HOUR, pieces
        # Strictly shorter (pieces > max_pieces), so the loop ends; pieces per hour is taken as even.
        length = max(1, length * max_pieces // pieces)
    return start + HOUR, None


def _forget_hours(conn: Connection, where: str, params: Mapping[str, object]) -> None:
    for table in ROLLUP_TABLES:
        conn.execute(text(f"DELETE FROM {table} WHERE {where}"), params)


def _rolled_clusters(conn: Connection) -> set[str]:
    """Clusters with rows in either rollup table, found by skipping along their ``(cluster, hour)`` indexes
    (one index probe per cluster, not a scan of the rows)."""
    found: set[str] = set()
    for table in ROLLUP_TABLES:
        found.update(conn.execute(text(
            f"WITH RECURSIVE c(cluster) AS (SELECT min(cluster) FROM {table} UNION ALL "
            f"SELECT (SELECT min(cluster) FROM {table} WHERE cluster > c.cluster) FROM c WHERE c.cluster IS NOT NULL) "
            "SELECT cluster FROM c WHERE cluster IS NOT NULL")).scalars())
    return found


def rollup_usage(conn: Connection, *, start: datetime, end: datetime, cluster: str | None = None,
                 now: datetime | None = None) -> int:
    """Recompute the whole hours in ``[floor(start), floor(end))`` into ``usage_rollups`` and
    ``usage_rollups_by_team``.

    Source: ``device_allocations`` through :func:`live_seconds`. Idempotent: the hours' rows of both
    tables are deleted and inserted again in the caller's transaction, which holds the rolled-hours lock
    (:func:`ledger.store.locks.lock_rolled_hours`) from here to its end: a concurrent rollup or forget waits for
    the commit, and this call waits for theirs (never fails for them). Take the lock earlier when the
    transaction reads ``device_allocations`` before this call (see its lock order).

    Args:
        start: first instant to cover (rounded down to its UTC hour).
        end: rolled up to the last whole hour before it (an unfinished hour is left to the live
            intervals).
        cluster: only this cluster (``None``: every cluster).
        now: ``computed_at`` of the rows (default: now).

    Returns:
        How many hours were recomputed.
    """
    h0, h1 = floor_hour(start), floor_hour(end)
    if h1 <= h0:
        return 0
    # Before the intervals are read: the sums below are of the rows committed when no other writer of these
    # hours is open, and a second run replaces this one's rows instead of adding its own beside them.
    lock_rolled_hours(conn)
    seconds = live_seconds(conn, start=h0, end=h1, cluster=cluster, by_hour=True)
    params: dict[str, object] = {"h0": h0, "h1": h1, "cluster": cluster}
    hours = "hour >= :h0 AND hour < :h1" + _cluster_filter(cluster)
    if cluster is None:
        # Every cluster by name, so the statements below read the hours through the (cluster, hour) indexes:
        # without a cluster PostgreSQL scans the whole table, once per chunk of a long run (an allocation
        # dated decades back fills the table with millions of hours). The clusters of the rows about to be
        # written and those of rows already stored are all the rows these hours can hold.
        params["clusters"] = sorted(_rolled_clusters(conn) | {c for c, _, _ in seconds})
        hours = "cluster = ANY(:clusters) AND hour >= :h0 AND hour < :h1"
    _forget_hours(conn, hours, params)
    stamp = now or datetime.now(UTC)
    rows = [{"cluster": c, "hour": hour, "team": k[0], "namespace": k[1], "device_class": k[2] or None,
             "model": k[3] or None, "node": k[4] or None, "driver": k[5], "device_seconds": s, "computed_at": stamp}
            for (c, hour, k), s in sorted(seconds.items(), key=lambda i: (i[0][0], str(i[0][1]), i[0][2]))
            if s > 0]  # a team billed nothing (shares that consumed 0 beside others) has no row, as in usage
    if rows:
        conn.execute(text(
            "INSERT INTO usage_rollups (cluster, hour, team, namespace, device_class, model, node, driver, "
            "device_seconds, computed_at) VALUES (:cluster, :hour, :team, :namespace, :device_class, :model, "
            ":node, :driver, :device_seconds, :computed_at)"), rows)
        # The node-less rollup is the sum of the rows just written, so the two tables agree to the float
        # rounding of a sum and hold exactly the same hours.
        conn.execute(text(
            "INSERT INTO usage_rollups_by_team (cluster, hour, team, namespace, device_class, model, driver, "
            "device_seconds, computed_at) SELECT cluster, hour, team, namespace, device_class, model, driver, "
            "sum(device_seconds), :now FROM usage_rollups WHERE " + hours
            + " GROUP BY cluster, hour, team, namespace, device_class, model, driver"), {**params, "now": stamp})
    return int((h1 - h0) / HOUR)


INVENTORY_EVENTS = frozenset({"DevicePublished", "DeviceUpdated", "DeviceWithdrawn"})
"""The event types that change ``device_inventory``, whose capacities the split of shared devices reads."""


_EARLIEST_OF_DEVICES = (
    "SELECT a.cluster, min(lower(a.valid)) FROM unnest(CAST(:c AS text[]), CAST(:d AS text[]), "
    " CAST(:p AS text[]), CAST(:v AS text[]), CAST(:t AS timestamptz[])) AS k(cluster, driver, pool, device, t) "
    "JOIN device_allocations a ON a.cluster = k.cluster AND a.driver = k.driver AND a.pool = k.pool "
    " AND a.device = k.device ")
"""Per cluster, the earliest start of the ``device_allocations`` rows of the devices given as the parameters of
:func:`_earliest_by_device`; the caller adds the rest of the join's condition and ``GROUP BY a.cluster``."""


def _earliest_by_device(events: Iterable[RecordedEvent], types: frozenset[str]) -> dict[str, list[object]]:
    """Per device of the ``types`` events, its earliest ``occurred_at``: as query parameters ``c``, ``d``, ``p``,
    ``v`` (cluster, driver, pool, device) and ``t``, arrays in device order; empty when no event is of ``types``."""
    first: dict[tuple[str, str, str, str], datetime] = {}
    for e in events:
        if e.type in types:
            key = (e.cluster, str(e.payload.get("driver")), str(e.payload.get("pool")), str(e.payload.get("device")))
            first[key] = min(e.occurred_at, first.get(key, e.occurred_at))
    keys = sorted(first)
    return {"c": [k[0] for k in keys], "d": [k[1] for k in keys], "p": [k[2] for k in keys],
            "v": [k[3] for k in keys], "t": [first[k] for k in keys]} if keys else {}


def unpublished_starts(conn: Connection, events: Iterable[RecordedEvent]) -> dict[str, datetime]:
    """Per cluster, the earliest start of an allocation that DevicePublished / DeviceUpdated ``events`` will fill.

    Call it *before* applying the events: it reads the rows still waiting for their device (``awaiting_device_from``
    set, index ``device_allocations_awaiting_device_idx``) whose allocation began at or after the device's earliest
    such event, which are the rows the events fill (``ledger.projections.models.FILL_UNPUBLISHED``). Their ``model`` and
    ``node`` change from their own start, so rolled hours from there are forgotten; a device event that fills
    nothing forgets nothing (a driver restart does not send the rollups back to the slice's creation).

    Args:
        events: any events; only those of ``ledger.projections.models.PUBLISHED_EVENTS`` count (payload
            ``driver``, ``pool``, ``device``; ``occurred_at``).

    Returns:
        Cluster -> earliest start (aware); clusters with no row to fill are left out.
    """
    if not (params := _earliest_by_device(events, PUBLISHED_EVENTS)):
        return {}
    rows = conn.execute(text(
        _EARLIEST_OF_DEVICES + "AND a.awaiting_device_from >= k.t AND NOT isempty(a.valid) "
        "GROUP BY a.cluster"),
        params).all()
    return {str(cluster): start for cluster, start in rows if isinstance(start, datetime)}


def split_inputs_changed(conn: Connection, events: Iterable[RecordedEvent]) -> dict[str, datetime]:
    """Per cluster, the earliest instant from which inventory ``events`` (already applied) may change billed hours.

    The split of shared devices (:func:`ledger.projections.split.split_columns`) reads, for an allocation stating
    ``consumedCapacity``, the capacity of the device's latest inventory row that began at or before the
    allocation, else of the first row after it. A row that an event at ``t`` opens or closes can therefore change
    the split of the device's allocations that began at or after ``t``, and of those that began earlier with no
    row begun by then (a slice recorded after its shares began: it changes hours before its own time). Each
    such allocation changes hours from its own start; other allocations read no capacity, or one the event did
    not touch. A live event (``t`` now) on a device whose shares all began under a known row changes nothing
    rolled, so a driver restart on a year-old NIC does not send the rollups back a year.

    Args:
        events: any events; only those of :data:`INVENTORY_EVENTS` count (payload ``driver``, ``pool``, ``device``;
            ``occurred_at`` as ``t``).

    Returns:
        Cluster -> earliest start (aware) of an allocation whose split the events may change; clusters without one
        are left out.
    """
    if not (params := _earliest_by_device(events, INVENTORY_EVENTS)):
        return {}
    rows = conn.execute(text(
        _EARLIEST_OF_DEVICES + "AND a.consumed_capacity <> '{}'::jsonb AND NOT a.admin_access "
        " AND NOT isempty(a.valid) "
        "WHERE lower(a.valid) >= k.t OR NOT EXISTS (SELECT 1 FROM device_inventory i WHERE i.cluster = a.cluster "
        " AND i.driver = a.driver AND i.pool = a.pool AND i.device = a.device AND NOT isempty(i.valid) "
        " AND lower(i.valid) <= lower(a.valid)) "
        "GROUP BY a.cluster"),
        params).all()
    return {str(cluster): start for cluster, start in rows if isinstance(start, datetime)}


def forget_rolled_hours(conn: Connection, earliest: Mapping[str, datetime]) -> None:
    """Delete the rolled hours a batch of events may have changed: of every cluster, from the hour of the
    earliest ``occurred_at`` in ``earliest`` on (an event changes the read models only at or after its
    own time).

    Every cluster, not only those of the batch: an hour counts as rolled up when any cluster has rows for
    it (:func:`usage_from_rollups` over all clusters, :func:`last_rolled_hour` where the next run starts),
    so forgetting one cluster's hour alone would leave usage over all clusters without that cluster's
    seconds, and the next run would not roll it again. Both ``usage_rollups`` and
    ``usage_rollups_by_team`` lose those hours, in the caller's transaction. Live events land in the
    current hour, which is never rolled; a late or back-filled event forgets the hours it may change.

    With ``earliest`` not empty, holds the rolled-hours lock (:func:`ledger.store.locks.lock_rolled_hours`) to the
    end of the caller's transaction: a rollup chunk in flight, which may have summed the intervals before this
    batch changed them, commits first, and the DELETE (a statement started after it) removes its rows too.
    """
    if earliest:
        lock_rolled_hours(conn)
        _forget_hours(conn, "hour >= :h", {"h": floor_hour(min(earliest.values()))})


def forget_all_rolled_hours(conn: Connection) -> None:
    """Delete every rolled hour of every cluster from both rollup tables (a rebuild of
    ``device_allocations`` may change any of them; the hourly job rolls them up again).

    Holds the rolled-hours lock (:func:`ledger.store.locks.lock_rolled_hours`) to the end of the caller's
    transaction; a caller that also truncates ``device_allocations`` calls this first (the lock order)."""
    lock_rolled_hours(conn)
    _forget_hours(conn, "true", {})


def last_rolled_hour(conn: Connection, *, cluster: str | None = None) -> datetime | None:
    """The latest hour present in ``usage_rollups`` (``None`` when nothing was rolled up)."""
    value = conn.execute(text("SELECT max(hour) FROM usage_rollups WHERE true" + _cluster_filter(cluster)),
                         {"cluster": cluster}).scalar()
    return value if isinstance(value, datetime) else None


def first_allocation(conn: Connection, *, cluster: str | None = None) -> datetime | None:
    """Start of the earliest allocation interval (where a first rollup begins)."""
    value = conn.execute(text("SELECT min(lower(valid)) FROM device_allocations WHERE NOT isempty(valid)"
                              + _cluster_filter(cluster)), {"cluster": cluster}).scalar()
    return value if isinstance(value, datetime) else None


def usage_from_rollups(conn: Connection, *, start: datetime, end: datetime, group_by: str,
                       cluster: str | None = None, overrides: Mapping[str, str] = NO_OVERRIDES,
                       now: datetime | None = None) -> JSONObject:
    """Device-hours over ``[start, end)`` from the hourly rollups plus the live intervals at the edges.

    Whole hours inside the window come from ``usage_rollups_by_team`` (``usage_rollups`` for
    ``group_by="node"``); the partial hours at the edges, and whole hours with no rollup rows, come from
    ``device_allocations`` (:func:`live_seconds`). The body is the one of
    :func:`ledger.projections.queries.usage` (same grouping, rounding and order; device-hours agree to the
    6 decimals it rounds to). ``overrides`` (``[teams] overrides``, namespace -> team) rebill every hour of
    an overridden namespace, rolled or live, to the override's team: the rows keep the namespace, so the
    team grouping reads (team, namespace) and sums again after the remapping.
    ``now`` (aware; default the database's ``now()``) is the instant the answer is for: only
    ``[start, min(end, now))`` is summed, so hours rolled after a pinned ``now`` are not read.

    Raises:
        Invalid: ``group_by`` unknown, or ``start`` is not before ``end``.
    """
    if group_by not in GROUP_BY:
        raise Invalid(f"groupBy must be one of {', '.join(GROUP_BY)}, got {shorten_repr(group_by)}")
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    column = GROUP_BY[group_by]
    remap = column == "team" and bool(overrides)
    # With overrides the team grouping also reads the namespace, then folds (team, namespace) into the
    # billed team; without them the key stays (team, ...) and the database sums as before.
    key = (column, "namespace", "device_class", "driver") if remap else (column, "device_class", "driver")
    # Nothing counts after a pinned instant: the window is summed up to it (the body keeps ``to``).
    stop = end if now is None else max(start, min(end, now))
    h0, h1 = ceil_hour(start), floor_hour(stop)
    seconds: dict[Key, float] = defaultdict(float)

    def billed(k: Key) -> Key:
        return (overrides.get(k[1], k[0]), *k[2:]) if remap else k

    def add(lo: datetime, hi: datetime) -> None:
        for (_, _, k), s in live_seconds(conn, start=lo, end=hi, cluster=cluster, by_hour=False, columns=key,
                                         now=now).items():
            seconds[billed(k)] += s

    if stop == start:
        pass  # a window that starts at or after the pinned instant: nothing has happened in it yet
    elif h0 >= h1:
        add(start, stop)
    else:
        if start < h0:
            add(start, h0)
        if h1 < stop:
            add(h1, stop)
        # Every grouping but node reads the node-less rollup: on the 10 M-event ledger (5,000 nodes, 52 h)
        # usage_rollups holds 1.79 M rows for the window, summed and scanned for its hours on each request;
        # usage_rollups_by_team holds the same sums in 36 rows an hour whatever the fleet's size (measured
        # on 500 and 2,000 simulated nodes, where usage_rollups had 2,779 and 9,264 an hour). Both tables
        # are written and forgotten together, so either tells which hours are rolled.
        table = usage_rollups if column == "node" else usage_rollups_by_team
        params = {"h0": h0, "h1": h1, "cluster": cluster}
        # Summed in SQL: a month of a large fleet is hundreds of thousands of rolled rows, which cost seconds
        # to add up in Python.
        selected = ", ".join(f"coalesce({c}, '')" for c in key)
        for r in conn.execute(text(
                f"SELECT {selected}, sum(device_seconds) AS s FROM {table.name} WHERE hour >= :h0 AND hour < :h1"
                + _cluster_filter(cluster) + f" GROUP BY {selected}"), params):
            seconds[billed(tuple(str(v) for v in r[:-1]))] += float(r.s)
        rolled = {r[0] for r in conn.execute(text(
            f"SELECT DISTINCT hour FROM {table.name} WHERE hour >= :h0 AND hour < :h1" + _cluster_filter(cluster)),
            params)}
        # Whole hours with no rollup rows (not rolled yet, or forgotten after a late event) come from the
        # live intervals, one query per gap between rolled hours. Walking the gaps, not the hours, keeps a
        # window of centuries (from=0001-01-01) as cheap as its rolled hours.
        cursor = h0
        for hour in sorted(rolled):
            if hour > cursor:
                add(cursor, hour)
            cursor = hour + HOUR
        if cursor < h1:
            add(cursor, h1)
    out: list[JSONValue] = [
        {group_by: grp or None, "deviceClass": cls or None, "driver": drv, "deviceHours": round(s / 3600, 6)}
        for (grp, cls, drv), s in sorted(seconds.items()) if s > 0]
    if group_by == "deviceClass":
        for row in out:
            assert isinstance(row, dict)
            row["deviceClass"] = row[group_by]
    return {"from": rfc3339(start), "to": rfc3339(end), "groupBy": group_by, "step": None, "rows": out}

