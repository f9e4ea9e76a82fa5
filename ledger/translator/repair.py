"""Translator entries rebuilt from the events of their objects' streams.

Why: release 0.3.0 could write an entry back behind its object's stream (a standby that took the Lease loaded the
state, then the former leader's blocked write committed; the standby's next batch saved its older entry). From then
on every event translated for that object expected an old stream position and was refused as a ``StreamConflict``,
by every writer and every restart, so the object's later changes (a claim's release, its deletion) were never
recorded. Writers since migration 0014 cannot do that (``cluster_appends``), but a ledger damaged before the upgrade
keeps such entries. The events themselves are whole and in order; only the entry lags. An entry is what the
translator remembers of the object to diff the next version against (``ledger.translator.translate``), and for a
claim, a pod, a namespace, a DeviceClass or a DeviceTaintRule every part of it is in the object's events, so folding
them gives the entry that one writer would have kept. :func:`rebuilt_entry` does that;
``ledger.services.repair_state`` finds the entries behind their streams and writes the folded ones under the append
lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

from ledger import events as ev
from ledger.events import RecordedEvent
from ledger.translator.translate import consumer_key
from ledger.types import JSONObject

REBUILT_PREFIXES = ("claim:", "pod:", "namespace:", "class:", "taintrule:")
"""State keys (each also its object's stream) whose entry :func:`rebuilt_entry` folds from the stream's events.
Not ``pool:``: a pool's entry also holds its slices' views and its devices' positions, which no pool event
carries whole; not ``slice:``, which names no stream."""


def rebuilt_entry(events: Sequence[RecordedEvent]) -> JSONObject:
    """The translator entry of an object after ``events``, its whole stream in order.

    A claim's entry has the shape :func:`ledger.translator.translate` keeps (``pos``, ``namespace``, ``name``,
    ``results``, ``consumers`` keyed as it keys them, ``deletion``, ``stamp``, ``released``, ``releasedStamp``,
    ``rv``), or, once the claim is deleted, its tombstone (``pos``, ``deleted``, ``rv``). ``rv`` is the
    ``resourceVersion`` of the object version the last event came from (``events.source``): a later version that
    changed nothing the ledger tracks is not among the events, so a redelivery of it is translated again, and emits
    nothing. The other kinds' entries are their last event's fields (a pod's namespace, name, phase, node and claims;
    a namespace's team; a DeviceClass's spec; a DeviceTaintRule's selector and taint) with ``pos``.

    Args:
        events: every event of one stream whose key starts with one of :data:`REBUILT_PREFIXES` (rows of table
            ``events``), by stream position from 1.

    Returns:
        The entry, a JSON object of the shape :mod:`ledger.translator.translate` keeps for that kind.

    Raises:
        ValueError: ``events`` is empty, not one stream numbered 1, 2, ... in order, of another kind, or a claim's
            stream that does not begin with ``ClaimCreated``.
        KeyError: an event's payload lacks a field its type has (``ledger.events.from_payload``).
    """
    if not events:
        raise ValueError("no events to rebuild an entry from")
    if [e.stream_position for e in events] != list(range(1, len(events) + 1)) or len({e.stream for e in events}) != 1:
        raise ValueError("not one stream in order from position 1")
    if events[0].stream.startswith("claim:"):
        return _claim_entry(events)
    entry: JSONObject = {}
    for recorded in events:
        event = ev.from_payload(recorded.type, recorded.payload)
        if isinstance(event, ev.PodPhaseChanged):
            entry = {"namespace": event.namespace, "name": event.name, "phase": event.phase, "node": event.node,
                     "claims": list(event.claims)}
        elif isinstance(event, ev.TeamAssigned):
            entry = {"team": event.team}
        elif isinstance(event, ev.DeviceClassDefined):  # DeviceClassChanged too (a subclass)
            entry = {"spec": event.spec}
        elif isinstance(event, ev.DeviceClassDeleted):
            entry = {"deleted": True, "spec": None}
        elif isinstance(event, ev.DeviceTaintRuleDefined):  # and DeviceTaintRuleChanged
            entry = {"deviceSelector": event.device_selector, "taint": event.taint}
        elif isinstance(event, ev.PodDeleted | ev.DeviceTaintRuleDeleted):
            entry = {"deleted": True}
        else:
            raise ValueError(f"{recorded.stream}: no entry is rebuilt from a {recorded.type} stream")
        entry["pos"] = recorded.stream_position
    return entry


def _claim_entry(events: Sequence[RecordedEvent]) -> JSONObject:
    """The fold of :func:`rebuilt_entry` for a ResourceClaim's stream (checked there: one stream, from position 1).

    Raises:
        ValueError: the stream does not begin with ``ClaimCreated``.
    """
    if events[0].type != "ClaimCreated":
        raise ValueError("a claim's stream begins with ClaimCreated")
    entry: JSONObject = {}
    for recorded in events:
        event = ev.from_payload(recorded.type, recorded.payload)
        rv = recorded.source.get("resourceVersion")
        if isinstance(event, ev.ClaimCreated):
            entry = {"pos": 0, "namespace": event.namespace, "name": event.name, "results": None, "consumers": {},
                     "deletion": None}
        elif isinstance(event, ev.ClaimAllocated):
            entry["results"] = event.results
            if event.allocation_timestamp:
                entry["stamp"] = event.allocation_timestamp
        elif isinstance(event, ev.ClaimReserved):
            consumers = entry["consumers"]
            assert isinstance(consumers, dict)
            consumers[consumer_key(event.consumer)] = dict(event.consumer)
        elif isinstance(event, ev.ClaimUnreserved):
            consumers = entry["consumers"]
            assert isinstance(consumers, dict)
            consumers.pop(consumer_key(event.consumer), None)
        elif isinstance(event, ev.ClaimDeletionRequested):
            entry["deletion"] = event.deletion_timestamp
        elif isinstance(event, ev.ClaimDeallocated):
            entry["results"] = None
            # As the translator writes it: the receive time of the version that lost its allocation, which dates
            # the ClaimDeallocated (a later allocation of the claim never starts before it).
            entry["released"] = recorded.occurred_at.astimezone(UTC).isoformat()
            entry["releasedStamp"] = entry.pop("stamp", None)
        elif isinstance(event, ev.ClaimDeleted):
            entry = {"deleted": True}
        entry["pos"] = recorded.stream_position
        entry["rv"] = rv if isinstance(rv, str) else None
    return entry
