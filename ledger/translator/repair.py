"""A ResourceClaim's translator entry rebuilt from the events of its stream.

Why: release 0.3.0 could write a claim's entry back behind the claim's stream (a standby that took the Lease
loaded the state, then the former leader's blocked write committed; the standby's next batch saved its older
entry). From then on every event translated for that claim expected an old stream position and was refused as a
``StreamConflict``, by every writer and every restart, so the claim's later changes (its release, its deletion)
were never recorded. Writers since migration 0014 cannot do that (``cluster_appends``), but a ledger damaged
before the upgrade keeps such entries. The events themselves are whole and in order; only the entry lags. An entry
is what the translator remembers of the object to diff the next version against (``ledger.translator.translate``),
and for a claim every part of it is in the claim's events, so folding them gives the entry that one writer would
have kept. :func:`claim_entry` does that; ``ledger.services.repair_state`` finds the entries behind their streams
and writes the folded ones under the append lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC

from ledger import events as ev
from ledger.events import RecordedEvent
from ledger.translator.translate import consumer_key
from ledger.types import JSONObject


def claim_entry(events: Sequence[RecordedEvent]) -> JSONObject:
    """The translator entry of a ResourceClaim after ``events``, the whole stream ``claim:<uid>`` in order.

    The entry has the shape :func:`ledger.translator.translate` keeps (``pos``, ``namespace``, ``name``,
    ``results``, ``consumers`` keyed as it keys them, ``deletion``, ``released``, ``rv``), or, once the claim is
    deleted, its tombstone (``pos``, ``deleted``, ``rv``). ``rv`` is the ``resourceVersion`` of the object version
    the last event came from (``events.source``): a later version that changed nothing the ledger tracks is not
    among the events, so a redelivery of it is translated again, and emits nothing.

    Args:
        events: every event of one claim's stream (``RecordedEvent`` rows of table ``events``), by stream position
            from 1.

    Returns:
        The entry, a JSON object.

    Raises:
        ValueError: ``events`` is empty, is not one stream numbered 1, 2, ... in order, or does not begin with
            ``ClaimCreated``.
        KeyError: an event's payload lacks a field its type has (``ledger.events.from_payload``).
    """
    if not events or events[0].type != "ClaimCreated":
        raise ValueError("a claim's stream begins with ClaimCreated")
    if [e.stream_position for e in events] != list(range(1, len(events) + 1)) or len({e.stream for e in events}) != 1:
        raise ValueError("not one stream in order from position 1")
    entry: JSONObject = {}
    for recorded in events:
        event = ev.from_payload(recorded.type, recorded.payload)
        rv = recorded.source.get("resourceVersion")
        if isinstance(event, ev.ClaimCreated):
            entry = {"pos": 0, "namespace": event.namespace, "name": event.name, "results": None, "consumers": {},
                     "deletion": None}
        elif isinstance(event, ev.ClaimAllocated):
            entry["results"] = event.results
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
        elif isinstance(event, ev.ClaimDeleted):
            entry = {"deleted": True}
        entry["pos"] = recorded.stream_position
        entry["rv"] = rv if isinstance(rv, str) else None
    return entry

