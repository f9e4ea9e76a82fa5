"""Counter sets of partitionable devices (KEP-4815): what a pool's hardware holds, what its devices take of it, and
whether the devices allocated at an instant take more than it holds.

A pool publishes ``sharedCounters`` (counter sets, e.g. one per GPU: ``memory: 40Gi``), and each device that is a
view of that hardware (the GPU whole, each MIG partition) states in ``consumesCounters`` how much of which set it
takes. The scheduler allocates a device only while the counters it consumes are free, so allocated devices taking
more than a set holds is a scheduler or driver bug: the same hardware handed out twice, flagged as DESIGN §11.5
flags two allocations of one device. ``/v1/shared`` lists every counter set with its counters in use
(:mod:`ledger.projections.shared`); occupancy flags the allocated devices of an over-committed set
(:func:`counter_set_state`) and names what holds the counters of a partition that no longer fits; pending demand
counts the partitions that still fit (:mod:`ledger.projections.pending`).

Sources: ``device_inventory.consumes_counters`` (``ResourceSlice.spec.devices[].consumesCounters``),
``device_allocations`` and the latest ``PoolGenerationObserved`` event of a pool (its ``sharedCounters``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Connection, text

from ledger.projections.base import json_value as _json
from ledger.projections.base import key_arrays
from ledger.quantities import quantity_value
from ledger.types import JSONValue

DeviceKey = tuple[str, str, str, str]
"""``(cluster, driver, pool, device)``."""


def shared_counters_of(conn: Connection, pools: Iterable[tuple[str, str, str]], at: datetime
                       ) -> dict[tuple[str, str, str], list[JSONValue]]:
    """``sharedCounters`` at ``at`` of each of ``pools`` ((cluster, driver, pool); repeats are read once):
    ``[{"name", "counters": {name: {"value"}}}]``, an empty list for a pool whose ``sharedCounters`` are unknown.
    One statement for all of them, each pool still found through its own index range.

    Source: the latest ``PoolGenerationObserved`` event of each stream ``pool:<driver>/<pool>`` at or before ``at``
    (table ``events``, index ``events_stream_position_key``).
    """
    keys = sorted(set(pools))
    found: dict[tuple[str, str, str], list[JSONValue]] = {key: [] for key in keys}
    if not keys:
        return found
    rows = conn.execute(text(
        "SELECT k.i, e.payload FROM unnest(CAST(:k0 AS text[]), CAST(:k1 AS text[])) "
        "WITH ORDINALITY AS k(cluster, stream, i) "
        "CROSS JOIN LATERAL (SELECT payload FROM events WHERE cluster = k.cluster AND stream = k.stream "
        "AND type = 'PoolGenerationObserved' AND occurred_at <= :at ORDER BY global_position DESC LIMIT 1) AS e"),
        {"at": at, **key_arrays([(c, f"pool:{d}/{p}") for c, d, p in keys])})
    for i, payload in rows:
        body = _json(payload)
        counters = body.get("sharedCounters") if isinstance(body, dict) else None
        found[keys[i - 1]] = counters if isinstance(counters, list) else []
    return found


def counter_set_totals(shared: Sequence[JSONValue], counter_set: str) -> dict[str, Decimal]:
    """Counter name -> amount (base units: bytes for memory) that ``counter_set`` holds, from a pool's
    ``sharedCounters`` (:func:`shared_counters_of`); empty when the pool does not define the set. A counter whose
    value is no Quantity is left out."""
    totals: dict[str, Decimal] = {}
    for entry in shared:
        counters = entry.get("counters") if isinstance(entry, dict) and entry.get("name") == counter_set else None
        if isinstance(counters, dict):
            for name, value in counters.items():
                amount = quantity_value(value)
                if amount is not None:
                    totals[name] = amount
    return totals


class CounterSetTotals:
    """What each counter set of the ledger holds at one instant: counter name -> amount (base units), as
    :func:`counter_set_totals` reads it from its pool's ``sharedCounters`` (:func:`shared_counters_of`).

    A pool's ``sharedCounters`` hold all its counter sets (a MIG node's: one a GPU), so each pool is read once
    however many of its sets are asked about, and each set worked out once: read set by set, the look-ups were
    0.75 s of a 1.07 s ``/v1/shared`` at 1,000 simulated nodes. Shared usage, occupancy's conflict flag and pending
    demand's free partitions all read totals through this.
    """

    def __init__(self, conn: Connection, at: datetime, *, pools: Iterable[tuple[str, str, str]] = ()) -> None:
        """``pools``: (cluster, driver, pool) of the sets to be asked about, read in one statement now
        (:func:`shared_counters_of`; one a pool was 55 ms of a 480 ms ``/v1/shared`` at 1,000 simulated nodes);
        a pool not given is read on its first use."""
        self._conn, self._at = conn, at
        self._pools: dict[tuple[str, str, str], list[JSONValue]] = shared_counters_of(conn, pools, at)
        self._sets: dict[tuple[str, str, str, str], dict[str, Decimal]] = {}

    def of(self, cluster: str, driver: str, pool: str, counter_set: str) -> dict[str, Decimal]:
        """The counters ``counter_set`` of pool ``driver``/``pool`` in ``cluster`` holds; empty when the pool's
        ``sharedCounters`` were never seen or do not define it."""
        key = (cluster, driver, pool, counter_set)
        if key not in self._sets:
            if (pool_key := (cluster, driver, pool)) not in self._pools:
                self._pools.update(shared_counters_of(self._conn, [pool_key], self._at))
            self._sets[key] = counter_set_totals(self._pools[pool_key], counter_set)
        return self._sets[key]


def counter_amounts(consumes: Sequence[JSONValue], counter_set: str) -> dict[str, Decimal]:
    """Counter name -> amount (base units) a device's ``consumesCounters`` takes from ``counter_set``."""
    out: dict[str, Decimal] = {}
    for entry in consumes:
        if isinstance(entry, dict) and entry.get("counterSet") == counter_set:
            counters = entry.get("counters")
            if isinstance(counters, dict):
                for name, value in counters.items():
                    amount = quantity_value(value)
                    if amount is not None:
                        out[name] = out.get(name, Decimal(0)) + amount
    return out


