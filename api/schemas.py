"""Response bodies of the REST API as msgspec Structs (they are what ``/schema`` documents).

Field names are the JSON keys, spelled as Kubernetes spells them (``shareID``, ``adminAccess``), so the
structs mirror the bodies that :mod:`ledger.services` builds; :func:`to_struct` converts and checks.
Lists carry ``nextPageToken``: opaque, ``null`` on the last page.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def to_struct(body: object, kind: type[T]) -> T:
    """Convert a services body (plain JSON dict) into the response struct ``kind``.

    Raises:
        msgspec.ValidationError: the body does not have the documented shape (a bug: answered as 500).
    """
    return msgspec.convert(body, type=kind, strict=False)


class Problem(msgspec.Struct, kw_only=True, omit_defaults=True):
    """RFC 9457 problem details (``application/problem+json``)."""

    status: int
    title: str | None = None
    detail: str | None = None
    type: str | None = None
    instance: str | None = None


class Totals(msgspec.Struct, kw_only=True):
    """Device counts at T: hardware that shares a counter set counts once; ``free`` is never negative."""

    devices: int
    allocated: int
    free: int
    shared: int


class Holder(msgspec.Struct, kw_only=True):
    """One allocation of a device (``ResourceClaim.status.allocation.devices.results[]``)."""

    namespace: str
    claim: str
    team: str
    request: str
    deviceClass: str | None
    shareID: str | None
    adminAccess: bool
    conflict: bool
    consumers: list[str]
    consumedCapacity: dict[str, Any] = msgspec.field(default_factory=dict)


class DeviceOccupancy(msgspec.Struct, kw_only=True):
    """A device at T and its holders; ``offSlice`` when it is held after leaving its ResourceSlice;
    ``counterSetConflict`` when it is allocated and the allocated devices of its counter set
    (``consumesCounters``, a GPU and its MIG partitions) take more than the pool's ``sharedCounters`` hold;
    ``counterSetHeldBy``: for a device with no allocation but ``adminAccess`` ones, the allocated devices of its pool
    that leave too little of its counter set for it (a MIG partition of a GPU allocated whole), else empty (always
    for a team-limited token)."""

    cluster: str
    driver: str
    pool: str
    device: str
    node: str | None
    model: str | None
    offSlice: bool
    counterSetConflict: bool
    counterSetHeldBy: list[str]
    allocations: list[Holder]


class Occupancy(msgspec.Struct, kw_only=True):
    """``GET /v1/occupancy``."""

    at: str
    totals: Totals
    devices: list[DeviceOccupancy]
    nextPageToken: str | None = None


class UsageRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Device-hours of one group and DeviceClass; ``cost`` when a price is configured.

    The group key is one of ``team``, ``namespace``, ``deviceClass``, ``model``, ``node``, ``cluster`` (the
    others are absent; the group's own key is ``null`` for hours of no model or no node, as in the CLI's JSON);
    ``deviceClass`` and ``driver`` are always there (``null`` for an allocation that named no class);
    ``start``/``end`` are set for a time series (``step``).
    """

    # Fields in the order the CLI's JSON writes them: the group key, then what was counted.
    # UNSET, not None, marks a key that is not the grouping: omitted, where a null group value is written.
    team: str | msgspec.UnsetType | None = msgspec.UNSET
    namespace: str | msgspec.UnsetType | None = msgspec.UNSET
    model: str | msgspec.UnsetType | None = msgspec.UNSET
    node: str | msgspec.UnsetType | None = msgspec.UNSET
    cluster: str | msgspec.UnsetType | None = msgspec.UNSET
    deviceClass: str | None
    driver: str | None
    deviceHours: float
    start: str | None = None
    end: str | None = None
    cost: float | None = None
    currency: str | None = None


class Usage(msgspec.Struct, kw_only=True):
    """``GET /v1/usage``."""

    from_: str = msgspec.field(name="from")  # keys in the CLI's order: the window, the grouping, the rows
    to: str
    groupBy: str
    step: float | None = None
    rows: list[UsageRow]
    nextPageToken: str | None = None


class ClaimDevice(msgspec.Struct, kw_only=True):
    """A device a claim holds at T."""

    driver: str
    pool: str
    device: str
    request: str
    shareID: str | None
    adminAccess: bool
    consumedCapacity: dict[str, Any] = msgspec.field(default_factory=dict)


class Claim(msgspec.Struct, kw_only=True):
    """A ResourceClaim at T."""

    cluster: str
    namespace: str
    name: str
    uid: str
    origin: str
    state: str
    team: str
    requested: dict[str, int]
    devices: list[ClaimDevice]
    consumers: list[str]


