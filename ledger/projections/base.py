"""What every projection shares: the ``Projection`` port and the interval helpers.

Read models keep history as ``tstzrange`` intervals ``[from, to)``: an open interval (``to`` = NULL,
``upper_inf``) is what holds now. Opening appends a row; closing sets the upper bound, never below
the lower bound, so an event that arrives with an earlier ``occurred_at`` than its interval's start
yields an empty interval instead of an invalid range.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy import Connection, Table, text

from ledger.events import RecordedEvent
from ledger.types import JSONValue

TERMINAL = ("Succeeded", "Failed")
"""Pod phases (``status.phase``) in which a pod no longer uses its claims: its consumer rows are not live."""
TERMINAL_SQL = ", ".join(f"'{phase}'" for phase in TERMINAL)
""":data:`TERMINAL` as an SQL list (``phase NOT IN (...)``)."""


class Projection(Protocol):
    """A read model named for the question it answers; applies events in global position order."""

    name: str
    """Checkpoint name (table ``checkpoints.projection``)."""
    tables: Sequence[Table]
    """Tables this projection owns (emptied by a rebuild)."""

    def apply_event(self, conn: Connection, event: RecordedEvent) -> None:
        """Apply one event inside the caller's transaction.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database refused a write; the runner rolls back the
                batch and its checkpoint, so the event is applied again on the next run.
        """


def open_interval(conn: Connection, table: Table, values: Mapping[str, object], start: datetime) -> None:
    """Insert a row of ``table`` whose ``valid`` is ``[start, ∞)``."""
    cols = ", ".join(values)
    params = ", ".join(f":{c}" for c in values)
    conn.execute(
        text(f"INSERT INTO {table.name} ({cols}, valid) VALUES ({params}, tstzrange(:_start, NULL, '[)'))"),
        {**values, "_start": start},
    )


def close_intervals(conn: Connection, table: Table, where: Mapping[str, object], end: datetime,
                    *, extra: str = "") -> None:
    """Close the open intervals of ``table`` matching ``where`` (column = value, ANDed) at ``end``."""
    cond = " AND ".join(f"{c} = :{c}" for c in where)
    conn.execute(
        text(f"UPDATE {table.name} SET valid = tstzrange(lower(valid), greatest(lower(valid), :_end), '[)') "
             f"WHERE {cond} AND upper_inf(valid) AND NOT isempty(valid) {extra}"),
        {**where, "_end": end},
    )


def str_of(payload: Mapping[str, JSONValue], key: str) -> str:
    """Return ``payload[key]`` as a string (payloads are written by the translator, so this holds)."""
    value = payload[key]
    assert isinstance(value, str), f"payload field {key!r} is not a string"
    return value


def opt_str_of(payload: Mapping[str, JSONValue], key: str) -> str | None:
    """Return ``payload[key]`` as a string or ``None``."""
    value = payload.get(key)
    return value if isinstance(value, str) else None


def request_count(spec: Mapping[str, JSONValue]) -> int:
    """Devices an ``ExactCount`` request (``exactly`` or a ``firstAvailable`` entry of
    ``ClaimCreated.requests[]``) asks for: its ``count``, 1 when absent.

    The translator refuses a ``count`` that is not an integer from 1 up; a ledger recorded before it did
    may still hold one, which counts as 1 in every view (quotas, pending demand, a claim's ``requested``).
    """
    count = spec.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 1


def cluster_filter(cluster: str | None, alias: str = "") -> str:
    """SQL ``AND [alias.]cluster = :cluster`` when ``cluster`` is given, else an empty string."""
    prefix = f"{alias}." if alias else ""
    return f" AND {prefix}cluster = :cluster" if cluster is not None else ""


def key_arrays(keys: Sequence[tuple[str, ...]]) -> dict[str, list[str]]:
    """``keys`` as one array a column, the bound parameters ``k0``, ``k1``, ... of an ``unnest`` (empty for no keys)."""
    return {f"k{i}": [k[i] for k in keys] for i in range(len(keys[0]))} if keys else {}


def json_value(value: object) -> JSONValue:
    """A ``jsonb`` column value as JSON (psycopg returns it decoded; a text column holds JSON text)."""
    if isinstance(value, str):
        loaded: JSONValue = json.loads(value)
        return loaded
    assert value is None or isinstance(value, dict | list | int | float | bool)
    return value


def earliest_by_cluster(events: Iterable[RecordedEvent]) -> dict[str, datetime]:
    """The earliest ``occurred_at`` per cluster among ``events``: from there on, they may change read models."""
    earliest: dict[str, datetime] = {}
    for event in events:
        first = earliest.get(event.cluster)
        if first is None or event.occurred_at < first:
            earliest[event.cluster] = event.occurred_at
    return earliest


def clusters(conn: Connection) -> list[str]:
    """Every cluster the ledger holds events of, sorted (table ``events``).

    A skip scan of the ``events_type_idx`` B-tree (leading column ``cluster``): one index probe per
    cluster, where ``SELECT DISTINCT`` read every event (seconds on a 10 M-event ledger, and the snapshot
    job asks every few minutes).
    """
    return [str(c) for c in conn.execute(text(
        "WITH RECURSIVE c(cluster) AS (SELECT min(cluster) FROM events "
        " UNION ALL SELECT (SELECT min(e.cluster) FROM events e WHERE e.cluster > c.cluster) FROM c "
        " WHERE c.cluster IS NOT NULL) "
        "SELECT cluster FROM c WHERE cluster IS NOT NULL ORDER BY cluster")).scalars()]
