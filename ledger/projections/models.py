"""The core read models: inventory, allocations, consumers, claims, pod phases, teams, classes.

Each class is one projection (one checkpoint). They run in the order of :data:`ALL` inside one
transaction per batch, so a projection may read the tables of one listed before it as of the same
global position (``device_allocations`` reads ``namespace_teams`` and ``device_inventory``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import Connection, Table, text

from ledger.events import RecordedEvent
from ledger.projections.base import close_intervals, open_interval, opt_str_of, str_of
from ledger.store import tables as t
from ledger.types import JSONObject, JSONValue

MODEL_ATTRIBUTES = ("model", "productName", "type")
"""Unqualified attribute names read, in this order, as a device's model (e.g. ``productName``)."""


def model_of(attributes: Mapping[str, JSONValue]) -> str | None:
    """Return the device model from ``ResourceSlice.spec.devices[].attributes`` or ``None``.

    An attribute ``gpu.nvidia.com/productName`` counts as ``productName``; only string values count.
    """
    by_name: dict[str, str] = {}
    for key, value in attributes.items():
        short = key.rsplit("/", 1)[-1]
        if isinstance(value, dict) and isinstance(value.get("string"), str):
            by_name.setdefault(short, str(value["string"]))
    for name in MODEL_ATTRIBUTES:
        if name in by_name:
            return by_name[name]
    return None


def counter_set_of(counters: Sequence[JSONValue]) -> str | None:
    """Return the first ``consumesCounters[].counterSet`` name, or ``None``."""
    for entry in counters:
        if isinstance(entry, dict) and isinstance(entry.get("counterSet"), str):
            return str(entry["counterSet"])
    return None


def _j(value: JSONValue) -> str:
    return json.dumps(value, sort_keys=True)