class Claims(msgspec.Struct, kw_only=True):
    """``GET /v1/claims``."""

    at: str
    claims: list[Claim]
    nextPageToken: str | None = None


class IdleClaim(msgspec.Struct, kw_only=True):
    """A row of the idle-claim report."""

    cluster: str
    """The ledger cluster the claim was recorded in (``--cluster`` of the replay or watch)."""
    namespace: str
    name: str
    team: str
    category: str
    idleSince: str
    devices: list[str]
    wastedDeviceHours: float


class IdleClaims(msgspec.Struct, kw_only=True):
    """``GET /v1/reports/idle-claims``."""

    at: str
    claims: list[IdleClaim]
    nextPageToken: str | None = None


class LedgerEvent(msgspec.Struct, kw_only=True):
    """One stored event (table ``events``)."""

    globalPosition: int
    cluster: str
    stream: str
    streamPosition: int
    type: str
    occurredAt: str
    recordedAt: str
    payload: dict[str, Any]


class Events(msgspec.Struct, kw_only=True):
    """``GET /v1/events``: the audit log by global position."""

    events: list[LedgerEvent]
    nextPageToken: str | None = None


class ClaimHistory(msgspec.Struct, kw_only=True):
    """``GET /v1/claims/{namespace}/{name}/history``: the events of every claim of that name, in order."""

    namespace: str
    name: str
    uids: list[str]
    events: list[LedgerEvent]
    nextPageToken: str | None = None


class TimelineEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An inventory or allocation interval of one device in one cluster; ``to`` is ``null`` while it lasts."""

    cluster: str
    kind: str
    from_: str = msgspec.field(name="from")
    to: str | None
    namespace: str | None = None
    claim: str | None = None
    team: str | None = None
    shareID: str | None = None
    adminAccess: bool | None = None
    node: str | None = None
    sliceName: str | None = None


class Timeline(msgspec.Struct, kw_only=True):
    """``GET /v1/devices/{driver}/{pool}/{device}/timeline``."""

    driver: str
    pool: str
    device: str
    entries: list[TimelineEntry]
    from_: str = msgspec.field(name="from")
    to: str
    nextPageToken: str | None = None


class Health(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``/healthz`` and ``/readyz``."""

    status: str
    database: str | None = None
    projectionLag: dict[str, int] | None = None
    rebuilding: bool | None = None
    """``/readyz`` with the database reachable: whether a rebuild holds the read models now (reads of them wait, and
    answer 503 with ``Retry-After`` after 5 s, until it commits)."""


class QuotaClaim(msgspec.Struct, kw_only=True):
    """A claim counted in a quota row."""

    namespace: str
    name: str
    used: float
    reasons: list[str]


class QuotaRow(msgspec.Struct, kw_only=True):
    """Kueue-style counted usage of one team for one resource name (``deviceClassMappings``) in one cluster,
    against that cluster's nominal quota (a ``[[quotas]]`` entry naming the cluster, else one naming none)."""

    cluster: str
    team: str
    resourceName: str
    used: float
    nominalQuota: float | None
    overQuota: bool
    reasons: list[str]
    claims: list[QuotaClaim] = msgspec.field(default_factory=list)


class Quotas(msgspec.Struct, kw_only=True):
    """``GET /v1/quotas``."""

    at: str
    rows: list[QuotaRow]
    nextPageToken: str | None = None


class SharedTotals(msgspec.Struct, kw_only=True):
    """Counts of shared devices, partitioned counter sets and multi-consumer claims."""

    sharedDevices: int
    counterSets: int
    sharedClaims: int


class Shared(msgspec.Struct, kw_only=True):
    """``GET /v1/shared``: devices with several allocations, counter sets (partitions), shared claims; every entry
    names its ``cluster`` (an answer over every cluster holds each cluster's entries).

    ``devices[].allocations[].fraction`` is each holder's chargeback share of the device: by
    ``consumedCapacity`` where every allocation states it, else equal.
    """

    at: str
    totals: SharedTotals
    devices: list[dict[str, Any]]
    counterSets: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    nextPageToken: str | None = None


class PendingClass(msgspec.Struct, kw_only=True):
    """Pending demand for one DeviceClass in one cluster against that cluster's devices the class selects that are
    free at T (a claim waits for devices of its own cluster)."""

    cluster: str
    deviceClass: str
    claims: int
    requested: int
    free: int


class Pending(msgspec.Struct, kw_only=True):
    """``GET /v1/pending``."""

    at: str
    classes: list[PendingClass]
    claims: list[dict[str, Any]]
    nextPageToken: str | None = None
