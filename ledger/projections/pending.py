"""Pending demand: claims waiting for devices, per DeviceClass, against the devices free at T.

"requested 4, 2 free" (DESIGN §5) needs to know which devices a class can take: the DeviceClass CEL
selectors (and each request's own selectors) are evaluated on the devices published at T; an
evaluation error means "does not match" (DESIGN §11.10). A device is free at T when it is published,
no allocation other than ``adminAccess`` holds it (a device that ``allowMultipleAllocations`` stays
free while it is shared: it can take another share), the counters it consumes are not used up by
other partitions of its counter set, and it carries no ``NoSchedule`` / ``NoExecute`` taint
(DESIGN §11.9): neither one published in its ResourceSlice (``spec.devices[].taints``) nor one a
DeviceTaintRule in force at T adds to it (:func:`rule_tainted_devices`).

Tolerations: a request's ``tolerations`` are not consulted, for slice taints and rule taints alike. Free
devices are counted per class, not per request, and a tainted device is one the scheduler would not hand
to an ordinary request; a claim that tolerates the taint may still get it, which "requested 4, 2 free"
then understates, never overstates.

Sources: ``claim_states`` (pending intervals), ``claims.requests``, ``device_classes``,
``device_inventory``, ``device_allocations``, ``device_taint_rules``, ``namespace_teams``, ``pod_phases`` and the pools'
``sharedCounters``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Connection, text

from ledger.projections.base import cluster_filter as _cluster_filter
from ledger.projections.base import json_value as _json
from ledger.projections.base import request_count
from ledger.projections.counter_sets import CounterSetTotals, counter_amounts, counter_set_names, counters_fit
from ledger.projections.queries import NO_OVERRIDES, rfc3339, until_now
from ledger.projections.quotas import Catalog, Device, load_catalogs
from ledger.projections.selectors import expressions_of, selects
from ledger.types import JSONObject, JSONValue

BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
"""Taint effects that keep a device from new allocations."""


DeviceId = tuple[str, str, str]


def rule_selected_devices(selector: JSONObject, catalog: Catalog) -> list[Device]:
    """The devices of ``catalog`` a DeviceTaintRule's ``spec.deviceSelector`` selects (every field set must hold).

    Fields: ``driver``, ``pool`` and ``device`` compare with the device's (driver, pool name, device name);
    ``deviceClassName`` needs the class's CEL selectors to select the device (a class not defined at the
    catalog's instant selects nothing); ``selectors[].cel.expression`` must all select it. An empty selector
    selects every device. A CEL compile or evaluation error is "does not match" (DESIGN §11.10), never raised.

    Args:
        selector: ``device_taint_rules.device_selector`` (source ``DeviceTaintRule.spec.deviceSelector``).
        catalog: the DeviceClasses and devices (``device_inventory``) at T of the rule's cluster.

    Returns:
        The selected devices in the catalog's order (driver, pool, device), each once.
    """
    device_class = selector.get("deviceClassName")
    if device_class is not None and not isinstance(device_class, str):
        return []
    candidates = catalog.devices if device_class is None else catalog.devices_of(device_class)
    fixed = [(name, selector[name]) for name in ("driver", "pool", "device") if selector.get(name) is not None]
    expressions = expressions_of(selector["selectors"]) if "selectors" in selector else []
    return [d for d in candidates
            if all(getattr(d, name) == wanted for name, wanted in fixed) and selects(expressions, d.view)]


def rule_tainted_devices(conn: Connection, *, at: datetime, cluster: str, catalog: Catalog) -> set[DeviceId]:
    """``(driver, pool, device)`` of every device of ``catalog`` a blocking DeviceTaintRule taints at ``at``.

    A rule counts when its interval in ``device_taint_rules`` contains ``at``, its ``taint.effect`` is in
    :data:`BLOCKING_EFFECTS` and it has a selector (a rule without ``deviceSelector`` matches no device, as
    in Kubernetes); matching is :func:`rule_selected_devices`. The set is unordered, without duplicates.
    """
    rules = conn.execute(text(
        "SELECT device_selector FROM device_taint_rules WHERE cluster = :cluster AND valid @> :at "
        "AND effect = ANY(:effects) AND device_selector IS NOT NULL ORDER BY name"),
        {"cluster": cluster, "at": at, "effects": sorted(BLOCKING_EFFECTS)}).scalars().all()
    tainted: set[DeviceId] = set()
    for raw in rules:
        selector = _json(raw)
        if isinstance(selector, dict):
            tainted |= {(d.driver, d.pool, d.device) for d in rule_selected_devices(selector, catalog)}
    return tainted


def free_devices(conn: Connection, *, at: datetime, cluster: str, catalog: Catalog) -> set[DeviceId]:
    """``(driver, pool, device)`` of every device of ``cluster`` free at ``at`` (see the module docstring)."""
    params = {"at": at, "cluster": cluster}
    held = {(r.driver, r.pool, r.device) for r in conn.execute(text(
        "SELECT DISTINCT driver, pool, device FROM device_allocations WHERE cluster = :cluster AND valid @> :at "
        "AND NOT admin_access"), params)}
    tainted: set[DeviceId] = set()
    for r in conn.execute(text("SELECT driver, pool, device, taints FROM device_inventory WHERE cluster = :cluster "
                               "AND valid @> :at AND taints <> '[]'::jsonb"), params):
        taints = _json(r.taints)
        if isinstance(taints, list) and any(isinstance(t, dict) and t.get("effect") in BLOCKING_EFFECTS
                                            for t in taints):
            tainted.add((r.driver, r.pool, r.device))
    tainted |= rule_tainted_devices(conn, at=at, cluster=cluster, catalog=catalog)
    # Counters in use per (driver, pool, counterSet, counter), from the held devices.
    in_use: dict[tuple[str, str, str, str], Decimal] = defaultdict(Decimal)
    sets_of: dict[DeviceId, list[str]] = {}
    for d in catalog.devices:
        names = counter_set_names(list(d.consumes_counters))
        sets_of[(d.driver, d.pool, d.device)] = names
        if (d.driver, d.pool, d.device) in held:
            for name in names:
                for counter, amount in counter_amounts(d.consumes_counters, name).items():
                    in_use[(d.driver, d.pool, name, counter)] += amount
    totals = CounterSetTotals(conn, at, pools=[(cluster, d, p) for (d, p, _), names in sets_of.items() if names])

    def fits(d: Device) -> bool:
        for name in sets_of.get((d.driver, d.pool, d.device), []):
            amounts = counter_amounts(d.consumes_counters, name)
            used = {c: in_use.get((d.driver, d.pool, name, c), Decimal(0)) for c in amounts}
            if not counters_fit(totals.of(cluster, d.driver, d.pool, name), used, amounts):
                return False
        return True

    free: set[DeviceId] = set()
    for d in catalog.devices:
        key = (d.driver, d.pool, d.device)
        if key in tainted:
            continue
        if key in held and not d.view.allow_multiple_allocations:
            continue
        if key not in held and not fits(d):
            continue
        free.add(key)
    return free


def _request_specs(requests: list[JSONValue]) -> list[tuple[str, JSONObject]]:
    """(request name, the spec that decides it: ``exactly`` or the first ``firstAvailable`` entry)."""
    out: list[tuple[str, JSONObject]] = []
    for i, req in enumerate(requests):
        if not isinstance(req, dict):
            continue
        name = req.get("name") if isinstance(req.get("name"), str) else f"#{i}"
        spec = req.get("exactly")
        if not isinstance(spec, dict):
            subs = req.get("firstAvailable")
            spec = subs[0] if isinstance(subs, list) and subs and isinstance(subs[0], dict) else None
        if isinstance(spec, dict):
            out.append((str(name), spec))
    return out


def pending(conn: Connection, *, at: datetime, cluster: str | None = None,
            overrides: Mapping[str, str] = NO_OVERRIDES, now: datetime | None = None) -> JSONObject:
    """Claims pending at ``at`` and, per DeviceClass, devices requested versus devices free.

    A claim is pending at ``at`` when it holds no allocation then (table ``claim_states``), no deletion of it was
    requested by then (``claims.deletion_requested_at``, from ``metadata.deletionTimestamp``): the scheduler
    allocates no claim being deleted, so such a claim is no demand, whether it never held devices or released them;
    and, for a template or extended-resource claim (``claims.origin``), the pod it was made for
    (``claims.owner_pod_uid``, its owner reference), when that pod was recorded by then (``pod_phases``), is still
    there at ``at`` in a phase other than ``Succeeded`` or ``Failed``: a finished pod's claim is released and waits
    for nothing, however long the pod object is kept. A claim whose pod the ledger never recorded by then is counted
    as before, and so is a manual claim, whatever owns it: any pod may be waiting for it by name.

    Returns:
        ``{"at", "classes": [{"cluster", "deviceClass", "claims", "requested", "free"}], "claims": [{"cluster",
        "namespace", "name", "team", "origin", "pendingSince", "ageSeconds", "requests": [{"request", "deviceClass",
        "allocationMode", "count", "free"}]}]}``; classes sorted by cluster, then name (one entry per cluster and
        DeviceClass: a claim waits for the devices of its own cluster, so free devices never add up across
        clusters), claims by cluster, namespace, name.
        ``count`` is the devices a request asks for (``ExactCount``: ``count``, default 1; ``All``: every
        device the class and request select; ``adminAccess``: 0); a ``firstAvailable`` request is shown
        with its first alternative. ``free`` (class) counts free devices the class selects; ``free``
        (request) those the request's own selectors select too. ``claims`` counts claims with a request
        of that class; ``ageSeconds`` = at - pendingSince (float seconds), ``at`` no later than ``now`` (aware;
        default the database's ``now()``: an age never counts time that has not happened,
        ``queries.until_now``). ``team`` is the namespace's
        entry in ``overrides`` (``[teams] overrides``) when it has one.
    """
    until = until_now(conn, at, now)
    params = {"at": at, "cluster": cluster}
    rows = conn.execute(text(
        "SELECT c.cluster, c.uid, c.namespace, c.name, c.origin, c.requests, lower(s.valid) AS since, "
        " (SELECT t.team FROM namespace_teams t WHERE t.cluster = c.cluster AND t.namespace = c.namespace "
        "  AND t.valid @> :at LIMIT 1) AS team "
        "FROM claim_states s JOIN claims c ON c.cluster = s.cluster AND c.uid = s.claim_uid "
        "WHERE s.valid @> :at AND s.state = 'pending' "
        # A claim being deleted waits for nothing: the scheduler allocates no claim with a deletionTimestamp.
        " AND (c.deletion_requested_at IS NULL OR c.deletion_requested_at > :at)"
        # Nor does a claim made for a pod that has finished: recorded by then, and at T either Succeeded / Failed or
        # gone. Such a claim lingers unallocated as long as the pod object stays (a Job's pods, kept for their logs).
        " AND NOT (c.origin IN ('template', 'extended') AND c.owner_pod_uid IS NOT NULL"
        "  AND EXISTS (SELECT 1 FROM pod_phases p WHERE p.cluster = c.cluster AND p.pod_uid = c.owner_pod_uid"
        "   AND lower(p.valid) <= :at)"
        "  AND NOT EXISTS (SELECT 1 FROM pod_phases p WHERE p.cluster = c.cluster AND p.pod_uid = c.owner_pod_uid"
        "   AND p.valid @> :at AND p.phase NOT IN ('Succeeded', 'Failed')))" + _cluster_filter(cluster, "s") +
        " ORDER BY c.cluster, c.namespace, c.name, c.uid"), params).all()
    catalogs = load_catalogs(conn, at=at, cluster=cluster)
    free_by_cluster: dict[str, set[DeviceId]] = {}
    class_claims: dict[tuple[str, str], set[str]] = defaultdict(set)  # (cluster, class) -> claim uids
    class_requested: dict[tuple[str, str], int] = defaultdict(int)
    claims: list[JSONValue] = []
    # Per (cluster, class, request selectors): how many devices the class and the request select, and how many of
    # those are free; no request selectors (()) is the class's own count. Pending claims repeat a few requests;
    # building these sets for every claim made the answer O(claims x devices): 26 s for 1,486 pending claims over
    # 12,200 devices.
    request_sets: dict[tuple[str, str, tuple[str, ...]], tuple[int, int]] = {}

    def selected(*, cluster: str, cls: str, expressions: tuple[str, ...], catalog: Catalog,
                 free: set[DeviceId]) -> tuple[int, int]:
        if (cluster, cls, expressions) not in request_sets:
            chosen = {(d.driver, d.pool, d.device) for d in catalog.devices_of(cls, expressions)}
            request_sets[(cluster, cls, expressions)] = (len(chosen), len(chosen & free))
        return request_sets[(cluster, cls, expressions)]

    for r in rows:
        catalog = catalogs.get(r.cluster, Catalog())
        if r.cluster not in free_by_cluster:
            free_by_cluster[r.cluster] = free_devices(conn, at=at, cluster=r.cluster, catalog=catalog)
        free = free_by_cluster[r.cluster]
        requests = _json(r.requests)
        out_requests: list[JSONValue] = []
        for name, spec in _request_specs(requests if isinstance(requests, list) else []):
            cls = spec.get("deviceClassName")
            if not isinstance(cls, str) or not cls:
                continue
            selected(cluster=r.cluster, cls=cls, expressions=(), catalog=catalog, free=free)  # for its class entry
            selected_count, selected_free = selected(cluster=r.cluster, cls=cls, catalog=catalog, free=free,
                                                     expressions=tuple(expressions_of(spec.get("selectors"))))
            mode = spec.get("allocationMode") or "ExactCount"
            count = request_count(spec) if mode == "ExactCount" else selected_count
            if spec.get("adminAccess") is True:
                count = 0
            class_claims[(r.cluster, cls)].add(r.uid)
            class_requested[(r.cluster, cls)] += count
            out_requests.append({"request": name, "deviceClass": cls, "allocationMode": str(mode), "count": count,
                                 "free": selected_free})
        claims.append({"cluster": r.cluster, "namespace": r.namespace, "name": r.name,
                       "team": overrides.get(r.namespace) or r.team or r.namespace, "origin": r.origin,
                       "pendingSince": rfc3339(r.since), "ageSeconds": max((until - r.since).total_seconds(), 0.0),
                       "requests": out_requests})
    classes: list[JSONValue] = [
        {"cluster": key[0], "deviceClass": key[1], "claims": len(class_claims[key]), "requested": class_requested[key],
         "free": request_sets[(*key, ())][1]} for key in sorted(class_claims)]
    return {"at": rfc3339(at), "classes": classes, "claims": claims}
