"""Hourly usage rollups: device-seconds per hour per (team, namespace, DeviceClass, model, node, driver).

The hourly job (``workers/jobs.py``) recomputes whole hours from the ``device_allocations``
intervals into table ``usage_rollups`` (delete + insert per hour, so a re-run replaces them and a
late event is absorbed by the next run over that hour). :func:`usage_from_rollups` answers a usage
question from the rolled hours inside the window plus the live intervals for the partial hours at its
edges (and for any whole hour not rolled up), so it is exact at the window edges and equal to
:func:`ledger.projections.queries.usage` on the same data.

Splitting rule (as ``queries.usage``): when several allocations hold one device at once, each
device-second is divided equally among them; ``adminAccess`` allocations are not billed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from sqlalchemy import Connection, text

from ledger.errors import Invalid
from ledger.projections.base import cluster_filter as _cluster_filter
from ledger.projections.queries import GROUP_BY, rfc3339
from ledger.types import JSONObject, JSONValue

HOUR = timedelta(hours=1)
Key = tuple[str, str, str, str, str, str]
"""(team, namespace, device_class, model, node, driver); '' stands for an unknown value."""
KEY_COLUMNS = ("team", "namespace", "device_class", "model", "node", "driver")


def floor_hour(t: datetime) -> datetime:
    """Start of the UTC hour containing ``t``."""
    return t.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def ceil_hour(t: datetime) -> datetime:
    """Smallest UTC hour boundary at or after ``t``."""
    floor = floor_hour(t)
    return floor if floor == t else floor + HOUR


def live_seconds(conn: Connection, *, start: datetime, end: datetime, cluster: str | None,
                 by_hour: bool) -> dict[tuple[str, datetime | None, Key], float]:
    """Device-seconds in ``[start, end)`` from the live intervals, per (cluster, hour or None, key).

    Source: ``device_allocations`` (not ``adminAccess``), clipped exactly to the window, an open one at
    ``now()`` as in :func:`ledger.projections.queries.usage`; concurrent allocations of one device share
    each second equally.
    """
    rows = conn.execute(text(
        "SELECT cluster, driver, pool, device, team, namespace, device_class, model, node, "
        " greatest(lower(valid), :start) AS s, least(coalesce(upper(valid), now()), :end) AS e "
        "FROM device_allocations WHERE NOT admin_access AND NOT isempty(valid) "
        " AND valid && tstzrange(:start, :end, '[)')" + _cluster_filter(cluster)),
        {"start": start, "end": end, "cluster": cluster}).all()
    per_device: dict[tuple[str, str, str, str], list[tuple[datetime, datetime, Key]]] = defaultdict(list)
    for r in rows:
        if r.e > r.s:
            key: Key = (r.team or "", r.namespace or "", r.device_class or "", r.model or "", r.node or "", r.driver)
            per_device[(r.cluster, r.driver, r.pool, r.device)].append((r.s, r.e, key))
    out: dict[tuple[str, datetime | None, Key], float] = defaultdict(float)
    for (cluster_name, *_), intervals in per_device.items():
        cuts = {t for s, e, _ in intervals for t in (s, e)}
        if by_hour:
            lo, hi = min(cuts), max(cuts)
            h = ceil_hour(lo)
            while h < hi:
                cuts.add(h)
                h += HOUR
        for lo, hi in pairwise(sorted(cuts)):
            covering = [k for s, e, k in intervals if s <= lo and e >= hi]
            if covering:
                share = (hi - lo).total_seconds() / len(covering)
                hour = floor_hour(lo) if by_hour else None
                for k in covering:
                    out[(cluster_name, hour, k)] += share
    return out


def rollup_usage(conn: Connection, *, start: datetime, end: datetime, cluster: str | None = None,
                 now: datetime | None = None) -> int:
    """Recompute the whole hours in ``[floor(start), floor(end))`` into ``usage_rollups``.

    Idempotent: the hours' rows are deleted and inserted again in the caller's transaction.

    Args:
        start: first instant to cover (rounded down to its hour).
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
    seconds = live_seconds(conn, start=h0, end=h1, cluster=cluster, by_hour=True)
    conn.execute(text("DELETE FROM usage_rollups WHERE hour >= :h0 AND hour < :h1" + _cluster_filter(cluster)),
                 {"h0": h0, "h1": h1, "cluster": cluster})
    stamp = now or datetime.now(UTC)
    rows = [{"cluster": c, "hour": hour, "team": k[0], "namespace": k[1], "device_class": k[2] or None,
             "model": k[3] or None, "node": k[4] or None, "driver": k[5], "device_seconds": s, "computed_at": stamp}
            for (c, hour, k), s in sorted(seconds.items(), key=lambda i: (i[0][0], str(i[0][1]), i[0][2]))]
    if rows:
        conn.execute(text(
            "INSERT INTO usage_rollups (cluster, hour, team, namespace, device_class, model, node, driver, "
            "device_seconds, computed_at) VALUES (:cluster, :hour, :team, :namespace, :device_class, :model, "
            ":node, :driver, :device_seconds, :computed_at)"), rows)
    return int((h1 - h0) / HOUR)


