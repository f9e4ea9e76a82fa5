"""Shared usage at an instant: shared devices, partitionable counter sets, multi-consumer claims.

DESIGN §5 "shared usage": a device is shared when more than one allocation holds it at T (shares of
an ``allowMultipleAllocations`` device, each with its ``shareID`` and ``consumedCapacity``, or a
double booking); a claim is shared when more than one live consumer reserves it. Chargeback split:

- a shared device's hour goes to its allocations by ``consumedCapacity`` / device capacity when every
  allocation states what it consumed of a capacity the device publishes (the bottleneck dimension,
  the largest fraction, counts); otherwise equally among its allocations (:mod:`ledger.projections.split`,
  the rule usage bills by);
- a claim's device-hours go equally to its consumers (their team is the claim namespace's team);
- devices that consume counters of one counter set (``consumesCounters`` -> the pool's
  ``sharedCounters``, e.g. a GPU and its MIG partitions) are partitions of one parent: the counter
  set is listed once with its counters in use, and each allocated partition is charged the share of
  the parent's counters it consumes. Totals count the parent once, never each partition.

Sources: ``device_allocations``, ``device_inventory``, ``claim_consumers`` and the latest
``PoolGenerationObserved`` event (``sharedCounters``) per pool at or before T.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Connection, text

from ledger.errors import Invalid
from ledger.projections.base import cluster_filter as _cluster_filter
from ledger.projections.base import json_value as _json
from ledger.projections.base import key_arrays
from ledger.projections.counter_sets import (
    CounterSetTotals,
    counter_amounts,
    counter_set_names,
    counters_fit,
    over_committed,
)
from ledger.projections.queries import NO_OVERRIDES, consumers_at, present, read_team_book, rfc3339
from ledger.projections.split import (
    Interval,
    allocation_fraction,
    capacity_fraction,
    shares,
    span_fractions,
    split_columns,
)
from ledger.quantities import as_number
from ledger.types import JSONObject, JSONValue


def _ratio(value: Decimal) -> float:
    return round(float(value), 9)


def shared(conn: Connection, *, at: datetime, cluster: str | None = None,
           overrides: Mapping[str, str] = NO_OVERRIDES) -> JSONObject:
    """Shared devices, partitionable counter sets and multi-consumer claims at ``at``.

    Every ``team`` is the namespace's entry in ``overrides`` (``[teams] overrides``) when it has one.

    Returns:
        ``{"at", "totals": {"sharedDevices", "counterSets", "sharedClaims"},
        "devices": [{"cluster", "driver", "pool", "device", "node", "allowMultipleAllocations", "conflict", "split",
        "allocations": [{"namespace", "claim", "team", "request", "shareID", "consumedCapacity",
        "fraction"}]}],
        "counterSets": [{"cluster", "driver", "pool", "counterSet", "counters": {name: {"total", "inUse", "free"}},
        "conflict",
        "partitions": [{"device", "consumes": {name: amount}, "allocatable", "allocations":
        [{"namespace", "claim", "team", "fraction"}]}]}],
        "claims": [{"cluster", "namespace", "name", "team", "devices": ["driver/pool/device"], "consumers":
        [{"resource", "name", "fraction"}]}]}``.
        ``fraction`` is the share of the device (devices), of the parent's counters (partitions: the
        largest consumed/total ratio) or of the claim (consumers: 1/n). Counter amounts are numbers in
        the counter's base unit (bytes for memory); ``total`` is ``null`` when the pool's
        ``sharedCounters`` were never seen. A partition is ``allocatable`` when it is unallocated and the
        free counters cover what it consumes (:func:`ledger.projections.counter_sets.counters_fit`: a counter of
        unknown total, the pool's ``sharedCounters`` unseen, blocks it once any of it is in use). A counter
        set's ``conflict`` is true when a counter's ``inUse`` exceeds its ``total`` (its devices allocated past
        the hardware: a GPU and its partitions at once).
        Lists are sorted by cluster, then driver, pool, device / namespace, name.
    """
    params = {"at": at, "cluster": cluster}
    allocations = conn.execute(text(
        "SELECT a.cluster, a.driver, a.pool, a.device, a.node, a.namespace, a.claim, a.claim_uid, a.team, a.request, "
        "a.share_id, a.consumed_capacity, a.conflict, " + split_columns("a") + " FROM device_allocations a "
        "WHERE a.valid @> :at AND NOT a.admin_access" + _cluster_filter(cluster, "a") +
        " ORDER BY a.cluster, a.driver, a.pool, a.device, a.namespace, a.claim, a.share_id NULLS FIRST"),
        params).all()
    inventory = conn.execute(text(
        "SELECT d.cluster, d.driver, d.pool, d.device, d.node, d.capacity, d.consumes_counters, "
        "d.allow_multiple_allocations FROM device_inventory d WHERE d.valid @> :at" + _cluster_filter(cluster, "d") +
        " ORDER BY d.cluster, d.driver, d.pool, d.device"), params).all()
    inv = {(r.cluster, r.driver, r.pool, r.device): r for r in inventory}
    by_device: dict[tuple[str, str, str, str], list[JSONObject]] = defaultdict(list)
    fractions_of: dict[tuple[str, str, str, str], list[Decimal | None]] = defaultdict(list)
    claims_of: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    by_claim_devices: dict[tuple[str, str], list[str]] = defaultdict(list)
    for a in allocations:
        key = (a.cluster, a.driver, a.pool, a.device)
        consumed = _json(a.consumed_capacity)
        by_device[key].append({"namespace": a.namespace, "claim": a.claim,
                               "team": overrides.get(a.namespace, a.team), "request": a.request,
                               "shareID": a.share_id, "consumedCapacity": consumed if isinstance(consumed, dict)
                               else {}, "conflict": bool(a.conflict)})
        fractions_of[key].append(capacity_fraction(_json(a.capacity), consumed, driver=a.driver))
        claims_of[key].append(a.claim_uid)
        by_claim_devices[(a.cluster, a.claim_uid)].append(f"{a.driver}/{a.pool}/{a.device}")

    devices: list[JSONValue] = []
    for key, allocs in sorted(by_device.items()):
        if len(allocs) < 2:
            continue
        row = inv.get(key)
        split, fractions = span_fractions(fractions_of[key], claims_of[key])
        out_allocs: list[JSONValue] = []
        for alloc, f in zip(allocs, fractions, strict=True):
            out_allocs.append({k: v for k, v in alloc.items() if k != "conflict"} | {"fraction": _ratio(f)})
        devices.append({"cluster": key[0], "driver": key[1], "pool": key[2], "device": key[3],
                        "node": row.node if row else None,
                        "allowMultipleAllocations": bool(row.allow_multiple_allocations) if row else False,
                        "conflict": any(bool(x["conflict"]) for x in allocs), "split": split,
                        "allocations": out_allocs})

    counter_sets = _counter_sets(conn, at=at, inventory=inventory, by_device=by_device)

    consumers = consumers_at(conn, at, cluster)
    # Only the claims with two live consumers or more are read (every claim ever created was, 81,000 of them after
    # a simulated 1,000-node day, to keep a few hundred), and their teams from one TeamBook.
    many = [tuple(key.split("\x00", 1)) for key, held in consumers.items() if sum(1 for x in held if x.live) > 1]
    claim_rows = conn.execute(text(
        "SELECT c.cluster, c.uid, c.namespace, c.name FROM unnest(CAST(:k0 AS text[]), CAST(:k1 AS text[])) "
        "AS k(cluster, uid) JOIN claims c ON c.cluster = k.cluster AND c.uid = k.uid WHERE c.created_at <= :at "
        "ORDER BY c.cluster, c.namespace, c.name, c.uid"),
        {"at": at, **key_arrays(many)}).all() if many else []
    teams = read_team_book(conn, cluster=cluster, overrides=overrides)
    claims: list[JSONValue] = []
    for c in claim_rows:
        live = [x for x in consumers.get(f"{c.cluster}\x00{c.uid}", []) if x.live]
        claims.append({"cluster": c.cluster, "namespace": c.namespace, "name": c.name,
                       "team": teams.team(c.cluster, c.namespace, at),
                       "devices": list(by_claim_devices.get((c.cluster, c.uid), [])),
                       "consumers": [{"resource": x.resource, "name": x.name,
                                      "fraction": _ratio(Decimal(1) / len(live))} for x in live]})
    return {"at": rfc3339(at),
            "totals": {"sharedDevices": len(devices), "counterSets": len(counter_sets), "sharedClaims": len(claims)},
            "devices": devices, "counterSets": counter_sets, "claims": claims}


def _counter_sets(conn: Connection, *, at: datetime, inventory: Sequence[object],
                  by_device: Mapping[tuple[str, str, str, str], Sequence[JSONObject]]) -> list[JSONValue]:
    """Counter sets with at least two consuming devices (a parent and its partitions)."""
    members: dict[tuple[str, str, str, str], list[tuple[str, dict[str, Decimal]]]] = defaultdict(list)
    for r in inventory:
        consumes = _json(r.consumes_counters)  # type: ignore[attr-defined]  # a device_inventory row
        if not isinstance(consumes, list):
            continue
        for name in counter_set_names(consumes):
            members[(r.cluster, r.driver, r.pool, name)].append(  # type: ignore[attr-defined]
                (r.device, counter_amounts(consumes, name)))  # type: ignore[attr-defined]
    out: list[JSONValue] = []
    held_totals = CounterSetTotals(conn, at, pools=[(c, d, p) for c, d, p, _ in members])
    for (cluster, driver, pool, set_name), parts in sorted(members.items()):
        if len(parts) < 2 and not any(by_device.get((cluster, driver, pool, d)) for d, _ in parts):
            continue
        totals = held_totals.of(cluster, driver, pool, set_name)
        in_use: dict[str, Decimal] = defaultdict(Decimal)
        for device, amounts in parts:
            if by_device.get((cluster, driver, pool, device)):
                for cname, amount in amounts.items():
                    in_use[cname] += amount
        names = sorted({*totals, *in_use, *(n for _, c in parts for n in c)})
        counters_out: JSONObject = {}
        for cname in names:
            total = totals.get(cname)
            used = in_use.get(cname, Decimal(0))
            counters_out[cname] = {"total": as_number(total) if total is not None else None,
                                   "inUse": as_number(used),
                                   "free": as_number(max(total - used, Decimal(0))) if total is not None else None}
        partitions: list[JSONValue] = []
        for device, amounts in sorted(parts, key=lambda p: p[0]):
            allocs = by_device.get((cluster, driver, pool, device), [])
            share = Decimal(0)
            for cname, amount in amounts.items():
                total = totals.get(cname)
                if total:
                    share = max(share, amount / total)
            fits = counters_fit(totals, in_use, amounts)
            partitions.append({"device": device, "consumes": {c: as_number(v) for c, v in sorted(amounts.items())},
                               "allocatable": not allocs and fits,
                               "allocations": [{"namespace": a["namespace"], "claim": a["claim"], "team": a["team"],
                                                "fraction": _ratio(share / len(allocs))} for a in allocs]})
        # More in use than the set holds: devices of one piece of hardware allocated past it (a GPU and its
        # partitions at once), a scheduler or driver bug, flagged as a double allocation is (DESIGN §11.5).
        conflict = over_committed(totals, in_use)
        out.append({"cluster": cluster, "driver": driver, "pool": pool, "counterSet": set_name,
                    "counters": counters_out, "conflict": conflict, "partitions": partitions})
    return out


def shared_usage(conn: Connection, *, start: datetime, end: datetime, cluster: str | None = None,
                 overrides: Mapping[str, str] = NO_OVERRIDES, now: datetime | None = None) -> JSONObject:
    """Chargeback of shared devices over ``[start, end)``: each shared device-hour split among its holders.

    While more than one allocation holds a device, each elementary span of time goes to the
    allocations by :mod:`ledger.projections.split` (their ``consumedCapacity`` fractions of the device's
    capacity when every one of them states one, the capacity nobody consumed staying unbilled; else
    equally), the split usage bills. Spans with a single holder are not shared and not listed. Source:
    ``device_allocations`` (not ``adminAccess``) clipped to the window and to ``now`` (default the database's
    ``now()``: hours that have not happened are not billed, as in usage), capacities from ``device_inventory``
    as :func:`ledger.projections.split.split_columns` reads them. Hours are billed to the namespace's team in
    ``overrides`` (``[teams] overrides``, applied to the whole window) when it has one, else to the recorded team.

    Returns:
        ``{"from", "to", "rows": [{"team", "deviceClass", "driver", "deviceHours"}], "devices":
        [{"cluster", "driver", "pool", "device", "sharedHours", "billedDeviceHours"}]}``; hours rounded to 6
        decimals, rows sorted by team, deviceClass, driver, devices by cluster, driver, pool, device; a team
        billed nothing (its shares consumed 0 beside others that consumed some) has no row, as in usage.

    Raises:
        Invalid: ``start`` is not before ``end``.
    """
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    params = {"start": start, "end": end, "cluster": cluster, "now": now}
    rows = conn.execute(text(
        "SELECT a.cluster, a.driver, a.pool, a.device, a.team, a.namespace, a.device_class, a.claim_uid, "
        " greatest(lower(a.valid), :start) AS s, " + present("a.valid") + " AS e, "
        + split_columns("a") + " FROM device_allocations a WHERE NOT a.admin_access AND NOT isempty(a.valid) "
        " AND a.valid && tstzrange(:start, :end, '[)')" + _cluster_filter(cluster, "a")), params).all()
    per_device: dict[tuple[str, str, str, str], list[Interval[tuple[str, str, str]]]] = defaultdict(list)
    for r in rows:
        if r.e > r.s:
            per_device[(r.cluster, r.driver, r.pool, r.device)].append(
                (r.s, r.e, (overrides.get(r.namespace, r.team), r.device_class or "", r.driver),
                 allocation_fraction(r.consumed, r.capacity, driver=r.driver), r.claim_uid))
    seconds: dict[tuple[str, str, str], float] = defaultdict(float)
    devices: list[JSONValue] = []
    for key, intervals in sorted(per_device.items()):
        spans: dict[tuple[datetime, datetime], int] = defaultdict(int)
        pieces = list(shares(intervals))
        for lo, hi, _, _ in pieces:
            spans[(lo, hi)] += 1
        shared_s = billed_s = 0.0
        for (lo, hi), holders in spans.items():
            if holders > 1:
                shared_s += (hi - lo).total_seconds()
        for lo, hi, group, weight in pieces:
            if spans[(lo, hi)] > 1:
                seconds[group] += (hi - lo).total_seconds() * weight
                billed_s += (hi - lo).total_seconds() * weight
        if shared_s:
            devices.append({"cluster": key[0], "driver": key[1], "pool": key[2], "device": key[3],
                            "sharedHours": round(shared_s / 3600, 6),
                            "billedDeviceHours": round(billed_s / 3600, 6)})
    out: list[JSONValue] = [{"team": team, "deviceClass": cls or None, "driver": drv,
                             "deviceHours": round(s / 3600, 6)}
                            for (team, cls, drv), s in sorted(seconds.items()) if s > 0]
    return {"from": rfc3339(start), "to": rfc3339(end), "rows": out, "devices": devices}
