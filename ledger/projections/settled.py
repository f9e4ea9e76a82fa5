"""When the read models last changed, and from which instant on their answers no longer depend on T.

Why: "occupancy now" is the API's hottest question, and its totals aggregate every device in SQL
(about 0.1 s at 61,000 devices; a page of devices alone takes a few ms). The answer for an instant T
depends only on (a) the rows of the read models and (b) which intervals contain T. Rows change only
when a projection's checkpoint moves; and once T is at or after every finite interval bound, every
``[from, to)`` either contains T (open, or ending later) or does not, whatever T is. So for
T >= :attr:`ReadModelVersion.settled_at` the answer is the same body (with its ``at`` restated) until
a checkpoint moves: a cache of pages keyed by the checkpoints is exact, not approximate.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

OCCUPANCY_TABLES = ("device_inventory", "device_allocations", "claim_consumers", "pod_phases", "device_classes")
"""The read models :func:`ledger.projections.queries.occupancy` reads (``device_classes`` for a DeviceClass
filter: a class's selectors at T decide which devices are listed)."""


@dataclass(frozen=True, slots=True)
class ReadModelVersion:
    """The checkpoints the read models are at, and their latest finite interval bound."""

    checkpoints: tuple[tuple[str, int], ...]
    """(projection, global position) for every projection, ordered by name."""
    settled_at: datetime | None
    """Latest finite ``lower``/``upper`` over :data:`OCCUPANCY_TABLES` (``None``: no rows)."""


def read_checkpoints(conn: Connection) -> tuple[tuple[str, int], ...]:
    """Every projection's checkpoint (table ``checkpoints``), ordered by name: one index-only read."""
    rows = conn.execute(text("SELECT projection, position FROM checkpoints ORDER BY projection")).all()
    return tuple((str(r.projection), int(r.position)) for r in rows)


def read_version(conn: Connection) -> ReadModelVersion:
    """The checkpoints and the settled instant, read in one snapshot (REPEATABLE READ is not needed:
    the caller re-reads the checkpoints before trusting a cached answer).

    Cost: one scan of each occupancy table (no index serves ``max(upper(valid))``); paid once per
    checkpoint move, beside the occupancy computation it lets later requests skip.
    """
    bounds = " UNION ALL ".join(
        f"SELECT max(lower(valid)) AS b FROM {t} UNION ALL SELECT max(upper(valid)) FROM {t}" for t in OCCUPANCY_TABLES)
    settled = conn.execute(text(f"SELECT max(b) FROM ({bounds}) AS bounds")).scalar()
    return ReadModelVersion(checkpoints=read_checkpoints(conn), settled_at=settled)