def forget_rolled_hours(conn: Connection, earliest: dict[str, datetime]) -> None:
    """Delete the rolled hours a batch of events may have changed: per cluster, from the hour of its
    earliest ``occurred_at`` on (an event changes the read models only at or after its own time).

    The usage queries then take those hours from the live intervals, and the next hourly run rolls them
    up again (it restarts from the last rolled hour left). Live events land in the current hour, which is
    never rolled; a late or back-filled event forgets exactly the hours it may have changed.
    """
    for cluster, at in earliest.items():
        conn.execute(text("DELETE FROM usage_rollups WHERE cluster = :c AND hour >= :h"),
                     {"c": cluster, "h": floor_hour(at)})


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
                       cluster: str | None = None) -> JSONObject:
    """Device-hours over ``[start, end)`` from the hourly rollups plus the live intervals at the edges.

    Whole hours inside the window come from ``usage_rollups``; the partial hours at the edges, and
    whole hours with no rollup rows, come from ``device_allocations``. The body is the one of
    :func:`ledger.projections.queries.usage` (same grouping, rounding and order).

    Raises:
        Invalid: ``group_by`` unknown, or ``start`` is not before ``end``.
    """
    if group_by not in GROUP_BY:
        raise Invalid(f"groupBy must be one of {', '.join(GROUP_BY)}, got {group_by!r}")
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    col = KEY_COLUMNS.index(GROUP_BY[group_by])
    h0, h1 = ceil_hour(start), floor_hour(end)
    seconds: dict[tuple[str, str, str], float] = defaultdict(float)

    def add(items: dict[tuple[str, datetime | None, Key], float]) -> None:
        for (_, _, k), s in items.items():
            seconds[(k[col], k[2], k[5])] += s

    if h0 >= h1:
        add(live_seconds(conn, start=start, end=end, cluster=cluster, by_hour=False))
    else:
        add(live_seconds(conn, start=start, end=h0, cluster=cluster, by_hour=False) if start < h0 else {})
        add(live_seconds(conn, start=h1, end=end, cluster=cluster, by_hour=False) if h1 < end else {})
        params = {"h0": h0, "h1": h1, "cluster": cluster}
        # Summed in SQL: a month of a large fleet is hundreds of thousands of rolled rows (one per hour,
        # team, namespace, class, model, node and driver), which cost seconds to add up in Python.
        column = KEY_COLUMNS[col]
        for r in conn.execute(text(
                f"SELECT coalesce({column}, '') AS grp, coalesce(device_class, '') AS cls, driver, "
                " sum(device_seconds) AS s FROM usage_rollups WHERE hour >= :h0 AND hour < :h1"
                + _cluster_filter(cluster) + f" GROUP BY coalesce({column}, ''), coalesce(device_class, ''), driver"),
                params):
            seconds[(str(r.grp), str(r.cls), str(r.driver))] += float(r.s)
        rolled = {r[0] for r in conn.execute(text(
            "SELECT DISTINCT hour FROM usage_rollups WHERE hour >= :h0 AND hour < :h1" + _cluster_filter(cluster)),
            params)}
        # Whole hours with no rollup rows (not rolled yet, or forgotten after a late event) come from the
        # live intervals, one query per gap between rolled hours. Walking the gaps, not the hours, keeps a
        # window of centuries (from=0001-01-01) as cheap as its rolled hours.
        cursor = h0
        for hour in sorted(rolled):
            if hour > cursor:
                add(live_seconds(conn, start=cursor, end=hour, cluster=cluster, by_hour=False))
            cursor = hour + HOUR
        if cursor < h1:
            add(live_seconds(conn, start=cursor, end=h1, cluster=cluster, by_hour=False))
    out: list[JSONValue] = [
        {group_by: grp or None, "deviceClass": cls or None, "driver": drv, "deviceHours": round(s / 3600, 6)}
        for (grp, cls, drv), s in sorted(seconds.items()) if s > 0]
    if group_by == "deviceClass":
        for row in out:
            assert isinstance(row, dict)
            row["deviceClass"] = row[group_by]
    return {"from": rfc3339(start), "to": rfc3339(end), "groupBy": group_by, "step": None, "rows": out}


def clusters(conn: Connection) -> Sequence[str]:
    """Every cluster the ledger holds events of, sorted."""
    return [str(c) for c in conn.execute(text("SELECT DISTINCT cluster FROM events ORDER BY cluster")).scalars()]