class NamespaceTeams:
    """Which team a namespace was billed to, over time (``TeamAssigned``)."""

    name = "namespace_teams"
    tables: Sequence[Table] = (t.namespace_teams,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Close the namespace's open interval and open one with the new team."""
        if event.type != "TeamAssigned":
            return
        ns = str_of(event.payload, "namespace")
        close_intervals(conn, t.namespace_teams, {"cluster": event.cluster, "namespace": ns}, event.occurred_at)
        open_interval(conn, t.namespace_teams, {"cluster": event.cluster, "namespace": ns,
                                                "team": str_of(event.payload, "team")}, event.occurred_at)


class DeviceInventory:
    """Which devices were published, where, with which attributes, over time."""

    name = "device_inventory"
    tables: Sequence[Table] = (t.device_inventory,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Open, replace or close the device's interval."""
        if event.type not in ("DevicePublished", "DeviceUpdated", "DeviceWithdrawn"):
            return
        p = event.payload
        key = {"cluster": event.cluster, "driver": str_of(p, "driver"), "pool": str_of(p, "pool"),
               "device": str_of(p, "device")}
        close_intervals(conn, t.device_inventory, key, event.occurred_at)
        if event.type == "DeviceWithdrawn":
            return
        attributes = p["attributes"]
        counters = p["consumesCounters"]
        assert isinstance(attributes, dict) and isinstance(counters, list)
        open_interval(conn, t.device_inventory, {
            **key, "node": opt_str_of(p, "node"), "slice_name": str_of(p, "sliceName"),
            "model": model_of(attributes), "counter_set": counter_set_of(counters),
            "allow_multiple_allocations": bool(p["allowMultipleAllocations"]),
            "attributes": _j(attributes), "capacity": _j(p["capacity"]),
            "consumes_counters": _j(counters), "taints": _j(p["taints"]),
        }, event.occurred_at)


class DeviceClasses:
    """DeviceClass specs over time."""

    name = "device_classes"
    tables: Sequence[Table] = (t.device_classes,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Open, replace or close the class's interval."""
        if event.type not in ("DeviceClassDefined", "DeviceClassChanged", "DeviceClassDeleted"):
            return
        key = {"cluster": event.cluster, "name": str_of(event.payload, "name")}
        close_intervals(conn, t.device_classes, key, event.occurred_at)
        if event.type != "DeviceClassDeleted":
            open_interval(conn, t.device_classes, {**key, "spec": _j(event.payload["spec"])}, event.occurred_at)


TAINT_RULE_EVENTS = ("DeviceTaintRuleDefined", "DeviceTaintRuleChanged", "DeviceTaintRuleDeleted")
"""The event types that change ``device_taint_rules`` (:class:`DeviceTaintRules` and its batch and fold forms)."""


def taint_rule_row(payload: JSONObject) -> dict[str, object]:
    """The ``device_taint_rules`` columns (besides cluster, name, valid) of a Defined / Changed payload.

    Args:
        payload: ``{"name", "deviceSelector", "taint"}`` as :class:`ledger.events.DeviceTaintRuleDefined` stores it.

    Returns:
        ``device_selector`` (JSON text, or ``None`` when the rule has no selector), ``effect``
        (``taint.effect``), ``taint`` (JSON text).

    Raises:
        AssertionError: ``taint`` is not a mapping (the translator always writes one).
        ledger.errors.Invalid: ``taint.effect`` is missing or not a string.
    """
    taint, selector = payload["taint"], payload.get("deviceSelector")
    assert isinstance(taint, dict)
    return {"device_selector": None if selector is None else _j(selector), "effect": str_of(taint, "effect"),
            "taint": _j(taint)}


class DeviceTaintRules:
    """DeviceTaintRule specs (``spec.deviceSelector``, ``spec.taint``) over time: one interval per spec.

    Source: ``DeviceTaintRuleDefined`` / ``Changed`` (open an interval, closing the open one) and
    ``DeviceTaintRuleDeleted`` (close it), dated by ``occurred_at``. Pending demand reads it (DESIGN §11.9).
    """

    name = "device_taint_rules"
    tables: Sequence[Table] = (t.device_taint_rules,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Open, replace or close the rule's interval; other events are ignored."""
        if event.type not in TAINT_RULE_EVENTS:
            return
        key = {"cluster": event.cluster, "name": str_of(event.payload, "name")}
        close_intervals(conn, t.device_taint_rules, key, event.occurred_at)
        if event.type != "DeviceTaintRuleDeleted":
            open_interval(conn, t.device_taint_rules, {**key, **taint_rule_row(event.payload)}, event.occurred_at)


class PodPhases:
    """Pod phases and claim references over time (``PodPhaseChanged``, ``PodDeleted``)."""

    name = "pod_phases"
    tables: Sequence[Table] = (t.pod_phases,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Close the pod's open interval; open a new one unless the pod was deleted."""
        if event.type not in ("PodPhaseChanged", "PodDeleted"):
            return
        p = event.payload
        key = {"cluster": event.cluster, "pod_uid": str_of(p, "uid")}
        close_intervals(conn, t.pod_phases, key, event.occurred_at)
        if event.type == "PodPhaseChanged":
            open_interval(conn, t.pod_phases, {
                **key, "namespace": str_of(p, "namespace"), "name": str_of(p, "name"),
                "phase": str_of(p, "phase"), "node": opt_str_of(p, "node"), "claims": _j(p["claims"]),
            }, event.occurred_at)


class Claims:
    """Current state per claim (table ``claims``) and its pending/allocated intervals (``claim_states``)."""

    name = "claims"
    tables: Sequence[Table] = (t.claims, t.claim_states)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Maintain the claim row and its state intervals."""
        p, at = event.payload, event.occurred_at
        if not event.type.startswith("Claim"):
            return
        key = {"cluster": event.cluster, "claim_uid": str_of(p, "uid")}
        if event.type == "ClaimCreated":
            conn.execute(text(
                "INSERT INTO claims (cluster, uid, namespace, name, origin, owner_pod, owner_pod_uid, "
                "requests, state, created_at) VALUES (:cluster, :uid, :namespace, :name, :origin, "
                ":owner_pod, :owner_pod_uid, :requests, 'pending', :at) "
                "ON CONFLICT ON CONSTRAINT claims_pkey DO NOTHING"),
                {"cluster": event.cluster, "uid": str_of(p, "uid"), "namespace": str_of(p, "namespace"),
                 "name": str_of(p, "name"), "origin": str_of(p, "origin"),
                 "owner_pod": opt_str_of(p, "ownerPod"), "owner_pod_uid": opt_str_of(p, "ownerPodUID"),
                 "requests": _j(p["requests"]), "at": at})
            open_interval(conn, t.claim_states, {**key, "state": "pending", "node": None}, at)
        elif event.type == "ClaimAllocated":
            self._set_state(conn, key, "allocated", opt_str_of(p, "node"), at)
        elif event.type == "ClaimDeallocated":
            self._set_state(conn, key, "pending", None, at)
        elif event.type == "ClaimDeletionRequested":
            conn.execute(text("UPDATE claims SET deletion_requested_at = :at WHERE cluster = :cluster "
                              "AND uid = :claim_uid"), {**key, "at": at})
        elif event.type == "ClaimDeleted":
            close_intervals(conn, t.claim_states, key, at)
            conn.execute(text("UPDATE claims SET state = 'deleted', deleted_at = :at WHERE cluster = :cluster "
                              "AND uid = :claim_uid"), {**key, "at": at})

    @staticmethod
    def _set_state(conn: Connection, key: Mapping[str, object], state: str, node: str | None,
                   at: datetime) -> None:
        close_intervals(conn, t.claim_states, key, at)
        open_interval(conn, t.claim_states, {**key, "state": state, "node": node}, at)
        conn.execute(text("UPDATE claims SET state = :state WHERE cluster = :cluster AND uid = :claim_uid"),
                     {**key, "state": state})


class ClaimConsumers:
    """``reservedFor`` consumers per claim over time."""

    name = "claim_consumers"
    tables: Sequence[Table] = (t.claim_consumers,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Open an interval on ClaimReserved; close it on ClaimUnreserved or ClaimDeleted."""
        p = event.payload
        if event.type == "ClaimDeleted":
            close_intervals(conn, t.claim_consumers, {"cluster": event.cluster, "claim_uid": str_of(p, "uid")},
                            event.occurred_at)
            return
        if event.type not in ("ClaimReserved", "ClaimUnreserved"):
            return
        consumer = p["consumer"]
        assert isinstance(consumer, dict)
        key = {"cluster": event.cluster, "claim_uid": str_of(p, "uid"), "resource": str_of(consumer, "resource"),
               "name": str_of(consumer, "name")}
        close_intervals(conn, t.claim_consumers, key, event.occurred_at)
        if event.type == "ClaimReserved":
            open_interval(conn, t.claim_consumers, {**key, "uid": opt_str_of(consumer, "uid"),
                                                    "api_group": opt_str_of(consumer, "apiGroup")},
                          event.occurred_at)


ALLOCATION_EVENTS = frozenset({"ClaimAllocated", "ClaimDeallocated", "TeamAssigned"})
"""The event types that open, close or relabel ``device_allocations`` rows (:class:`DeviceAllocations`); the
batch form and the forgetting of rolled usage hours (:mod:`ledger.projections.runner`) read the same set."""

PUBLISHED_EVENTS = frozenset({"DevicePublished", "DeviceUpdated"})
"""The event types that fill the ``model`` and ``node`` of allocations waiting for their device
(``awaiting_device_from`` set; :meth:`DeviceAllocations.apply_event`). Their rolled hours are forgotten from the
earliest row filled (:func:`ledger.projections.rollups.unpublished_starts`), not from the event's time."""


def published_fill(payload: JSONObject) -> tuple[str | None, str | None, bool]:
    """``(model, node, shareable)`` that a DevicePublished / DeviceUpdated gives the allocations waiting for its device.

    ``model`` as :func:`model_of` reads it from ``attributes``; ``node`` is ``None`` for a device of no single node
    (the allocation then keeps the node its ClaimAllocated named), as an allocation applied after the event would;
    ``shareable`` is ``allowMultipleAllocations``.

    Raises:
        AssertionError: ``attributes`` is not a mapping (the translator always writes one).
    """
    attributes = payload["attributes"]
    assert isinstance(attributes, dict)
    return model_of(attributes), opt_str_of(payload, "node") or None, bool(payload["allowMultipleAllocations"])


FILL_UNPUBLISHED = (
    "UPDATE device_allocations SET model = :model, node = coalesce(:node, node), "
    "conflict = conflict AND NOT :shareable, awaiting_device_from = NULL "
    "WHERE cluster = :cluster AND driver = :driver AND pool = :pool AND device = :device "
    "AND awaiting_device_from >= :at AND NOT isempty(valid)")
"""Fill the rows of one device that wait for it and whose allocation began at or after ``:at``: the allocation's
start, not the row's, which a relabel splits off later (one allocation is filled whole or not at all, whatever the
order of the relabel and the device's event); empty rows never. A device that allows multiple allocations clears
their ``conflict`` (flagged because no inventory row said so when they were applied). Through index
``device_allocations_awaiting_device_idx``."""


class DeviceAllocations:
    """Which claim held which device (or share of it), for which team, over time.

    Team comes from ``namespace_teams`` at the allocation instant; a ``TeamAssigned`` splits the open
    intervals of the namespace so a relabel changes attribution from then on, never retroactively.
    Two overlapping allocations of a device that does not ``allowMultipleAllocations`` are both kept and
    flagged ``conflict`` (DESIGN §11.5); ``adminAccess`` allocations never conflict.

    ``model`` and ``node`` come from the device's ``device_inventory`` row at the allocation's start. An allocation
    applied when no row held the device then (its ResourceSlice not recorded yet: a watch started on a running
    cluster lists claims and slices at once) is kept with its start in ``awaiting_device_from``, and the first
    DevicePublished / DeviceUpdated of the device applied later, dated at or before the allocation's start, fills
    its model and node (the split and relabelled pieces of it alike), and clears its ``conflict`` if the device
    allows multiple allocations (shares recorded before their device flagged one another). A row it flagged that
    was not waiting keeps its flag.
    """

    name = "device_allocations"
    tables: Sequence[Table] = (t.device_allocations,)

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Open intervals per result on ClaimAllocated, close them on ClaimDeallocated."""
        p, at = event.payload, event.occurred_at
        if event.type == "ClaimAllocated":
            self._allocate(conn, event)
        elif event.type == "ClaimDeallocated":
            close_intervals(conn, t.device_allocations, {"cluster": event.cluster, "claim_uid": str_of(p, "uid")}, at)
        elif event.type == "TeamAssigned":
            self._relabel(conn, event)
        elif event.type in PUBLISHED_EVENTS:
            model, node, shareable = published_fill(p)
            conn.execute(text(FILL_UNPUBLISHED), {
                "cluster": event.cluster, "driver": str_of(p, "driver"), "pool": str_of(p, "pool"),
                "device": str_of(p, "device"), "model": model, "node": node, "shareable": shareable, "at": at})

    @staticmethod
    def _team(conn: Connection, cluster: str, namespace: str, at: datetime) -> str:
        team = conn.execute(text(
            "SELECT team FROM namespace_teams WHERE cluster = :c AND namespace = :ns AND valid @> :at "
            "ORDER BY lower(valid) DESC LIMIT 1"), {"c": cluster, "ns": namespace, "at": at}).scalar()
        return str(team) if team is not None else namespace

    def _allocate(self, conn: Connection, event: RecordedEvent) -> None:
        p, at, cluster = event.payload, event.occurred_at, event.cluster
        namespace = str_of(p, "namespace")
        team = self._team(conn, cluster, namespace, at)
        results = p["results"]
        assert isinstance(results, list)
        for result in results:
            assert isinstance(result, dict)
            dev = {"cluster": cluster, "driver": str_of(result, "driver"), "pool": str_of(result, "pool"),
                   "device": str_of(result, "device")}
            inv = conn.execute(text(
                "SELECT node, model, allow_multiple_allocations FROM device_inventory WHERE cluster = :cluster "
                "AND driver = :driver AND pool = :pool AND device = :device AND valid @> :at "
                "ORDER BY lower(valid) DESC LIMIT 1"), {**dev, "at": at}).first()
            admin = bool(result.get("adminAccess"))
            shareable = bool(inv.allow_multiple_allocations) if inv is not None else False
            conflict = False
            if not admin and not shareable:
                others = conn.execute(text(
                    "UPDATE device_allocations SET conflict = true WHERE cluster = :cluster AND driver = :driver "
                    "AND pool = :pool AND device = :device AND upper_inf(valid) AND NOT admin_access "
                    "AND claim_uid <> :uid RETURNING row_id"), {**dev, "uid": str_of(p, "uid")}).all()
                conflict = bool(others)
            open_interval(conn, t.device_allocations, {
                **dev, "claim_uid": str_of(p, "uid"), "namespace": namespace, "claim": str_of(p, "name"),
                "team": team, "request": str_of(result, "request"),
                "device_class": opt_str_of(result, "deviceClassName"), "share_id": opt_str_of(result, "shareID"),
                "consumed_capacity": _j(result.get("consumedCapacity") or {}), "admin_access": admin,
                "node": (inv.node if inv is not None else None) or opt_str_of(p, "node"),
                "model": inv.model if inv is not None else None, "conflict": conflict,
                "awaiting_device_from": None if inv is not None else at,
            }, at)

    @staticmethod
    def _relabel(conn: Connection, event: RecordedEvent) -> None:
        p, at = event.payload, event.occurred_at
        params = {"cluster": event.cluster, "ns": str_of(p, "namespace"), "team": str_of(p, "team"), "at": at}
        # Split every open interval of the namespace whose team differs: close at `at`, reopen with the
        # new team from `at`. Intervals that start after `at` (out-of-order) just take the new team.
        conn.execute(text(
            "INSERT INTO device_allocations (cluster, claim_uid, namespace, claim, team, request, device_class, "
            "driver, pool, device, share_id, consumed_capacity, admin_access, node, model, conflict, "
            "awaiting_device_from, valid) SELECT cluster, claim_uid, namespace, claim, :team, request, device_class, "
            "driver, pool, device, share_id, consumed_capacity, admin_access, node, model, conflict, "
            "awaiting_device_from, tstzrange(:at, NULL, '[)') "
            "FROM device_allocations WHERE cluster = :cluster AND namespace = :ns AND upper_inf(valid) "
            "AND NOT isempty(valid) AND team <> :team AND lower(valid) < :at"), params)
        conn.execute(text(
            "UPDATE device_allocations SET valid = tstzrange(lower(valid), :at, '[)') WHERE cluster = :cluster "
            "AND namespace = :ns AND upper_inf(valid) AND team <> :team AND lower(valid) < :at"), params)
        conn.execute(text(
            "UPDATE device_allocations SET team = :team WHERE cluster = :cluster AND namespace = :ns "
            "AND upper_inf(valid) AND lower(valid) >= :at"), params)


ALL: tuple[NamespaceTeams | DeviceInventory | DeviceClasses | DeviceTaintRules | PodPhases | Claims
           | ClaimConsumers | DeviceAllocations, ...] = (
    NamespaceTeams(), DeviceInventory(), DeviceClasses(), DeviceTaintRules(), PodPhases(), Claims(),
    ClaimConsumers(), DeviceAllocations(),
)
"""Every core projection, in the order they are applied."""
