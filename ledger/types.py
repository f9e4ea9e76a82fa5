"""Identifiers and keys shared by the whole ledger.

Ids are ``NewType`` wrappers so that a claim uid can never be passed where a stream id is expected.
A device is identified by ``(driver, pool, device)`` and never by the name of the ResourceSlice that
published it: slices are renamed when a driver republishes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType, TypeAlias

ClaimUID = NewType("ClaimUID", str)
"""``ResourceClaim.metadata.uid`` (or ``name:<namespace>/<name>`` for trimmed objects without uid)."""
ShareID = NewType("ShareID", str)
"""``ResourceClaim.status.allocation.devices.results[].shareID`` of a consumable-capacity device."""
StreamId = NewType("StreamId", str)
"""One stream per aggregate, e.g. ``claim:<uid>`` or ``device:<driver>/<pool>/<device>``."""
StreamPosition = NewType("StreamPosition", int)
"""1-based position of an event inside its stream; 0 means "the stream is empty"."""
GlobalPosition = NewType("GlobalPosition", int)
"""Store-wide, commit-ordered position of an event (table ``events``); 0 means "before the first"."""
MAX_GLOBAL_POSITION = 2**63 - 1
"""The largest global position there can be: 9223372036854775807, the largest PostgreSQL ``bigint`` (the type
of ``events.global_position``). A reader asking for events after it is answered, with none."""
Quantity = NewType("Quantity", str)
"""A Kubernetes resource quantity kept as its canonical string ("80Gi", "100", "500m")."""

JSONScalar: TypeAlias = str | int | float | bool | None
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = dict[str, JSONValue]


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class DeviceKey:
    """Identity of a device: ``ResourceSlice.spec.driver``, ``spec.pool.name``, ``spec.devices[].name``."""

    driver: str
    pool: str
    device: str

    def stream(self) -> StreamId:
        """Return the stream id ``device:<driver>/<pool>/<device>`` of this device."""
        return StreamId(f"device:{self.driver}/{self.pool}/{self.device}")

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class AllocationKey:
    """Identity of one allocation of a device: the device plus the optional ``shareID``."""

    device: DeviceKey
    share_id: ShareID | None
