"""The chargeback split of a device held by several allocations at once (DESIGN §5 "shared usage", §11.5).

One rule serves usage, the hourly rollups, the idle-claim report's wasted device-hours and the shared-usage
report, so that their device-hours agree:

- a span of time in which one allocation holds a device is billed to it whole; so is a span in which one claim
  holds it through several allocation results (two requests of the claim given shares of one device): the device's
  time is the claim's, as with one result, and is divided among its results by their fractions (else equally);
- a span in which several allocations hold a device that allows multiple allocations (consumable capacity) is
  billed by each allocation's ``consumedCapacity`` fraction of the device's ``capacity`` when every one of them
  states one (the capacity nobody consumed is nobody's, so the span is billed in part); when they state more
  than the device has (over-committed shares, bad data), the fractions are scaled down to add up to the span,
  so a device is never billed more than its own time;
- otherwise the span is divided equally among them (shares that state no capacity or all state none of it, a
  double booking of a device that allows one allocation, whatever its results state): rows then add up to the
  device's time.

An allocation's fraction is the largest ``consumedCapacity`` / ``capacity`` ratio over the capacities the
device publishes (the bottleneck dimension: a share of 40Gi of 80Gi memory and 10 of 100 compute holds half
the device). Sources: ``ResourceClaim.status.allocation.devices.results[].consumedCapacity`` (column
``device_allocations.consumed_capacity``) and ``ResourceSlice.spec.devices[].capacity`` (column
``device_inventory.capacity``) of the inventory interval in force when the allocation began.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from datetime import datetime
from decimal import Decimal
from itertools import pairwise
from typing import TypeVar

from ledger.projections.base import json_value
from ledger.quantities import quantity_value
from ledger.types import JSONValue

G = TypeVar("G", bound=Hashable)
"""A group the split bills device-seconds to (a usage row's key)."""

Interval = tuple[datetime, datetime, G, float | None, Hashable]
"""``(start, end, group, fraction, claim)`` of one allocation of a device: ``start < end`` (aware), ``fraction``
from :func:`capacity_fraction` (``None`` when the allocation states no usable ``consumedCapacity``), ``claim`` the
ResourceClaim holding it (any value equal for the results of one claim, such as ``(cluster, claim_uid)``)."""


def capacity_fraction(capacity: JSONValue, consumed: JSONValue, *, driver: str) -> Decimal | None:
    """How much of a device one allocation consumes.

    Args:
        capacity: the device's ``capacity`` (``{"memory": {"value": "80Gi"}, ...}``); anything else counts
            as no capacity.
        consumed: the allocation's ``consumedCapacity`` (``{"memory": "40Gi"}``); anything else counts as none.
        driver: the device's driver. A capacity name without a domain is in the driver's domain (as CEL reads
            ``device.capacity["<driver>"]``), so ``<driver>/memory`` and ``memory`` name the same capacity.

    Returns:
        The largest consumed / capacity ratio over the names the device publishes with a positive quantity,
        capped at 1 (an allocation that states more than the whole device, bad data, holds the whole device:
        no ratio is ever too large for a float); ``None`` when no name of ``consumed`` gives one (unparseable
        or negative amounts are skipped).
    """
    if not isinstance(capacity, dict) or not isinstance(consumed, dict):
        return None
    prefix = f"{driver}/"
    totals = {name.removeprefix(prefix): entry for name, entry in capacity.items()}
    best: Decimal | None = None
    for name, amount in consumed.items():
        total, used = quantity_value(totals.get(name.removeprefix(prefix))), quantity_value(amount)
        if total is not None and total > 0 and used is not None and used >= 0:
            # Compared before dividing: 1e400 of a 1n capacity is past a float, and past the Decimal context too.
            ratio = Decimal(1) if used >= total else used / total
            best = ratio if best is None else max(best, ratio)
    return best


def span_fractions(fractions: Sequence[Decimal | None],
                   claims: Sequence[Hashable] | None = None) -> tuple[str, list[Decimal]]:
    """Split of one span of a device among the ``n`` allocations covering it.

    Args:
        fractions: each allocation's :func:`capacity_fraction`, in allocation order.
        claims: each allocation's claim, in the same order (``None``: each a claim of its own).

    Returns:
        ``("whole", [1])`` for one allocation (``[]`` for none), and for allocations of one claim alone ``("whole",
        ...)`` with the span divided among them by their fractions when every one is known and they add up to more
        than 0, else equally (weights adding up to 1); ``("consumedCapacity", fractions)`` when ``n > 1``, every
        fraction is known and they add up to more than 0 (scaled down to add up to 1 when they add up to more);
        else ``("equal", [1/n] * n)``.
    """
    n = len(fractions)
    if n <= 1:
        return "whole", [Decimal(1)] * n
    known = [f for f in fractions if f is not None]
    total = sum(known, Decimal(0)) if len(known) == n else Decimal(0)  # 0: nothing to weigh the allocations by
    if claims is not None and len(set(claims)) == 1:
        return "whole", [f / total for f in known] if total > 0 else [Decimal(1) / n] * n
    if total == 0:
        return "equal", [Decimal(1) / n] * n
    return "consumedCapacity", [f / total for f in known] if total > 1 else known


def shares(intervals: Sequence[Interval[G]]) -> Iterator[tuple[datetime, datetime, G, float]]:
    """Sweep one device's allocation intervals into billed pieces.

    Args:
        intervals: the device's allocations, in any order; touching intervals (one ends where the next
            starts) do not share a second.

    Yields:
        ``(lo, hi, group, weight)`` in time order: each elementary span with each interval covering it and
        the part of the span billed to it (:func:`span_fractions`, 0..1). A device held once at a time
        yields its intervals whole, with weight 1.
    """
    order = sorted(range(len(intervals)), key=lambda i: intervals[i][0])
    latest_end: datetime | None = None
    for i in order:  # no two intervals overlap (the usual case): each is billed whole, as it is
        s, e, _, _, _ = intervals[i]
        if latest_end is not None and s < latest_end:
            break
        latest_end = e if latest_end is None else max(latest_end, e)
    else:
        for i in order:
            s, e, g, _, _ = intervals[i]
            yield s, e, g, 1.0
        return
    # A sweep over the cut points with the intervals covering the current span: an interval covers [lo, hi) when
    # it starts at or before lo and ends at or after hi (both are cut points), so the covering ones are those
    # started by lo that have not ended by it. Kept in input order, as the spans' shares are added up.
    cuts = sorted({t for s, e, _, _, _ in intervals for t in (s, e)})
    fractions = [None if f is None else Decimal(repr(f)) for _, _, _, f, _ in intervals]
    active: list[int] = []
    started = 0
    for lo, hi in pairwise(cuts):
        while started < len(order) and intervals[order[started]][0] <= lo:
            active.append(order[started])
            started += 1
        active = [i for i in active if intervals[i][1] >= hi]
        if not active:  # a gap between the device's allocations
            continue
        if len(active) == 1:
            yield lo, hi, intervals[active[0]][2], 1.0
            continue
        covering = sorted(active)
        _, weights = span_fractions([fractions[i] for i in covering], [intervals[i][4] for i in covering])
        for i, w in zip(covering, weights, strict=True):
            yield lo, hi, intervals[i][2], float(w)


def split(intervals: Sequence[Interval[G]], seconds: dict[G, float]) -> None:
    """Add each group's billed device-seconds of one device's intervals to ``seconds`` (float s).

    Args:
        intervals: as :func:`shares`.
        seconds: device-seconds added per group; a device held alone for an hour adds 3600.
    """
    for lo, hi, g, w in shares(intervals):
        seconds[g] += (hi - lo).total_seconds() * w


def allocation_fraction(consumed: object, capacity: object, *, driver: str) -> float | None:
    """:func:`capacity_fraction` of the ``consumed`` and ``capacity`` columns of :func:`split_columns`.

    Args:
        consumed, capacity: the row's values as the database driver returns them (decoded ``jsonb``, or ``NULL``).
        driver: the row's DRA driver (column ``driver``).

    Returns:
        The fraction as a float, ``None`` when the allocation states no usable consumed capacity.
    """
    fraction = capacity_fraction(json_value(capacity), json_value(consumed), driver=driver)
    return None if fraction is None else float(fraction)


def split_columns(alias: str) -> str:
    """SQL select-list items ``consumed, capacity`` for the allocation rows named ``alias``.

    Args:
        alias: the table or CTE name the rows come from (``device_allocations``, or a CTE with its ``cluster``,
            ``driver``, ``pool``, ``device``, ``consumed_capacity`` and ``valid`` columns). Required: unqualified,
            those names would resolve to the subquery's own ``device_inventory`` columns.

    ``consumed`` is the row's ``consumed_capacity`` and ``capacity`` the device's ``capacity`` from the
    ``device_inventory`` interval in force when the allocation began (else the first one after it); ``capacity`` is
    ``NULL`` when that interval does not allow multiple allocations (a double booking, which is split equally so
    that the teams' hours add up to the device's, DESIGN §11.5), and both are ``NULL`` when the allocation states
    no consumed capacity: most allocations hold whole devices, and they
    need no inventory lookup (PostgreSQL evaluates a CASE branch's subquery only when it is taken). The
    capacity does not depend on the question's window, so usage, the rollups and the reports agree.
    """
    a = f"{alias}."
    return (f"CASE WHEN {a}consumed_capacity <> '{{}}'::jsonb THEN {a}consumed_capacity END AS consumed, "
            f"CASE WHEN {a}consumed_capacity <> '{{}}'::jsonb THEN (SELECT CASE WHEN i.allow_multiple_allocations "
            f" THEN i.capacity END FROM device_inventory i "
            f" WHERE i.cluster = {a}cluster AND i.driver = {a}driver AND i.pool = {a}pool AND i.device = {a}device "
            f" AND NOT isempty(i.valid) ORDER BY lower(i.valid) <= lower({a}valid) DESC, "
            f" abs(extract(epoch FROM lower(i.valid) - lower({a}valid))) LIMIT 1) END AS capacity")