def counter_set_names(consumes: JSONValue) -> list[str]:
    """Names of the counter sets a device's ``consumesCounters`` takes from, in order, each once."""
    names: list[str] = []
    for entry in consumes if isinstance(consumes, list) else []:
        name = entry.get("counterSet") if isinstance(entry, dict) else None
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


def over_committed(totals: Mapping[str, Decimal], in_use: Mapping[str, Decimal]) -> bool:
    """Whether the counters ``in_use`` exceed what the set holds (``totals``) for any counter the set defines.

    A counter the pool never defined (its ``sharedCounters`` unseen, or naming other counters) cannot be
    exceeded: nothing says how much there is.
    """
    return any(name in totals and used > totals[name] for name, used in in_use.items())


def counters_fit(totals: Mapping[str, Decimal], in_use: Mapping[str, Decimal], amounts: Mapping[str, Decimal]) -> bool:
    """Whether a device could still take what it consumes of one counter set: the one rule occupancy
    (:func:`counter_set_state`), pending demand and ``/v1/shared`` (``allocatable``) share.

    Args:
        totals: counter name -> amount the set holds (base units: bytes for memory), as
            :func:`counter_set_totals` reads it; a counter missing here is one the pool's ``sharedCounters``
            never defined (or were never seen).
        in_use: counter name -> amount the set's allocated devices take (each device once).
        amounts: counter name -> amount the device consumes of the set (:func:`counter_amounts`).

    Returns:
        ``True`` when every amount fits in what is left of its counter; a counter the set does not define fits
        only while none of it is in use: nothing says how much is left.
    """
    for counter, amount in amounts.items():
        used = in_use.get(counter, Decimal(0))
        total = totals.get(counter)
        if (total is None and used > 0) or (total is not None and amount > total - used):
            return False
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterSetState:
    """What the counter sets of a page of devices say about them at one instant (:func:`counter_set_state`)."""

    conflicts: frozenset[DeviceKey]
    """Allocated devices of a counter set whose allocated devices take more than it holds."""
    held_by: Mapping[DeviceKey, tuple[str, ...]]
    """Each device with no allocation but ``adminAccess`` ones whose ``consumesCounters`` no longer fit in what its
    counter sets have left, with the allocated devices (names, same pool, sorted) that take those sets' counters;
    devices that fit are absent."""


