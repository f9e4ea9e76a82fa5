"""Kueue-style counting: usage per (cluster, team, resource name) versus nominal quota, at any instant.

Kueue charges DRA devices from ResourceClaimTemplates at admission (KUEUE-COUNTING.md); the ledger
charges the claims that really held devices at T, with the same rules (DESIGN §5, §11.8):

- an ``ExactCount`` request counts ``count`` (default 1; sums saturate at MaxInt64); ``adminAccess``
  counts 0; an empty ``deviceClassName`` counts 0;
- classes pooled under one ``deviceClassMappings`` name add up; a claim shared by many pods counts
  once (one claim, one charge);
- an extended-resource claim (made by the scheduler) counts under its DeviceClass's mapping, else
  under the class's ``extendedResourceName`` (``deviceclass.resource.kubernetes.io/<class>`` for the
  implicit name) — Kueue's quota key for a DRA-backed extended resource;
- counter sources charge the largest ``consumesCounters`` value among the devices the class and
  request select x count; capacity sources charge ``capacity.requests`` x count (else the device's
  ``requestPolicy.default``, else its full capacity);
- where Kueue would refuse the workload (``allocationMode: All``, ``firstAvailable``, a request with
  neither, a claim referenced by name — every ``manual`` claim —, an unmapped class) the ledger still
  counts what was really allocated (the allocation results of that request) and gives Kueue's reason.
  An unmapped class is counted under the class name itself.

Charges come from ``claims.requests`` (``ResourceClaim.spec.devices.requests[]``) of the claims with
a ``device_allocations`` interval containing T; the team is the allocation's recorded team unless
the configuration overrides the namespace. Each cluster is counted apart: Kueue admits per cluster, against
that cluster's ClusterQueues, so one team's devices in two clusters never add up against one quota.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, getcontext
from heapq import heappop, heappush
from itertools import count, groupby

from sqlalchemy import Connection, RowMapping, text

from ledger.config import DeviceClassMapping, LedgerConfig, MappingSource
from ledger.errors import Invalid
from ledger.projections.base import cluster_filter as _cluster_filter
from ledger.projections.base import clusters, request_count
from ledger.projections.base import json_value as _json
from ledger.projections.queries import rfc3339
from ledger.projections.selectors import DeviceView, expressions_of, selects
from ledger.quantities import as_number, quantity_value
from ledger.types import JSONObject, JSONValue

MAX_INT64 = 2**63 - 1
"""Kueue saturates device counts here instead of wrapping around (kueue#12897)."""
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
"""Prefix of the implicit extended resource name every DeviceClass has (KEP-5004)."""

REASON_CLAIM_BY_NAME = "KueueDRAIntegration feature does not support use of resource claims"
REASON_ALL = "AllocationMode 'All' is not supported"
REASON_FIRST_AVAILABLE = "FirstAvailable device selection is not supported"
REASON_NO_EXACTLY = "Exactly must be set if FirstAvailable is nil"


def reason_unmapped(device_class: str) -> str:
    """Kueue's message for a class missing from ``deviceClassMappings``."""
    return f"DeviceClass {device_class} is not mapped in DRA configuration"


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """One allocation result of a claim at T (``status.allocation.devices.results[]``)."""

    request: str
    device_class: str | None
    driver: str
    pool: str
    device: str
    admin_access: bool
    consumed_capacity: Mapping[str, JSONValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """A device from ``device_inventory`` at T, as counter and capacity sources need it."""

    driver: str
    pool: str
    device: str
    view: DeviceView
    consumes_counters: Sequence[JSONValue] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimAtT:
    """A claim holding devices at T."""

    cluster: str
    uid: str
    namespace: str
    name: str
    team: str
    origin: str
    requests: Sequence[JSONValue]
    results: Sequence[Result]


@dataclass(frozen=True, slots=True, kw_only=True)
class Charge:
    """What one claim is charged under one resource name (count, or quantity in base units)."""

    resource_name: str
    amount: Decimal
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    """What counting needs to know about classes and devices at T."""

    classes: Mapping[str, JSONObject] = field(default_factory=dict)
    """DeviceClass name -> v1 spec (``selectors``, ``extendedResourceName``)."""
    devices: Sequence[Device] = ()
    _selected: dict[tuple[str, tuple[str, ...]], list[Device]] = field(default_factory=dict, compare=False,
                                                                      repr=False)
    _by_key: dict[tuple[str, str, str], Device] = field(default_factory=dict, compare=False, repr=False)
    _largest: dict[tuple[str, tuple[str, ...], str | None, str | None], Decimal | None] = field(
        default_factory=dict, compare=False, repr=False)
    selections: dict[tuple[int, tuple[str, ...]], bool] | None = field(default=None, compare=False, repr=False)
    """(``id`` of a device, CEL expressions) -> selected, shared by catalogs that hold the same
    :class:`Device` objects (the instants of one quota history); whoever passes it keeps those objects
    alive while it is used, so that an ``id`` names one device. ``None``: no memo."""

    def devices_of(self, device_class: str, request_selectors: Sequence[str] = ()) -> list[Device]:
        """Devices the class selectors and the request selectors both select (CEL, errors = no match).

        Answers are cached per (class, selectors) for the life of the catalog (one instant).
        """
        key = (device_class, tuple(request_selectors))
        if key not in self._selected:
            spec = self.classes.get(device_class)
            wanted = [*expressions_of(spec.get("selectors")), *request_selectors] if spec is not None else None
            if wanted is None:
                self._selected[key] = []
            elif self.selections is None:
                self._selected[key] = [d for d in self.devices if selects(wanted, d.view)]
            else:
                self._selected[key] = [d for d in self.devices if self._selects(wanted, tuple(wanted), d)]
        return self._selected[key]

    def _selects(self, wanted: list[str], wanted_key: tuple[str, ...], device: Device) -> bool:
        assert self.selections is not None
        key = (id(device), wanted_key)
        hit = self.selections.get(key)
        if hit is None:
            hit = self.selections[key] = selects(wanted, device.view)
        return hit

    def largest(self, device_class: str, request_selectors: Sequence[str], source: MappingSource) -> Decimal | None:
        """The largest value of ``source`` (a counter, or a capacity) among :meth:`devices_of`; ``None`` when
        none of them has it. Quantities in base units.

        Cached like :meth:`devices_of`: every claim of a class is charged from the same devices at one
        instant, and reading their counters again for each claim cost a quantity parse per device.
        """
        key = (device_class, tuple(request_selectors), source.counter, source.capacity)
        if key not in self._largest:
            self._largest[key] = _largest(self.devices_of(device_class, request_selectors), source)
        return self._largest[key]

    def device(self, driver: str, pool: str, name: str) -> Device | None:
        """The inventory entry of one device, or ``None`` (withdrawn: held off-slice).

        The first entry of ``devices`` with that key, looked up in an index built on the first call (a scan
        per allocation result cost counter and capacity sources one pass over the inventory each).
        """
        if not self._by_key and self.devices:
            for d in self.devices:
                self._by_key.setdefault((d.driver, d.pool, d.device), d)
        return self._by_key.get((driver, pool, name))


@dataclass(slots=True)
class _Unit:
    """Devices of one class charged by one request: from the spec, or the allocation as a fallback."""

    device_class: str
    count: int
    exactly: JSONObject | None
    allocated: list[Result] | None
    reasons: list[str]


def _saturating(a: int, b: int) -> int:
    return min(a + b, MAX_INT64)


def _allocated_units(claim: ClaimAtT, request: str, reason: str) -> list[_Unit]:
    """Refused request: count the results that really were allocated for it, per class."""
    by_class: dict[str, list[Result]] = defaultdict(list)
    for r in claim.results:
        if (r.request == request or r.request.startswith(request + "/")) and not r.admin_access \
                and r.device_class:
            by_class[r.device_class].append(r)
    return [_Unit(device_class=cls, count=len(rs), exactly=None, allocated=rs, reasons=[reason])
            for cls, rs in sorted(by_class.items())]


def _units(claim: ClaimAtT) -> list[_Unit]:
    units: list[_Unit] = []
    for i, raw in enumerate(claim.requests):
        req = raw if isinstance(raw, dict) else {}
        name = req.get("name") if isinstance(req.get("name"), str) else f"#{i}"
        assert isinstance(name, str)
        exactly = req.get("exactly")
        if req.get("firstAvailable"):
            units.extend(_allocated_units(claim, name, REASON_FIRST_AVAILABLE))
            continue
        if not isinstance(exactly, dict):
            units.extend(_allocated_units(claim, name, REASON_NO_EXACTLY))
            continue
        if exactly.get("adminAccess") is True:
            continue  # Kueue main: admin access is charged nothing, as kube-scheduler leaves it out
        mode = exactly.get("allocationMode") or "ExactCount"
        if mode == "All":
            units.extend(_allocated_units(claim, name, REASON_ALL))
            continue
        if mode != "ExactCount":
            units.extend(_allocated_units(claim, name, f"unsupported allocation mode: {mode}"))
            continue
        cls = exactly.get("deviceClassName")
        if not isinstance(cls, str) or not cls:
            continue
        n = request_count(exactly)
        mine = [r for r in claim.results if r.request == name and not r.admin_access]
        units.append(_Unit(device_class=cls, count=n, exactly=exactly, allocated=mine, reasons=[]))
    return units


def _counter_of(device: Device, counter: str) -> Decimal | None:
    best: Decimal | None = None
    for entry in device.consumes_counters:
        counters = entry.get("counters") if isinstance(entry, dict) else None
        value = quantity_value(counters.get(counter)) if isinstance(counters, dict) else None
        if value is not None:
            best = value if best is None else max(best, value)
    return best


def _capacity_of(device: Device, capacity: str) -> Decimal | None:
    entry = device.view.capacity.get(capacity)
    if entry is None and "/" in capacity:
        domain, _, short = capacity.rpartition("/")
        entry = device.view.capacity.get(short) if domain == device.driver else None
    if not isinstance(entry, dict):
        return None
    policy = entry.get("requestPolicy")
    default = quantity_value(policy.get("default")) if isinstance(policy, dict) else None
    return default if default is not None else quantity_value(entry.get("value"))


def _largest(devices: Sequence[Device], source: MappingSource) -> Decimal | None:
    """The largest counter (or capacity) of ``source`` among ``devices``, ``None`` if none has it."""
    if source.counter is not None:
        counter = source.counter
        values = [v for v in (_counter_of(d, counter) for d in devices) if v is not None]
    else:
        capacity = str(source.capacity)
        values = [v for v in (_capacity_of(d, capacity) for d in devices) if v is not None]
    return max(values) if values else None


def _source_charge(unit: _Unit, source: MappingSource, catalog: Catalog) -> tuple[Decimal, list[str]]:
    """Charge of one counter or capacity source for one unit (Kueue ``pkg/dra/{counters,capacity}.go``)."""
    reasons: list[str] = []
    allocated = [catalog.device(r.driver, r.pool, r.device) for r in unit.allocated or []]
    held = [d for d in allocated if d is not None]
    if unit.exactly is None:  # refused request: charge what each allocated device really consumes
        total = Decimal(0)
        for r in unit.allocated or []:
            dev = catalog.device(r.driver, r.pool, r.device)
            if source.counter is not None:
                total += (_counter_of(dev, source.counter) if dev else None) or Decimal(0)
            else:
                name = str(source.capacity)
                consumed = quantity_value(r.consumed_capacity.get(name))
                total += consumed if consumed is not None else ((_capacity_of(dev, name) if dev else None)
                                                                 or Decimal(0))
        return total, reasons
    selectors = expressions_of(unit.exactly.get("selectors"))

    def largest_matched() -> Decimal | None:  # among the selected devices, else among those held
        if catalog.devices_of(unit.device_class, selectors):
            return catalog.largest(unit.device_class, selectors, source)
        return _largest(held, source)

    if source.counter is not None:
        largest = largest_matched()
        if largest is None:
            reasons.append(f"matched devices have no consumesCounters entry for counter {source.counter}")
            return Decimal(0), reasons
        return max(largest, Decimal(0)) * unit.count, reasons
    name = str(source.capacity)
    requests = unit.exactly.get("capacity")
    wanted = requests.get("requests") if isinstance(requests, dict) else None
    base = quantity_value(wanted.get(name)) if isinstance(wanted, dict) else None
    if base is None:
        base = largest_matched()
        if base is None:
            reasons.append(f"matched devices have no capacity {name}")
            return Decimal(0), reasons
    return base * unit.count, reasons


def _names_for(claim: ClaimAtT, unit: _Unit, config: LedgerConfig,
               catalog: Catalog) -> tuple[list[DeviceClassMapping], str | None, list[str]]:
    """Mappings the unit is charged under, or a plain resource name, plus reasons."""
    mappings = config.mappings_of(unit.device_class)
    if mappings:
        return mappings, None, []
    if claim.origin == "extended":
        spec = catalog.classes.get(unit.device_class, {})
        name = spec.get("extendedResourceName")
        return [], name if isinstance(name, str) and name else IMPLICIT_EXTENDED_PREFIX + unit.device_class, []
    return [], unit.device_class, [reason_unmapped(unit.device_class)]


def count_claim(claim: ClaimAtT, *, config: LedgerConfig, catalog: Catalog) -> list[Charge]:
    """Charges of one claim, per resource name, following KUEUE-COUNTING.md (see the module docstring).

    Returns:
        One :class:`Charge` per resource name the claim is counted under, sorted by name; amounts are
        device counts (saturating at MaxInt64) or, for counter/capacity sources, quantities in base
        units. ``reasons`` are Kueue's refusal messages for what was counted anyway.
    """
    claim_reasons = [REASON_CLAIM_BY_NAME] if claim.origin == "manual" else []
    counts: dict[str, int] = defaultdict(int)
    amounts: dict[str, Decimal] = defaultdict(Decimal)
    reasons: dict[str, list[str]] = defaultdict(list)
    for unit in _units(claim):
        mappings, plain, extra = _names_for(claim, unit, config, catalog)
        why = [*claim_reasons, *unit.reasons, *extra]
        if plain is not None:
            counts[plain] = _saturating(counts[plain], unit.count)
            reasons[plain].extend(why)
            continue
        for mapping in mappings:
            if not mapping.sources:
                counts[mapping.name] = _saturating(counts[mapping.name], unit.count)
            for source in mapping.sources:
                amount, more = _source_charge(unit, source, catalog)
                amounts[mapping.name] += amount
                why = [*why, *more]
            reasons[mapping.name].extend(why)
    out: list[Charge] = []
    for name in sorted({*counts, *amounts}):
        total = Decimal(counts.get(name, 0)) + amounts.get(name, Decimal(0))
        out.append(Charge(resource_name=name, amount=total, reasons=tuple(dict.fromkeys(reasons[name]))))
    return out


# --- reading the read models --------------------------------------------------------------------


def load_catalogs(conn: Connection, *, at: datetime, cluster: str | None,
                  with_devices: bool = True) -> dict[str, Catalog]:
    """DeviceClasses (``device_classes``) and devices (``device_inventory``) at ``at``, per cluster.

    ``with_devices=False`` skips the inventory (counting by device count needs only the classes).
    """
    params = {"at": at, "cluster": cluster}
    classes: dict[str, dict[str, JSONObject]] = defaultdict(dict)
    for r in conn.execute(text("SELECT c.cluster, c.name, c.spec FROM device_classes c WHERE c.valid @> :at"
                               + _cluster_filter(cluster, "c")), params):
        spec = _json(r.spec)
        classes[r.cluster][r.name] = spec if isinstance(spec, dict) else {}
    devices: dict[str, list[Device]] = defaultdict(list)
    rows = [] if not with_devices else conn.execute(text(
            f"SELECT {_DEVICE_COLUMNS} FROM device_inventory d WHERE d.valid @> :at"
            + _cluster_filter(cluster, "d") + f" ORDER BY {_DEVICE_ORDER}"), params).mappings().all()
    for m in rows:
        devices[m["cluster"]].append(_device_of(m))
    return {c: Catalog(classes=classes.get(c, {}), devices=devices.get(c, []))
            for c in {*classes, *devices}}


_DEVICE_COLUMNS = ("d.cluster, d.driver, d.pool, d.device, d.attributes, d.capacity, d.consumes_counters, "
                   "d.allow_multiple_allocations")
"""What counting reads of a ``device_inventory`` row (alias ``d``)."""
_DEVICE_ORDER = "d.driver, d.pool, d.device"
"""The order of a catalog's devices (in the database's collation)."""


def _device_of(m: RowMapping) -> Device:
    attributes, capacity, counters = _json(m["attributes"]), _json(m["capacity"]), _json(m["consumes_counters"])
    return Device(driver=m["driver"], pool=m["pool"], device=m["device"],
                  consumes_counters=counters if isinstance(counters, list) else [],
                  view=DeviceView(driver=m["driver"], attributes=attributes if isinstance(attributes, dict) else {},
                                  capacity=capacity if isinstance(capacity, dict) else {},
                                  allow_multiple_allocations=bool(m["allow_multiple_allocations"])))


_HELD_COLUMNS = ("a.cluster, a.claim_uid, a.namespace, a.claim, a.team, a.request, a.device_class, a.driver, "
                 "a.pool, a.device, a.admin_access, a.consumed_capacity, c.origin, c.requests")
"""What counting reads of a ``device_allocations`` row (alias ``a``) joined to its ``claims`` row (``c``)."""
_RESULT_ORDER = "a.cluster, a.claim_uid, a.request, a.driver, a.pool, a.device"
"""The order of a claim's rows (and of claims) :func:`quotas` counts in, in the database's collation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _HeldRow:
    """One ``device_allocations`` row of a claim, with the ``claims`` fields counting needs."""

    cluster: str
    claim_uid: str
    namespace: str
    claim: str
    team: str
    origin: str
    requests: JSONValue
    """``claims.requests`` (``spec.devices.requests[]``) as stored."""
    result: Result


def _held_row(m: RowMapping) -> _HeldRow:
    consumed = _json(m["consumed_capacity"])
    return _HeldRow(cluster=m["cluster"], claim_uid=m["claim_uid"], namespace=m["namespace"], claim=m["claim"],
                    team=m["team"], origin=m["origin"], requests=_json(m["requests"]),
                    result=Result(request=m["request"], device_class=m["device_class"], driver=m["driver"],
                                  pool=m["pool"], device=m["device"], admin_access=bool(m["admin_access"]),
                                  consumed_capacity=consumed if isinstance(consumed, dict) else {}))


def _claim_of(rows: Sequence[_HeldRow]) -> ClaimAtT:
    """One claim from its rows held at T (at least one), in :data:`_RESULT_ORDER`: the namespace, name
    and team are the first row's, the results are in row order."""
    first = rows[0]
    return ClaimAtT(cluster=first.cluster, uid=first.claim_uid, namespace=first.namespace, name=first.claim,
                    team=first.team, origin=first.origin,
                    requests=first.requests if isinstance(first.requests, list) else [],
                    results=[r.result for r in rows])


def claims_at(conn: Connection, *, at: datetime, cluster: str | None) -> list[ClaimAtT]:
    """Claims with a ``device_allocations`` interval containing ``at``, with their results."""
    rows = conn.execute(text(
        f"SELECT {_HELD_COLUMNS} "
        "FROM device_allocations a JOIN claims c ON c.cluster = a.cluster AND c.uid = a.claim_uid "
        "WHERE a.valid @> :at" + _cluster_filter(cluster, "a") + f" ORDER BY {_RESULT_ORDER}"),
        {"at": at, "cluster": cluster}).mappings()
    held = (_held_row(m) for m in rows)
    return [_claim_of(list(members)) for _, members in groupby(held, key=lambda r: (r.cluster, r.claim_uid))]


_ClaimKey = tuple[str, str]
"""(cluster, claim uid)."""
_UsageKey = tuple[str, str, str]
"""(cluster, team, resource name): one row of :func:`quotas`."""


def quotas(conn: Connection, *, at: datetime, config: LedgerConfig, cluster: str | None = None) -> JSONObject:
    """Kueue-style counted usage per (cluster, team, resource name) versus nominal quota at ``at``.

    Sources: ``device_allocations`` (claims holding devices at ``at``), ``claims.requests``
    (``spec.devices.requests[]``), ``device_classes`` and ``device_inventory`` at ``at``; mappings and
    quotas from ``config``. Each cluster is counted apart, against its own nominal quota
    (:meth:`LedgerConfig.quota_of`), as each cluster's Kueue admits against its own ClusterQueues.

    Returns:
        ``{"at", "rows": [{"cluster", "team", "resourceName", "used", "nominalQuota", "overQuota", "reasons",
        "claims": [{"namespace", "name", "used", "reasons"}]}]}`` sorted by cluster, team, resourceName.
        ``used`` is a device count (an int) or, for counter/capacity sources, a quantity in base units
        (bytes for memory); ``nominalQuota`` is ``null`` without a configured quota (then ``overQuota``
        is false); ``overQuota`` = used > nominalQuota. ``reasons`` (``"<namespace>/<claim>: <Kueue
        message>"``) name the claims Kueue itself would refuse, counted anyway, in the order of ``claims``,
        each once. Every configured quota has a row in each cluster with events it applies in
        (:func:`ledger.projections.base.clusters`; ``cluster`` alone when given), ``used`` 0 when nothing is held.
    """
    # The inventory matters only for counter and capacity sources (CEL over the devices at T).
    catalogs = load_catalogs(conn, at=at, cluster=cluster,
                             with_devices=any(m.sources for m in config.device_class_mappings))
    used: dict[_UsageKey, Decimal] = defaultdict(Decimal)
    claims: dict[_UsageKey, list[tuple[str, str, Decimal, tuple[str, ...]]]] = defaultdict(list)
    for claim in claims_at(conn, at=at, cluster=cluster):
        team = config.team_of(claim.namespace, claim.team)
        for charge in count_claim(claim, config=config, catalog=catalogs.get(claim.cluster, Catalog())):
            key = (claim.cluster, team, charge.resource_name)
            used[key] += charge.amount
            claims[key].append((claim.namespace, claim.name, charge.amount, charge.reasons))
    for key in _quota_keys(conn, config=config, cluster=cluster):
        used.setdefault(key, Decimal(0))
    rows: list[JSONValue] = []
    for key in sorted(used):
        nominal = _nominal(config, key)
        amount = used[key]
        # By namespace and name (one cluster's claims: a namespace and name are unique there); the row's reasons
        # follow the same order, each once.
        held = sorted(claims[key], key=lambda c: (c[0], c[1]))
        reasons = dict.fromkeys(f"{ns}/{claim}: {r}" for ns, claim, _, why in held for r in why)
        rows.append({"cluster": key[0], "team": key[1], "resourceName": key[2], "used": as_number(amount),
                     "nominalQuota": nominal, "overQuota": nominal is not None and amount > Decimal(str(nominal)),
                     "reasons": list(reasons),
                     "claims": [{"namespace": ns, "name": claim, "used": as_number(charged), "reasons": list(why)}
                                for ns, claim, charged, why in held]})
    return {"at": rfc3339(at), "rows": rows}


def _quota_keys(conn: Connection, *, config: LedgerConfig, cluster: str | None) -> set[_UsageKey]:
    """(cluster, team, resource name) of every configured quota in each cluster with events (table ``events``),
    only ``cluster`` when given: the rows :func:`quotas` shows even with nothing held. A cluster the ledger holds
    no event of gets none (a misspelt ``cluster`` would otherwise be answered with every quota unused)."""
    if not config.quotas:
        return set()
    names = [name for name in clusters(conn) if cluster is None or name == cluster]
    return {(name, team, resource) for name in names for team, resource in config.quota_keys_of(name)}


def _nominal(config: LedgerConfig, key: _UsageKey) -> float | None:
    """The nominal quota of a (cluster, team, resource name) key (``None``: none configured)."""
    return config.quota_of(cluster=key[0], team=key[1], resource_name=key[2])


def quota_history_at_each_edge(conn: Connection, *, start: datetime, end: datetime, config: LedgerConfig,
                               cluster: str | None = None) -> JSONObject:
    """:func:`quota_history` the slow, plain way: :func:`quotas` at ``start`` and at every allocation edge.

    The definition :func:`quota_history` must match (the tests compare the two), kept as it was. It
    runs :func:`quotas`, several statements, at each edge: a day of a 1,000-node fleet, about 100,000 edges,
    takes hours.

    Returns:
        The body of :func:`quota_history`.

    Raises:
        Invalid: ``start`` is not before ``end``.
    """
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    edges = {start}
    for r in conn.execute(text(
            "SELECT lower(a.valid) AS lo, upper(a.valid) AS hi FROM device_allocations a "
            "WHERE a.valid && tstzrange(:s, :e, '[)') AND NOT isempty(a.valid)" + _cluster_filter(cluster, "a")),
            {"s": start, "e": end, "cluster": cluster}):
        edges.update(t for t in (r.lo, r.hi) if t is not None and start < t < end)
    points = sorted(edges)

    open_rows: dict[_UsageKey, JSONObject] = {}
    out: list[JSONObject] = []
    for t in points:
        body = quotas(conn, at=t, config=config, cluster=cluster)
        rows = body["rows"]
        assert isinstance(rows, list)
        seen: set[_UsageKey] = set()
        for row in rows:
            assert isinstance(row, dict)
            key = (str(row["cluster"]), str(row["team"]), str(row["resourceName"]))
            seen.add(key)
            current = open_rows.get(key)
            if current is not None and current["used"] == row["used"]:
                continue
            if current is not None:
                current["to"] = rfc3339(t)
            fresh: JSONObject = {"cluster": key[0], "team": key[1], "resourceName": key[2], "from": rfc3339(t),
                                 "to": rfc3339(end),
                                 "used": row["used"], "nominalQuota": row["nominalQuota"],
                                 "overQuota": row["overQuota"]}
            open_rows[key] = fresh
            out.append(fresh)
        for key in set(open_rows) - seen:
            open_rows.pop(key)["to"] = rfc3339(t)
    return _history_body(start, end, out)


def _history_body(start: datetime, end: datetime, intervals: Sequence[JSONObject]) -> JSONObject:
    """The body of :func:`quota_history`: ``intervals`` (of every (cluster, team, resourceName), each key's in edge
    order) sorted by cluster, team, resourceName and the instant of ``from``, without the rows of ``used`` 0 and no
    quota.

    Why the instant and not the text: :func:`rfc3339` writes microseconds only when they are not zero, so
    ``…:00.500000Z`` sorts before ``…:00Z`` as text."""
    kept: list[JSONValue] = [r for r in sorted(intervals, key=lambda r: (str(r["cluster"]), str(r["team"]),
                                                                        str(r["resourceName"]),
                                                                        datetime.fromisoformat(str(r["from"]))))
                             if r["used"] != 0 or r["nominalQuota"] is not None]
    return {"from": rfc3339(start), "to": rfc3339(end), "intervals": kept}


# --- quota history in one sweep over the window's allocation edges -------------------------------

HISTORY_ROWS = 5000
"""``device_allocations`` rows :func:`quota_history` fetches per round trip (a server-side cursor).

Why: a day of a 1,000-node fleet has about 100,000 rows in the window, but the sweep needs only those
of the claims held at the edge it is at (a few thousand); 5,000 rows (~3 MB) a fetch keep that day to
about 20 round trips."""

_NO_CATALOG = Catalog()
"""The catalog of a cluster with no DeviceClass and no device at T (what :func:`quotas` counts with)."""


def _in_window(alias: str, cluster: str | None) -> tuple[str, str]:
    """The bounds of ``alias.valid`` (as :func:`_valid_of` reads them), then the ``FROM``-less filter
    of the rows whose interval holds an instant of ``[:s, :e)``: ``(columns, where)``."""
    return (f"lower({alias}.valid) AS lo, lower_inc({alias}.valid) AS lo_inc, upper({alias}.valid) AS hi, "
            f"upper_inc({alias}.valid) AS hi_inc",
            f" WHERE {alias}.valid && tstzrange(:s, :e, '[)') AND NOT isempty({alias}.valid)"
            + _cluster_filter(cluster, alias))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Valid:
    """A ``valid`` interval's bounds (``None``: unbounded), to answer ``valid @> t`` in memory."""

    lo: datetime | None
    lo_inc: bool
    hi: datetime | None
    hi_inc: bool

    def holds(self, t: datetime) -> bool:
        """``valid @> t``."""
        return ((self.lo is None or self.lo < t or (self.lo == t and self.lo_inc))
                and (self.hi is None or t < self.hi or (t == self.hi and self.hi_inc)))

    def over(self, t: datetime) -> bool:
        """Whether ``valid`` holds no instant from ``t`` on."""
        return self.hi is not None and (self.hi < t or (self.hi == t and not self.hi_inc))

    def changes(self) -> list[tuple[datetime, bool]]:
        """The instants where ``holds`` changes, each with whether it changes only just after it (an
        exclusive lower or inclusive upper bound) rather than at it."""
        out = [] if self.lo is None else [(self.lo, not self.lo_inc)]
        return out if self.hi is None else [*out, (self.hi, self.hi_inc)]


def _valid_of(m: RowMapping) -> _Valid:
    return _Valid(lo=m["lo"], lo_inc=bool(m["lo_inc"]), hi=m["hi"], hi_inc=bool(m["hi_inc"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Span:
    """One ``device_allocations`` row of the window: what counting reads of it, its ``valid`` interval
    and its rank in :data:`_RESULT_ORDER` (unique within one sweep)."""

    held: _HeldRow
    valid: _Valid
    rank: int


class _CatalogHistory:
    """The DeviceClass and device intervals that hold some instant of a window, per cluster: the
    catalog at any edge of the window without asking the database again.

    :meth:`at` answers as :func:`load_catalogs` at that instant: the classes and devices whose interval
    holds it, the devices in :data:`_DEVICE_ORDER`. One :class:`Device` per ``device_inventory`` row
    serves every instant, so a CEL selection is evaluated once per device interval and selector
    (``Catalog.selections``) rather than at each catalog change.
    """

    def __init__(self, conn: Connection, *, start: datetime, end: datetime, cluster: str | None,
                 with_devices: bool) -> None:
        params = {"s": start, "e": end, "cluster": cluster}
        self._classes: dict[str, list[tuple[_Valid, str, JSONObject]]] = defaultdict(list)
        self._devices: dict[str, list[tuple[_Valid, Device]]] = defaultdict(list)
        self._selections: dict[tuple[int, tuple[str, ...]], bool] = {}
        bounds: list[tuple[_Valid, str]] = []
        bounds_of, window = _in_window("c", cluster)
        for m in conn.execute(text(f"SELECT c.cluster, c.name, c.spec, {bounds_of} FROM device_classes c"
                                   + window), params).mappings():
            spec = _json(m["spec"])
            self._classes[m["cluster"]].append((_valid_of(m), m["name"], spec if isinstance(spec, dict) else {}))
            bounds.append((_valid_of(m), m["cluster"]))
        if with_devices:
            bounds_of, window = _in_window("d", cluster)
            for m in conn.execute(text(f"SELECT {_DEVICE_COLUMNS}, {bounds_of} FROM device_inventory d" + window
                                       + f" ORDER BY {_DEVICE_ORDER}"), params).mappings():
                self._devices[m["cluster"]].append((_valid_of(m), _device_of(m)))
                bounds.append((_valid_of(m), m["cluster"]))
        at: list[tuple[datetime, str]] = []
        after: list[tuple[datetime, str]] = []
        for valid, name in bounds:
            for instant, later in valid.changes():
                if start <= instant < end:
                    (after if later else at).append((instant, name))
        self._at, self._after = deque(sorted(at)), deque(sorted(after))

    def changed(self, t: datetime) -> set[str]:
        """Clusters whose catalog may differ at ``t`` from the previous instant asked (the first call
        answers for everything up to ``t``); instants are asked in increasing order."""
        out: set[str] = set()
        while self._at and self._at[0][0] <= t:
            out.add(self._at.popleft()[1])
        while self._after and self._after[0][0] < t:
            out.add(self._after.popleft()[1])
        return out

    def clusters(self) -> set[str]:
        """Clusters with a DeviceClass or a device in the window."""
        return {*self._classes, *self._devices}

    def at(self, cluster: str, t: datetime) -> Catalog:
        """The catalog of ``cluster`` at ``t`` (an instant of the window)."""
        return Catalog(classes={name: spec for valid, name, spec in self._classes.get(cluster, ()) if valid.holds(t)},
                       devices=[d for valid, d in self._devices.get(cluster, ()) if valid.holds(t)],
                       selections=self._selections)


@dataclass(slots=True)
class _Claim:
    """A claim of the sweep: its rows not yet over, and its charges at the last edge it was counted at."""

    rank: int
    """Orders claims as :func:`quotas` visits them (any of the claim's ranks does)."""
    spans: list[_Span] = field(default_factory=list)
    charges: dict[_UsageKey, Decimal] = field(default_factory=dict)


@dataclass(slots=True)
class _Total:
    """The charges of the claims counted under one (cluster, team, resource name) at the current edge.

    :func:`quotas` adds them up as Decimals in claim order, in the current context (28 significant digits
    by default). While every charge is a whole number and their magnitudes add up to less than
    10^precision, every partial sum is exact, so that sum is ``whole`` in any order; otherwise
    :meth:`value` redoes it in claim order, which rounds where :func:`quotas` rounds.
    """

    charges: dict[_ClaimKey, tuple[int, Decimal]] = field(default_factory=dict)
    """claim -> (rank, charge)."""
    whole: int = 0
    magnitude: int = 0
    fractions: int = 0
    """Charges that are not whole numbers (or not finite)."""

    def put(self, claim: _ClaimKey, rank: int, amount: Decimal) -> None:
        self.drop(claim)
        self.charges[claim] = (rank, amount)
        self._tally(amount, 1)

    def drop(self, claim: _ClaimKey) -> None:
        old = self.charges.pop(claim, None)
        if old is not None:
            self._tally(old[1], -1)

    def _tally(self, amount: Decimal, sign: int) -> None:
        if amount.is_finite() and amount == amount.to_integral_value():
            self.whole += sign * int(amount)
            self.magnitude += sign * abs(int(amount))
        else:
            self.fractions += sign

    def value(self, limit: int) -> Decimal:
        """The sum :func:`quotas` forms; ``limit`` is 10^precision of the current context."""
        if not self.fractions and self.magnitude < limit:
            return Decimal(self.whole)
        total = Decimal()
        for _, amount in sorted(self.charges.values(), key=lambda c: c[0]):
            total += amount
        return total


class _Sweep:
    """The claims held at the current edge, their charges, and the totals per (cluster, team, resource name)."""

    def __init__(self, *, config: LedgerConfig, catalogs: dict[str, Catalog]) -> None:
        self.config = config
        self.catalogs = catalogs
        """Cluster -> the catalog at the current edge (reloaded where it changed)."""
        self.totals: dict[_UsageKey, _Total] = {}
        """Only keys some claim is charged under now (a :func:`quotas` row without a quota)."""
        self._claims: dict[str, dict[_ClaimKey, _Claim]] = defaultdict(dict)

    def hold(self, span: _Span) -> _ClaimKey:
        """Add a row (its claim is counted again by :meth:`recount`); return its claim."""
        key = (span.held.cluster, span.held.claim_uid)
        of_cluster = self._claims[key[0]]
        claim = of_cluster.get(key)
        if claim is None:
            claim = of_cluster[key] = _Claim(rank=span.rank)
        claim.spans.append(span)
        return key

    def claims_of(self, cluster: str) -> list[_ClaimKey]:
        """The claims of ``cluster`` with rows not yet over."""
        return list(self._claims.get(cluster, ()))

    def recount(self, key: _ClaimKey, t: datetime) -> set[_UsageKey]:
        """Count ``key`` at ``t`` as :func:`quotas` does (its rows holding ``t``, the current catalog);
        forget rows that are over. Returns the (cluster, team, resource name) keys whose charges changed."""
        claim = self._claims[key[0]].get(key)
        if claim is None:
            return set()
        live = sorted((s for s in claim.spans if s.valid.holds(t)), key=lambda s: s.rank)
        claim.spans = [s for s in claim.spans if not s.valid.over(t)]
        charges: dict[_UsageKey, Decimal] = {}
        if live:
            counted = _claim_of([s.held for s in live])
            team = self.config.team_of(counted.namespace, counted.team)
            catalog = self.catalogs.get(counted.cluster, _NO_CATALOG)
            charges = {(counted.cluster, team, c.resource_name): c.amount
                       for c in count_claim(counted, config=self.config, catalog=catalog)}
        changed: set[_UsageKey] = set()
        for usage in claim.charges.keys() - charges.keys():
            total = self.totals[usage]
            total.drop(key)
            if not total.charges:
                del self.totals[usage]
            changed.add(usage)
        for usage, amount in charges.items():
            if claim.charges.get(usage) != amount:
                self.totals.setdefault(usage, _Total()).put(key, claim.rank, amount)
                changed.add(usage)
        claim.charges = charges
        if not claim.spans:
            del self._claims[key[0]][key]
        return changed


def quota_history(conn: Connection, *, start: datetime, end: datetime, config: LedgerConfig,
                  cluster: str | None = None) -> JSONObject:
    """Counted usage over ``[start, end)`` as intervals of constant usage per (cluster, team, resource name).

    Usage only changes when an allocation starts or ends, so the answer is that of :func:`quotas` at
    ``start`` and at every allocation edge inside the window (exact, no sampling):
    :func:`quota_history_at_each_edge`. It is found in one sweep over the edges, in time order, that
    counts again only what can have changed (see the invariant in the body).

    Sources: ``device_allocations`` rows in the window with ``claims.requests``, ``device_classes``
    and ``device_inventory`` (read as :func:`quotas` reads them). Statements: two, three when a mapping
    has sources (the DeviceClass and device intervals of the window, then its allocation rows, streamed
    :data:`HISTORY_ROWS` a fetch), whatever the number of edges and catalog changes. Memory: the catalog
    intervals of the window, the rows of the claims held at the current edge, and the answer.

    Returns:
        ``{"from", "to", "intervals": [{"cluster", "team", "resourceName", "from", "to", "used", "nominalQuota",
        "overQuota"}]}`` sorted by cluster, team, resourceName, from; consecutive equal values are merged and
        rows with ``used`` 0 and no quota are left out.

    Raises:
        Invalid: ``start`` is not before ``end``.
    """
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    # Invariant that makes the sweep exact: what quotas() at an edge t charges a claim depends only on
    # (a) its device_allocations rows holding t (joined to its claims row, which has no interval: the same
    # at every t), (b) its cluster's catalog at t (what load_catalogs reads: device_classes, and
    # device_inventory when a mapping has sources) and (c) the configuration. Between two consecutive edges
    # p < t, (a) changes only for claims with a row bound at t (or an exclusive lower / inclusive upper bound
    # at p, which takes effect just after p): every bound of a row in the window is an edge, so none lies
    # strictly between p and t. (b) changes only if a catalog interval has a bound in (p, t] (or one taking
    # effect just after p). So at t it is enough to count again the claims with a row bound there, and every
    # claim of a cluster whose catalog changed since p; every other claim's charges are those it had at p.
    # The totals are then the sums quotas() forms (see _Total).
    catalogs = _CatalogHistory(conn, start=start, end=end, cluster=cluster,
                               with_devices=any(m.sources for m in config.device_class_mappings))
    catalogs.changed(start)  # the catalogs at start are those of catalogs.at(start)
    sweep = _Sweep(config=config, catalogs={name: catalogs.at(name, start) for name in catalogs.clusters()})
    bounds_of, window = _in_window("a", cluster)
    rows = iter(conn.execute(text(
        f"SELECT {_HELD_COLUMNS}, c.uid IS NOT NULL AS known, {bounds_of}, "
        f"row_number() OVER (ORDER BY {_RESULT_ORDER}) AS rank "
        # LEFT JOIN: a row whose claim is not (yet) in claims counts nothing but is an edge all the same.
        "FROM device_allocations a LEFT JOIN claims c ON c.cluster = a.cluster AND c.uid = a.claim_uid" + window
        + " ORDER BY lower(a.valid) NULLS FIRST"),
        {"s": start, "e": end, "cluster": cluster}, execution_options={"yield_per": HISTORY_ROWS}).mappings())
    upcoming = next(rows, None)
    ends: list[tuple[datetime, int, _ClaimKey | None, bool]] = []
    """Heap of (upper bound, tie-breaker, claim or None, inclusive) of rows ending inside the window."""
    tie = count()
    quota_keys = _quota_keys(conn, config=config, cluster=cluster)
    limit = 10 ** getcontext().prec
    open_rows: dict[_UsageKey, JSONObject] = {}
    out: list[JSONObject] = []
    carried: set[_ClaimKey] = set()  # claims whose rows change just after the previous edge
    t = start
    while True:
        due, carried = carried, set()
        # Rows starting at t; at start, also every row begun before the window.
        while upcoming is not None and (upcoming["lo"] is None or upcoming["lo"] <= t):
            valid, claim = _valid_of(upcoming), None
            if upcoming["known"]:
                claim = sweep.hold(_Span(held=_held_row(upcoming), valid=valid, rank=int(upcoming["rank"])))
                (due if valid.lo is None or valid.lo < t or valid.lo_inc else carried).add(claim)
            if valid.hi is not None and valid.hi < end:
                heappush(ends, (valid.hi, next(tie), claim, valid.hi_inc))
            upcoming = next(rows, None)
        # Rows ending at t.
        while ends and ends[0][0] <= t:
            hi, _, claim, hi_inc = heappop(ends)
            if claim is not None:
                (carried if hi_inc and hi == t else due).add(claim)
        # The catalogs that changed since the previous edge.
        for name in catalogs.changed(t):
            sweep.catalogs[name] = catalogs.at(name, t)
            due.update(sweep.claims_of(name))
        keys = set(quota_keys) if t == start else set()
        for claim in due:
            keys |= sweep.recount(claim, t)
        # The intervals, as quota_history_at_each_edge closes and opens them from the rows of quotas().
        when = rfc3339(t)
        for key in keys:
            total = sweep.totals.get(key)
            current = open_rows.get(key)
            if total is None and key not in quota_keys:  # no row at t
                if current is not None:
                    open_rows.pop(key)["to"] = when
                continue
            amount = total.value(limit) if total is not None else Decimal(0)
            used = as_number(amount)
            if current is not None and current["used"] == used:
                continue
            if current is not None:
                current["to"] = when
            nominal = _nominal(config, key)
            fresh: JSONObject = {"cluster": key[0], "team": key[1], "resourceName": key[2], "from": when,
                                 "to": rfc3339(end),
                                 "used": used, "nominalQuota": nominal,
                                 "overQuota": nominal is not None and amount > Decimal(str(nominal))}
            open_rows[key] = fresh
            out.append(fresh)
        following = [x for x in (upcoming["lo"] if upcoming is not None else None, ends[0][0] if ends else None)
                     if x is not None and x < end]
        if not following:
            break
        t = min(following)
    return _history_body(start, end, out)
