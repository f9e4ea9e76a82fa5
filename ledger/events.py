"""Domain events: what the ledger records, in the past tense, with Kubernetes field names.

Every event is a frozen ``msgspec.Struct`` (the ingest builds one per event, and a Struct sets its
fields in C) registered in :data:`EVENT_TYPES`. The stored payload (column
``events.payload``) is the event's fields with Kubernetes spelling (``shareID``,
``consumedCapacity``, ``reservedFor`` ...) produced by :func:`to_payload`; :func:`from_payload` reads
it back. The envelope (stream, stream position, global position, times, source) is
:class:`RecordedEvent` once stored and :class:`NewEvent` before.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar, TypeAlias

import msgspec

from ledger.types import GlobalPosition, JSONObject, JSONValue, StreamId, StreamPosition

SCHEMA_VERSION = 1
"""Version of the payload shapes below; bumped when a payload changes incompatibly."""

_RENAMES = {"share_id": "shareID", "uid": "uid", "pod_uid": "podUID", "owner_pod_uid": "ownerPodUID"}


def _camel(name: str) -> str:
    if name in _RENAMES:
        return _RENAMES[name]
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


class Event(msgspec.Struct, frozen=True, kw_only=True, rename=_camel):
    """Base of all domain events; ``TYPE`` is the stored ``events.type``.

    ``rename``: msgspec encodes an event with the payload's key spelling (``shareID``, ``consumedCapacity``),
    so the append path encodes the Struct itself, in C, instead of a dict built by :func:`to_payload`.
    """

    TYPE: ClassVar[str] = ""


# --- devices and pools (source: ResourceSlice) -------------------------------------------------


class DevicePublished(Event, frozen=True, kw_only=True):
    """A device appeared in the counting generation of its pool.

    Source: ``ResourceSlice.spec.devices[]`` of a slice at the highest ``spec.pool.generation``.
    ``attributes`` and ``capacity`` keep the Kubernetes shapes (``{"model": {"string": "A100"}}``,
    ``{"memory": {"value": "80Gi"}}``); ``consumes_counters`` is ``spec.devices[].consumesCounters``.
    """

    TYPE: ClassVar[str] = "DevicePublished"
    driver: str
    pool: str
    device: str
    node: str | None
    slice_name: str
    attributes: JSONObject
    capacity: JSONObject
    allow_multiple_allocations: bool
    consumes_counters: list[JSONValue]
    taints: list[JSONValue]


class DeviceUpdated(DevicePublished, frozen=True, kw_only=True):
    """A published device changed attributes, capacity, counters, taints, node or slice."""

    TYPE: ClassVar[str] = "DeviceUpdated"


class DeviceWithdrawn(Event, frozen=True, kw_only=True):
    """A device left the counting generation of its pool (slice deleted, device removed, or a newer
    pool generation without it). Allocations that still name it stay held off-slice (DESIGN §11.4)."""

    TYPE: ClassVar[str] = "DeviceWithdrawn"
    driver: str
    pool: str
    device: str


class PoolGenerationObserved(Event, frozen=True, kw_only=True):
    """The counting generation of a pool, or its completeness, changed.

    Source: ``ResourceSlice.spec.pool`` {name, generation, resourceSliceCount}; ``slices`` is the
    number of existing slices at that generation; ``complete`` is ``slices >= resourceSliceCount``.
    """

    TYPE: ClassVar[str] = "PoolGenerationObserved"
    driver: str
    pool: str
    generation: int
    resource_slice_count: int
    slices: int
    complete: bool
    shared_counters: list[JSONValue]


# --- claims (source: ResourceClaim) ------------------------------------------------------------


class ClaimCreated(Event, frozen=True, kw_only=True):
    """A ResourceClaim was first seen.

    ``origin`` is ``manual``, ``template`` or ``extended``; ``requests`` is
    ``spec.devices.requests[]`` normalised to v1 (``exactly`` / ``firstAvailable``).
    """

    TYPE: ClassVar[str] = "ClaimCreated"
    uid: str
    namespace: str
    name: str
    origin: str
    owner_pod: str | None
    owner_pod_uid: str | None
    requests: list[JSONValue]


class ClaimAllocated(Event, frozen=True, kw_only=True):
    """Devices were allocated to the claim: ``status.allocation.devices.results[]``.

    Each result keeps ``request``, ``driver``, ``pool``, ``device``, ``adminAccess``, ``shareID``,
    ``consumedCapacity`` plus ``deviceClassName`` resolved from the claim's request. ``node`` comes
    from ``status.allocation.nodeSelector`` (a ``metadata.name`` match) when there is one.
    """

    TYPE: ClassVar[str] = "ClaimAllocated"
    uid: str
    namespace: str
    name: str
    results: list[JSONValue]
    node: str | None
    allocation_timestamp: str | None


class ClaimReserved(Event, frozen=True, kw_only=True):
    """A consumer entered ``status.reservedFor[]`` ({resource, name, uid, apiGroup})."""

    TYPE: ClassVar[str] = "ClaimReserved"
    uid: str
    consumer: JSONObject


class ClaimUnreserved(Event, frozen=True, kw_only=True):
    """A consumer left ``status.reservedFor[]`` (or the claim was deleted while it was there)."""

    TYPE: ClassVar[str] = "ClaimUnreserved"
    uid: str
    consumer: JSONObject


class ClaimDeletionRequested(Event, frozen=True, kw_only=True):
    """``metadata.deletionTimestamp`` was set. Not a release: the devices stay held (DESIGN §11.1)."""

    TYPE: ClassVar[str] = "ClaimDeletionRequested"
    uid: str
    deletion_timestamp: str


class ClaimDeallocated(Event, frozen=True, kw_only=True):
    """The allocation left ``status.allocation`` (or the claim was deleted while allocated): a release,
    dated when it was observed."""

    TYPE: ClassVar[str] = "ClaimDeallocated"
    uid: str


class ClaimDeleted(Event, frozen=True, kw_only=True):
    """The ResourceClaim was DELETED from the API server."""

    TYPE: ClassVar[str] = "ClaimDeleted"
    uid: str


# --- device classes, namespaces, pods ----------------------------------------------------------


class DeviceClassDefined(Event, frozen=True, kw_only=True):
    """A DeviceClass was first seen; ``spec`` is its v1 spec (selectors, config, extendedResourceName)."""

    TYPE: ClassVar[str] = "DeviceClassDefined"
    name: str
    spec: JSONObject


class DeviceClassChanged(DeviceClassDefined, frozen=True, kw_only=True):
    """The spec of a DeviceClass changed."""

    TYPE: ClassVar[str] = "DeviceClassChanged"


class DeviceClassDeleted(Event, frozen=True, kw_only=True):
    """A DeviceClass was deleted."""

    TYPE: ClassVar[str] = "DeviceClassDeleted"
    name: str


# --- device taint rules (source: DeviceTaintRule) -----------------------------------------------


class DeviceTaintRuleDefined(Event, frozen=True, kw_only=True):
    """A DeviceTaintRule was first seen (or seen again after its deletion).

    Source: ``DeviceTaintRule.spec`` (any served version, normalised). ``device_selector`` is
    ``spec.deviceSelector`` with only the fields set among ``deviceClassName``, ``driver``, ``pool``,
    ``device`` and ``selectors`` (``[{"cel": {"expression": ...}}]``); ``None`` when the rule has no
    selector, which in Kubernetes matches no device (``{}`` matches every device). ``taint`` is
    ``spec.taint`` as ``{"key", "value", "effect", "timeAdded"}`` (``value`` and ``timeAdded`` may be
    ``None``; ``timeAdded`` is the RFC 3339 text as sent). Stream ``taintrule:<name>``.
    """

    TYPE: ClassVar[str] = "DeviceTaintRuleDefined"
    name: str
    device_selector: JSONObject | None
    taint: JSONObject


class DeviceTaintRuleChanged(DeviceTaintRuleDefined, frozen=True, kw_only=True):
    """The ``spec.deviceSelector`` or ``spec.taint`` of a DeviceTaintRule changed; the payload is the new spec."""

    TYPE: ClassVar[str] = "DeviceTaintRuleChanged"


class DeviceTaintRuleDeleted(Event, frozen=True, kw_only=True):
    """A DeviceTaintRule was deleted: its taint no longer applies, from the time the deletion was observed."""

    TYPE: ClassVar[str] = "DeviceTaintRuleDeleted"
    name: str


class TeamAssigned(Event, frozen=True, kw_only=True):
    """The team billed for a namespace was set or changed: the value of the team label, or the namespace
    name when the label is absent. ``label`` is the label key read, ``None`` when the name was used."""

    TYPE: ClassVar[str] = "TeamAssigned"
    namespace: str
    team: str
    label: str | None


class PodPhaseChanged(Event, frozen=True, kw_only=True):
    """A pod was first seen or changed ``status.phase`` or its claim links.

    ``claims`` are the claim names it references: ``spec.resourceClaims[].resourceClaimName``,
    ``status.resourceClaimStatuses[].resourceClaimName`` and
    ``status.extendedResourceClaimStatus.resourceClaimName`` (DESIGN §11.3).
    """

    TYPE: ClassVar[str] = "PodPhaseChanged"
    uid: str
    namespace: str
    name: str
    phase: str
    node: str | None
    claims: list[JSONValue]


class PodDeleted(Event, frozen=True, kw_only=True):
    """A pod was DELETED: any ``reservedFor`` entry naming it is stale from now on."""

    TYPE: ClassVar[str] = "PodDeleted"
    uid: str
    namespace: str
    name: str


EventClass: TypeAlias = type[Event]
EVENT_TYPES: Mapping[str, EventClass] = {
    cls.TYPE: cls
    for cls in (
        DevicePublished, DeviceUpdated, DeviceWithdrawn, PoolGenerationObserved,
        ClaimCreated, ClaimAllocated, ClaimReserved, ClaimUnreserved, ClaimDeletionRequested,
        ClaimDeallocated, ClaimDeleted, DeviceClassDefined, DeviceClassChanged, DeviceClassDeleted,
        DeviceTaintRuleDefined, DeviceTaintRuleChanged, DeviceTaintRuleDeleted,
        TeamAssigned, PodPhaseChanged, PodDeleted,
    )
}
"""Every event type by its stored name."""


def to_payload(event: Event) -> JSONObject:
    """Return the stored payload of ``event``: its fields with Kubernetes key spelling (the class's ``rename``).

    The append path encodes the Struct itself (``store.postgres.json_bytes``), to the same object.
    """
    return {key: getattr(event, name) for name, key in zip(event.__struct_fields__, event.__struct_encode_fields__,
                                                           strict=True)}


def from_payload(type_: str, payload: Mapping[str, JSONValue]) -> Event:
    """Rebuild an event from ``events.type`` and ``events.payload``.

    Raises:
        KeyError: ``type_`` is not in :data:`EVENT_TYPES` or the payload lacks a field.
    """
    cls = EVENT_TYPES[type_]
    return cls(**{name: payload[key] for name, key in zip(cls.__struct_fields__, cls.__struct_encode_fields__,
                                                          strict=True)})


class EventSource(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The observation an event came from: kind, uid, ``resourceVersion``, watch event type, and the
    ``observations.digest`` of the line.

    ``rename``: msgspec encodes it as the ``events.source`` column holds it (``kind``, ``uid``,
    ``resourceVersion``, ``watchType``, ``digest``), so the append path encodes the Struct itself.
    """

    kind: str
    uid: str | None
    resource_version: str | None
    watch_type: str
    digest: str


class NewEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event about to be appended: the domain event plus its envelope minus the global position.

    ``event_id`` is deterministic (the observation's receive time, then a hash of its digest and the event's
    index in it: :func:`event_id_for`), so re-translating the same observation yields the same ids.
    """

    stream: StreamId
    stream_position: StreamPosition
    event: Event
    occurred_at: datetime
    recorded_at: datetime
    source: EventSource
    event_id: uuid.UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedEvent:
    """An event as stored in table ``events``; ``payload`` uses Kubernetes key spelling."""

    global_position: GlobalPosition
    cluster: str
    stream: StreamId
    stream_position: StreamPosition
    type: str
    occurred_at: datetime
    recorded_at: datetime
    payload: JSONObject
    source: JSONObject = field(default_factory=dict)


def event_id_for(digest: str, index: int, observed_at: datetime) -> uuid.UUID:
    """Deterministic id of the ``index``-th event translated from observation ``digest``, received at
    ``observed_at`` (tz-aware): a version 8 UUID (RFC 9562) whose first 48 bits are ``observed_at`` in Unix
    milliseconds (0 before 1970; 48 bits reach past the year 9999) and whose other 74 free bits are the first
    bits of the SHA-1 of ``dra-ledger:<digest>:<index>`` (the name earlier releases' version 5 ids hashed).

    Why time first: ids are unique in ``events_event_id_key``, and hashed ids put each of a batch's
    thousands of events on a page of its own anywhere in that index (2,150 of its 2,336 pages a batch at
    476,642 events), so once the index outgrows memory every insert waits on a disk read; ids that follow
    the receive time land on its last pages. The same observation still gives the same ids, and an id
    stays unique: the digest identifies the line, and the index its event.
    """
    # Called for every event of an ingest: the name is formatted as bytes in one step and the fixed bits are one
    # constant (the same ids as before, cheaper).
    name = b"%b%b:%d" % (_NAME_PREFIX, digest.encode(), index)
    hashed = int.from_bytes(hashlib.sha1(name, usedforsecurity=False).digest()[:10])
    millis = (observed_at - _EPOCH) // _MILLISECOND
    if millis < 0:
        millis = 0
    # Layout: 48 bits time | version 8 | 12 hash bits (the hash's top 12 of 80) | variant 0b10 | 62 hash bits.
    return uuid.UUID(int=(millis << 80) | _VERSION_AND_VARIANT | ((hashed >> 4) & _HASH_HIGH_12) | (hashed & _LOW_62))


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)
_LOW_62 = (1 << 62) - 1
_HASH_HIGH_12 = 0xFFF << 64
"""Where the hash's top 12 bits (bits 68-79, shifted right by 4) sit in the id: bits 64-75."""
_VERSION_AND_VARIANT = (8 << 76) | (0b10 << 62)
_NAME_PREFIX = uuid.NAMESPACE_URL.bytes + b"dra-ledger:"
"""What every hashed name starts with: the URL namespace's bytes, as version 5 ids hashed them, and the tag."""


def positions(events: Sequence[NewEvent]) -> dict[StreamId, StreamPosition]:
    """Return the highest stream position per stream in ``events`` (for bookkeeping after an append)."""
    out: dict[StreamId, StreamPosition] = {}
    for e in events:
        out[e.stream] = max(out.get(e.stream, StreamPosition(0)), e.stream_position)
    return out