def counter_set_state(conn: Connection, *, at: datetime, keys: Sequence[DeviceKey]) -> CounterSetState:
    """The counter-set flags of ``keys`` at ``at``: conflicts and devices whose counters others hold.

    ``conflicts``: the devices among ``keys`` that hold an allocation in a counter set whose allocated devices take
    more than it holds (the same hardware handed out twice). ``held_by``: the devices among ``keys`` with no
    allocation but ``adminAccess`` ones (which occupy nothing) that could not be allocated now because what they
    consume no longer fits (a MIG partition of a
    GPU allocated whole), each with the allocated devices taking its sets' counters; a counter set whose pool's
    ``sharedCounters`` were never seen blocks a device once any of its counters is in use (nothing says how much
    is left).

    A device is counted in its set's use once, however many allocations hold it (shares of one device take its
    counters once); ``adminAccess`` allocations take nothing (they never occupy a device, DESIGN §5). A device
    held after leaving its ResourceSlice has no inventory row at ``at``, so nothing says what it consumes and
    it is left out. The state of the hardware is read over every allocation, whoever holds it.

    Sources: ``device_inventory.consumes_counters`` (``ResourceSlice.spec.devices[].consumesCounters``),
    ``device_allocations`` at ``at``, the pools' ``sharedCounters`` (:class:`CounterSetTotals`).

    Queries: one for the pools of ``keys`` whose devices consume a counter set, then, only when some do, one for
    the devices of those pools and one ``sharedCounters`` look-up per pool (a page of MIG GPUs spans a few pools).

    Args:
        keys: ``(cluster, driver, pool, device)`` of one occupancy page (at most a page's worth).

    Returns:
        A :class:`CounterSetState`; both of its collections are empty when no key consumes a counter set.
    """
    if not keys:
        return CounterSetState(conflicts=frozenset(), held_by={})
    unzipped = {"k_cluster": [k[0] for k in keys], "k_driver": [k[1] for k in keys],
                "k_pool": [k[2] for k in keys], "k_device": [k[3] for k in keys]}
    page = conn.execute(text(
        "SELECT DISTINCT i.cluster, i.driver, i.pool FROM device_inventory i "
        "JOIN unnest(CAST(:k_cluster AS text[]), CAST(:k_driver AS text[]), CAST(:k_pool AS text[]), "
        "CAST(:k_device AS text[])) AS k(cluster, driver, pool, device) "
        "ON k.cluster = i.cluster AND k.driver = i.driver AND k.pool = i.pool AND k.device = i.device "
        "WHERE i.valid @> :at AND i.counter_set IS NOT NULL"),
        {"at": at, **unzipped}).all()
    if not page:
        return CounterSetState(conflicts=frozenset(), held_by={})
    pools = sorted((r.cluster, r.driver, r.pool) for r in page)
    # Every device of those pools in the inventory at T, with whether a non-adminAccess allocation holds it then.
    members = conn.execute(text(
        "SELECT i.cluster, i.driver, i.pool, i.device, i.consumes_counters, EXISTS (SELECT 1 FROM device_allocations a "
        " WHERE a.cluster = i.cluster AND a.driver = i.driver AND a.pool = i.pool AND a.device = i.device "
        " AND a.valid @> :at AND NOT a.admin_access) AS held "
        "FROM device_inventory i JOIN unnest(CAST(:p_cluster AS text[]), CAST(:p_driver AS text[]), "
        "CAST(:p_pool AS text[])) AS p(cluster, driver, pool) "
        "ON p.cluster = i.cluster AND p.driver = i.driver AND p.pool = i.pool "
        "WHERE i.valid @> :at AND i.counter_set IS NOT NULL"),
        {"at": at, "p_cluster": [p[0] for p in pools], "p_driver": [p[1] for p in pools],
         "p_pool": [p[2] for p in pools]}).all()
    in_use: dict[tuple[str, str, str, str], dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    held_in: dict[tuple[str, str, str, str], list[DeviceKey]] = defaultdict(list)
    free: list[tuple[DeviceKey, list[JSONValue]]] = []
    wanted = set(keys)
    for m in members:
        consumes = _json(m.consumes_counters)
        consumes_list = consumes if isinstance(consumes, list) else []
        key: DeviceKey = (m.cluster, m.driver, m.pool, m.device)
        if not m.held:
            if key in wanted:
                free.append((key, consumes_list))
            continue
        for name in counter_set_names(consumes_list):
            counter_set = (m.cluster, m.driver, m.pool, name)
            held_in[counter_set].append(key)
            for counter, amount in counter_amounts(consumes_list, name).items():
                in_use[counter_set][counter] += amount
    totals = CounterSetTotals(conn, at, pools=[(c, d, p) for c, d, p, _ in held_in])
    flagged: set[DeviceKey] = set()
    for counter_set, devices in held_in.items():
        if over_committed(totals.of(*counter_set), in_use[counter_set]):
            flagged.update(devices)
    held_by: dict[DeviceKey, tuple[str, ...]] = {}
    for key, consumes_list in free:
        holders: set[str] = set()
        for name in counter_set_names(consumes_list):
            counter_set = (*key[:3], name)
            if counter_set in held_in and not counters_fit(totals.of(*counter_set), in_use[counter_set],
                                                    counter_amounts(consumes_list, name)):
                holders.update(d[3] for d in held_in[counter_set])
        if holders:
            held_by[key] = tuple(sorted(holders))
    return CounterSetState(conflicts=frozenset(flagged & wanted), held_by=held_by)
