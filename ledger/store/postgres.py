"""PostgreSQL adapter of the event store (SQLAlchemy 2 Core on psycopg 3).

Appends are serialised by a transaction-level advisory lock (:data:`APPEND_LOCK_KEY`) that every
append takes before it writes and holds until commit: commit order equals global position order, so a
reader that reads ``global_position > X`` never skips an event that commits later with a smaller
position. Readers take no lock. An advisory lock (rather than ``LOCK TABLE events``, which needs UPDATE
on ``events`` before PostgreSQL 17) lets the runtime role's grants keep the history insert-only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TypeAlias

import msgspec
import psycopg
from psycopg.adapt import Buffer, Dumper
from psycopg.pq import Format
from sqlalchemy import Connection, Engine, RowMapping, create_engine, text
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError

from ledger.errors import Invalid, StreamConflict
from ledger.events import SCHEMA_VERSION, NewEvent, RecordedEvent
from ledger.store.cancel import watch_engine
from ledger.translator.translate import TranslatorState
from ledger.types import GlobalPosition, StreamId, StreamPosition

_JSONB_DECODER = msgspec.json.Decoder()


def decode_jsonb(data: bytes) -> object:
    """Decode the text of one ``json`` / ``jsonb`` column value, as psycopg hands it to its JSON loader.

    msgspec rather than the standard library's ``json.loads``, which psycopg uses by default: reads that
    return many ``jsonb`` values (``/v1/pending`` decodes the attributes and capacity of every device
    published at T, ``claims.requests`` and ``device_allocations.consumed_capacity``) spent about a fifth
    of their time in ``json.loads``. The two agree on every document PostgreSQL writes (integers of any
    size, floats, strings, nesting). ``jsonb`` keeps numbers as exact numerics and writes them out in
    positional notation: an integer of any size (``1e400`` is 401 digits) decodes exactly, but a fraction
    beyond the range of a float (``1e400 + 0.5``) makes msgspec refuse the whole document; the standard
    library then decodes it (the number as ``inf``), as it did before.

    Args:
        data: UTF-8 JSON text (``bytes``; psycopg has already dropped the ``jsonb`` binary format's
            version byte).

    Returns:
        The decoded value: dict, list, str, int, float, bool or None.

    Raises:
        json.JSONDecodeError: ``data`` is not JSON (PostgreSQL never sends that for these types).
    """
    try:
        return _JSONB_DECODER.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


SESSION_NAME: ContextVar[str] = ContextVar("SESSION_NAME", default="dra-ledger")
"""The ``application_name`` the sessions of an engine made by :func:`make_engine` carry (``pg_stat_activity``,
the server log's ``%a``), read when the engine is made: ``dra-ledger`` unless set, and ``dra-ledger <command>``
for a command line (``ledger.cli_typer.LedgerCommand``), so that an operator can tell a rebuild's session from the
API's and the watch workers'. Sent as libpq's ``fallback_application_name``: an ``application_name`` in the URL
or the ``PGAPPNAME`` environment variable wins. The server keeps the first 63 bytes."""


def make_engine(url: str, *, session_name: str | None = None) -> Engine:
    """Create an engine for ``url``; ``postgresql://`` URLs are switched to the psycopg 3 driver.

    ``json`` and ``jsonb`` columns are decoded by :func:`decode_jsonb`; sessions are named ``session_name``, by
    default :data:`SESSION_NAME` (a worker process of ``serve`` is handed its command's name). Work run in a
    thread under :meth:`ledger.store.cancel.StatementCancel.run` can be stopped from its caller's thread.

    Raises:
        Invalid: ``url`` is not a PostgreSQL URL (the ledger needs PostgreSQL: tstzrange, GiST, jsonb).
    """
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme in ("postgresql", "postgres"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    elif scheme != "postgresql+psycopg":
        raise Invalid(f"the database URL must be postgresql://user@host:port/database, got {scheme or url!r}"
                      " (the ledger needs PostgreSQL)")
    try:
        engine = create_engine(url, pool_pre_ping=True, json_deserializer=decode_jsonb,
                               connect_args={"fallback_application_name": session_name or SESSION_NAME.get()})
    except ArgumentError as e:
        raise Invalid(f"the database URL cannot be parsed: {e}") from e
    watch_engine(engine)  # work in a thread can be stopped from its caller's (ledger.store.cancel)
    return engine


def constraint_of(error: IntegrityError) -> str | None:
    """Return the name of the constraint a psycopg ``IntegrityError`` violated (``diag.constraint_name``)."""
    diag = getattr(error.orig, "diag", None)
    name = getattr(diag, "constraint_name", None)
    return name if isinstance(name, str) else None


APPEND_LOCK_KEY = 0x4C45444745520002
"""Advisory lock key every append holds until commit ("LEDGER" + 2); see the module docstring."""


def lock_appends(conn: Connection) -> None:
    """Take the append lock for the current transaction (see the module docstring for why).

    Invariant protected: no two transactions that insert into ``events`` are open at once, so identity
    values (global positions) become visible in the order they were drawn.
    """
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": APPEND_LOCK_KEY})


class ObservationRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of table ``observations``: a watch event as received, recorded or rejected."""

    digest: str
    status: str
    kind: str | None
    api_version: str | None
    namespace: str | None
    name: str | None
    uid: str | None
    resource_version: str | None
    watch_type: str | None
    observed_at: object
    recorded_at: object
    origin: str
    error: str | None
    body: bytes
    """Column ``body`` as encoded JSON text (UTF-8): the object as received (``WatchLine.object_json``), or for
    a rejected line its text as a JSON string."""


ObservationKey: TypeAlias = tuple[datetime | None, str]
"""An observation's key beside its cluster: (receive time ``observed_at`` or ``None``, ``digest``)."""


def known_digests(conn: Connection, cluster: str, keys: Sequence[ObservationKey]) -> dict[str, str | None]:
    """Return which observations of ``keys`` are already in ``observations`` for ``cluster``: their digests,
    each with its stored ``error`` (the rejection reason; ``None`` for a recorded observation).

    Looked up on ``observations_cluster_observed_at_digest_key`` by receive time and digest, so that a batch
    of lines received close together reads the last pages of the index only (see migration 0006). A key
    without a receive time is looked up by digest among the rows without one (the key's ``NULLS NOT
    DISTINCT``).

    Keys received after the cluster's newest stored observation are not looked up at all: a stored row matches a
    key only at the key's own receive time, so none can match them. One ``max(observed_at)`` (the same index,
    read backwards from its end) tells; a replay of a new file and a live watch always pass it. Why: the
    lookup of a 5,000-line batch (5,000 times parsed from text and probed) kept the ingest's translating
    thread waiting ~45 ms a batch, a tenth of its wall time, and cost the server as much CPU.
    """
    timed = [(t, d) for t, d in keys if t is not None]
    untimed = [d for t, d in keys if t is None]
    params: dict[str, object] = {"c": cluster}
    if timed:
        newest = conn.execute(text("SELECT max(observed_at) FROM observations WHERE cluster = :c"),
                              {"c": cluster}).scalar_one()
        if newest is None or min(t for t, _ in timed) > newest:
            timed = []
    parts = []
    # One comma-joined text the server splits: psycopg dumps a list parameter element by element in Python,
    # which was 5 % of a file replay's samples for 5,000 digests a batch. The list form for digests the join
    # cannot carry (never the hex digests of ledger.recorded; kept correct anyway): a comma would split one,
    # and a lone empty one joins to '', which string_to_array splits into no element at all.
    joinable = all(d and "," not in d for _, d in keys)
    if timed:
        # ISO 8601 times hold no comma; the join works for them always.
        params["t"] = ",".join(t.isoformat() for t, _ in timed)
        digests = "string_to_array(:d, ',')" if joinable else "CAST(:d AS text[])"
        params["d"] = ",".join(d for _, d in timed) if joinable else [d for _, d in timed]
        parts.append("SELECT o.digest, o.error FROM observations o JOIN "
                     f"unnest(CAST(string_to_array(:t, ',') AS timestamptz[]), {digests}) AS k(observed_at, digest) "
                     "ON o.observed_at = k.observed_at AND o.digest = k.digest WHERE o.cluster = :c")
    if untimed:
        digests = "string_to_array(:u, ',')" if joinable else "CAST(:u AS text[])"
        params["u"] = ",".join(untimed) if joinable else untimed
        parts.append(f"SELECT digest, error FROM observations WHERE cluster = :c AND observed_at IS NULL "
                     f"AND digest = ANY({digests})")
    if not parts:
        return {}
    rows = conn.execute(text(" UNION ALL ".join(parts)), params).all()
    return {str(r.digest): None if r.error is None else str(r.error) for r in rows}


@contextmanager
def _driver_errors(raw: psycopg.Connection, statement: str) -> Iterator[None]:
    """Raise the block's psycopg errors wrapped as SQLAlchemy wraps every other statement's.

    Callers keep deciding by the same exception types (IntegrityError, OperationalError, ...) for the
    statements this module runs on the driver's connection directly.
    """
    try:
        yield
    except psycopg.Error as e:
        raise DBAPIError.instance(statement, None, e, psycopg.Error, connection_invalidated=raw.closed) from e


def _driver(conn: Connection) -> psycopg.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


def stream_rows(conn: Connection, query: str, params: Sequence[object], *,
                size: int) -> Iterator[list[tuple[object, ...]]]:
    """Rows of ``query`` (psycopg placeholders ``%s``) in batches of at most ``size``, from a server-side cursor.

    A server-side cursor keeps the result on the server and fetches ``size`` rows a round trip, so a
    caller walking the whole history holds one batch at a time. Needs a transaction (``conn`` in one).

    Raises:
        sqlalchemy.exc.DBAPIError: the query or a fetch failed.
    """
    raw = _driver(conn)
    with _driver_errors(raw, query), raw.cursor(name="ledger_stream") as cur:
        cur.execute(query, params)
        while batch := cur.fetchmany(size):
            yield batch


def copy_rows(conn: Connection, table: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """``COPY table (columns) FROM STDIN`` in the caller's transaction (psycopg 3, text format).

    Why COPY: one ``INSERT`` per row (even pipelined ``executemany``) costs a parse/bind/execute per
    row on the server; COPY streams the rows in one statement, several times faster for batches.

    Raises:
        sqlalchemy.exc.DBAPIError: the server refused a row (its subclass says why).
    """
    raw = _driver(conn)
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    with _driver_errors(raw, statement), raw.cursor() as cur, cur.copy(statement) as copy:
        for row in rows:
            copy.write_row(row)


class _EncodedJsonbDumper(Dumper):
    """A ``jsonb`` value in ``COPY``'s binary format from JSON text the caller encoded already (UTF-8 bytes).

    Why: psycopg's own ``jsonb`` dumpers take Python values and encode them again; the append path encodes
    each JSON column once, with msgspec (:func:`json_bytes`), and this hands that text over as it is. The
    binary input form of ``jsonb`` is a version byte (1) followed by the JSON text, which the server parses
    as it parses the text form. Registered by oid only (``register_dumper(None, ...)``): it serves the
    ``jsonb`` columns of :func:`copy_binary_rows` and nothing else.
    """

    format = Format.BINARY
    oid = psycopg.postgres.types["jsonb"].oid

    def dump(self, obj: object) -> Buffer:
        """``obj`` (``bytes``: UTF-8 JSON text) as binary ``jsonb``."""
        assert isinstance(obj, bytes), "jsonb columns of a binary COPY take encoded JSON (bytes)"
        return b"\x01" + obj


class _EncodedJsonDumper(Dumper):
    """A ``json`` value in ``COPY``'s binary format from JSON text the caller encoded already (UTF-8 bytes): the
    binary input form of ``json`` is the text itself. Registered by oid only, as :class:`_EncodedJsonbDumper`."""

    format = Format.BINARY
    oid = psycopg.postgres.types["json"].oid

    def dump(self, obj: object) -> Buffer:
        """``obj`` (``bytes``: UTF-8 JSON text) as binary ``json``."""
        assert isinstance(obj, bytes), "json columns of a binary COPY take encoded JSON (bytes)"
        return obj


def copy_binary_rows(conn: Connection, table: str, columns: Sequence[tuple[str, str]],
                     rows: Iterable[Sequence[object]]) -> None:
    """``COPY table (columns) FROM STDIN (FORMAT BINARY)`` in the caller's transaction.

    Args:
        conn: a connection in a transaction.
        table: the table written.
        columns: (column, PostgreSQL type name) pairs, in row order; the types must be the columns' own
            (binary COPY applies no cast).
        rows: tuples in ``columns`` order. ``json`` and ``jsonb`` values are JSON text already encoded (``bytes``,
            see :func:`json_bytes`); every other value is the Python value of its type (``str``, ``int``, aware
            ``datetime``, ``uuid.UUID``) or ``None``.

    Why binary: the text format makes psycopg escape every string byte by byte and the server parse every
    time, uuid and integer back from text; the binary format sends strings as they are and the others in
    their stored form. With the body encoded once (``WatchLine.object_json``) it took ~12 % off an ingest's
    Python CPU a watch event and ~10 % off the server's (``bench/results-ingest-binary.json``).

    Raises:
        sqlalchemy.exc.DBAPIError: the server refused a row (its subclass says why).
    """
    raw = _driver(conn)
    statement = f"COPY {table} ({', '.join(name for name, _ in columns)}) FROM STDIN (FORMAT BINARY)"
    with _driver_errors(raw, statement), raw.cursor() as cur:
        cur.adapters.register_dumper(None, _EncodedJsonbDumper)
        cur.adapters.register_dumper(None, _EncodedJsonDumper)
        with cur.copy(statement) as copy:
            copy.set_types([kind for _, kind in columns])
            for row in rows:
                copy.write_row(row)


def copy_out(conn: Connection, query: str, write: Callable[[bytes], object]) -> None:
    """``COPY (query) TO STDOUT``: the query's rows as ``COPY`` text, handed to ``write`` in blocks.

    An exception raised by ``write`` cancels the query and propagates.

    Raises:
        sqlalchemy.exc.DBAPIError: the query failed.
    """
    raw = _driver(conn)
    statement = f"COPY ({query}) TO STDOUT"
    with _driver_errors(raw, statement), raw.cursor() as cur, cur.copy(statement) as copy:
        for block in copy:
            write(bytes(block))


def copy_in(conn: Connection, table: str, columns: Sequence[str], data: IO[bytes], *, block: int = 1 << 20) -> None:
    """``COPY table (columns) FROM STDIN`` of ``COPY`` text read from ``data`` (from its current offset).

    The text is what :func:`copy_out` wrote for the same columns; rows are not parsed on this side.

    Raises:
        sqlalchemy.exc.DBAPIError: the server refused a row.
    """
    raw = _driver(conn)
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    with _driver_errors(raw, statement), raw.cursor() as cur, cur.copy(statement) as copy:
        while chunk := data.read(block):
            copy.write(chunk)


@dataclass(frozen=True, slots=True, kw_only=True)
class Analyzed:
    """What :func:`analyze_tables` did: the tables it analyzed, those the role may not analyze, those that failed."""

    analyzed: tuple[str, ...]
    skipped: tuple[str, ...]
    """Tables neither owned by the role (or by the database it owns) nor, from PostgreSQL 17, granted it MAINTAIN:
    the server would only warn and skip them, so they are not asked; autovacuum analyzes them in time."""
    failed: tuple[tuple[str, str], ...] = ()
    """(table, the first line of what the server said) of each ANALYZE refused: a lock not granted within
    :data:`ANALYZE_LOCK_TIMEOUT`, a statement timeout. The tables after it were still analyzed."""
    unavailable: str | None = None
    """Why no table was analyzed, when the database could not be reached or used (then the other fields are
    empty); ``None`` otherwise."""


ANALYZE_LOCK_TIMEOUT = "10s"
"""How long an ANALYZE waits for its table's lock before that table is given up (``lock_timeout``).

Why: a manual VACUUM, ANALYZE or CREATE INDEX CONCURRENTLY holds the same lock for as long as it runs; without a
bound, a replay whose rows were all committed waited for it with nothing said."""


def first_line(error: BaseException) -> str:
    """The first line of what the database said (psycopg's message: ``error.orig`` of a SQLAlchemy error, or
    ``error`` itself), else the error's type name."""
    orig = getattr(error, "orig", None)
    message = str(orig if orig is not None else error).strip()
    return message.splitlines()[0] if message else type(error).__name__


def analyze_tables(engine: Engine, tables: Sequence[str]) -> Analyzed:
    """Run ``ANALYZE`` on each of ``tables`` (names in the search path) the connecting role may analyze, so the
    planner has statistics of their rows now rather than after autovacuum's next pass.

    One table at a time, each committed on its own (autocommit): the lock ANALYZE takes on a table
    (SHARE UPDATE EXCLUSIVE, which blocks no read nor write) is held for that table only. A table whose ANALYZE
    is refused (its lock not granted within :data:`ANALYZE_LOCK_TIMEOUT`, say) is listed in ``failed`` and the
    others are still analyzed.

    Raises:
        sqlalchemy.exc.DBAPIError: the connection was lost, or could not be made.
    """
    quote = engine.dialect.identifier_preparer.quote
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        allowed = {r.name: r.may for r in conn.execute(text(
            "SELECT t.name, pg_has_role(c.relowner, 'USAGE') "
            " OR pg_has_role((SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE') "
            " OR CASE WHEN current_setting('server_version_num')::int >= 170000 "
            "   THEN has_table_privilege(c.oid, 'MAINTAIN') ELSE false END AS may "
            "FROM unnest(CAST(:names AS text[])) AS t(name) JOIN pg_class c ON c.oid = to_regclass(t.name)"),
            {"names": list(tables)})}
        analyzed: list[str] = []
        failed: list[tuple[str, str]] = []
        conn.execute(text(f"SET lock_timeout = '{ANALYZE_LOCK_TIMEOUT}'"))
        try:
            for table in (t for t in tables if allowed.get(t)):
                try:
                    conn.execute(text(f"ANALYZE {quote(table)}"))
                    analyzed.append(table)
                except DBAPIError as e:
                    if e.connection_invalidated:
                        raise
                    failed.append((table, first_line(e)))
        finally:
            if not conn.invalidated:
                conn.execute(text("RESET lock_timeout"))  # the pooled connection goes back as it came
    return Analyzed(analyzed=tuple(analyzed), skipped=tuple(t for t in tables if not allowed.get(t)),
                    failed=tuple(failed))


def count_cluster_observations(conn: Connection, cluster: str) -> int:
    """Rows of table ``observations`` (recorded and rejected lines) of ``cluster``; >= 0."""
    return int(conn.execute(text("SELECT count(*) FROM observations WHERE cluster = :c"), {"c": cluster}).scalar_one())


_OBSERVATION_COLUMNS = (("cluster", "text"), ("digest", "text"), ("status", "text"), ("kind", "text"),
                        ("api_version", "text"), ("namespace", "text"), ("name", "text"), ("uid", "text"),
                        ("resource_version", "text"), ("watch_type", "text"), ("observed_at", "timestamptz"),
                        ("recorded_at", "timestamptz"), ("origin", "text"), ("error", "text"), ("body", "json"))


def insert_observations(conn: Connection, cluster: str, rows: Sequence[ObservationRow]) -> None:
    """Insert observations (COPY); the caller has skipped digests already stored.

    Idempotence: the caller holds the append lock and filtered ``rows`` through :func:`known_digests`
    in the same transaction, so no stored digest can reach the COPY (one writer per cluster); should
    one anyway, ``observations_cluster_observed_at_digest_key`` refuses it and the batch rolls back, never a
    silent duplicate.
    """
    if not rows:
        return
    copy_binary_rows(conn, "observations", _OBSERVATION_COLUMNS,
                     ((cluster, r.digest, r.status, r.kind, r.api_version, r.namespace, r.name, r.uid,
                       r.resource_version, r.watch_type, r.observed_at, r.recorded_at, r.origin, r.error, r.body)
                      for r in rows))


_NEW_EVENT_COLUMNS = (("event_id", "uuid"), ("cluster", "text"), ("stream", "text"), ("stream_position", "int4"),
                      ("type", "text"), ("occurred_at", "timestamptz"), ("recorded_at", "timestamptz"),
                      ("schema_version", "int4"), ("payload", "jsonb"), ("source", "json"))


def insert_events(conn: Connection, cluster: str, events: Sequence[NewEvent]) -> None:
    """Insert translated events with COPY (caller holds the append lock).

    Global positions follow the COPY's row order (identity column), which is the order of ``events``.

    Raises:
        StreamConflict: a (stream, stream position) is taken: another writer appended to the stream.
    """
    if not events:
        return
    try:
        copy_binary_rows(conn, "events", _NEW_EVENT_COLUMNS, _event_rows(cluster, events))
    except IntegrityError as e:
        if constraint_of(e) != "events_stream_position_key":
            raise
        first = events[0]
        raise StreamConflict(stream=first.stream, expected=first.stream_position - 1) from e


def _event_rows(cluster: str, events: Sequence[NewEvent]) -> Iterator[tuple[object, ...]]:
    """The ``events`` rows of ``events`` in :data:`_NEW_EVENT_COLUMNS` order (JSON columns encoded).

    The events of one observation share one :class:`EventSource`: its JSON is encoded once for all of them.
    """
    source: object = None
    source_json = b""
    for e in events:
        if e.source is not source:
            source, source_json = e.source, json_bytes(e.source)
        yield (e.event_id, cluster, e.stream, e.stream_position, e.event.TYPE, e.occurred_at, e.recorded_at,
               SCHEMA_VERSION, json_bytes(e.event), source_json)


EVICTED_PREFIXES = ("claim:", "pod:")
"""State keys whose deleted entries (tombstones) stay in the database only.

Why: a deleted claim or pod keeps a tombstone so that a late or repeated event for its uid is ignored,
and there is one per claim and pod ever seen. Held in memory they grew without bound: a worker starting
on a ledger of 10 M events (911,620 claims, 1,039,972 pods) loaded 1.97 M entries, 1.82 M of them
tombstones, into 2.2 GB. They are loaded when a line needs them (:func:`load_entries`) and dropped again
once written."""


def load_state(conn: Connection, cluster: str) -> TranslatorState:
    """Load the translator's memory for ``cluster`` from ``translator_state``, without the tombstones of
    claims and pods (see :data:`EVICTED_PREFIXES`; :func:`load_entries` fetches one when a line needs it).

    Rows are streamed :data:`LOAD_ROWS` at a time and kept as JSON text (``StateEntries.load_json``):
    neither the whole result nor the entries as objects are ever held at once. ``TranslatorState.appends`` is the
    cluster's append count (table ``cluster_appends``), read before the rows.
    """
    # The count first: outside the append lock each statement sees the commits before it, so rows read after the
    # count hold at least what it counts. Read the other way round, a commit between the two would be counted
    # without its rows, and no append would ever find this state out of date.
    appends = read_appends(conn, cluster)
    result = conn.execute(
        text("SELECT key, state::text AS state FROM translator_state WHERE cluster = :c "
             "AND NOT (key LIKE ANY(:evicted) AND state ? 'deleted')"),
        {"c": cluster, "evicted": [f"{prefix}%" for prefix in EVICTED_PREFIXES]},
        execution_options={"yield_per": LOAD_ROWS})  # this statement only, not the caller's connection
    state = TranslatorState(appends=appends)
    for key, body in result:
        state.entries.load_json(str(key), str(body))
    return state


def read_appends(conn: Connection, cluster: str) -> int:
    """The count of append transactions committed for ``cluster`` (table ``cluster_appends``); 0 for none."""
    stored = conn.execute(text("SELECT appends FROM cluster_appends WHERE cluster = :c"), {"c": cluster}).scalar()
    return int(stored or 0)


def count_append(conn: Connection, cluster: str) -> int:
    """Count one more append transaction of ``cluster`` that changes ``translator_state`` (:func:`save_state_rows`),
    in the caller's transaction, which holds the append lock; returns the new count (>= 1)."""
    return int(conn.execute(text(
        "INSERT INTO cluster_appends (cluster, appends) VALUES (:c, 1) ON CONFLICT ON CONSTRAINT cluster_appends_pkey "
        "DO UPDATE SET appends = cluster_appends.appends + 1 RETURNING appends"), {"c": cluster}).scalar_one())


LOAD_ROWS = 2000
"""Rows of ``translator_state`` fetched per round trip by :func:`load_state` (a server-side cursor).

Why: fetched at once, the 145,182 rows of the 10 M-event ledger (61,000 devices) raised a fresh
process's RSS by 151 MiB against 65 MiB streamed: the result's text stayed with the C allocator after
it was freed. 2,000 rows (~1 MB of text) a fetch cost 73 round trips at start."""


def load_entries(conn: Connection, cluster: str, keys: Sequence[str]) -> dict[str, str]:
    """Return the stored translator state entries of ``keys`` (those that exist) for ``cluster``, as JSON
    text: what ``StateEntries.load_json`` keeps (decoding them into objects only to encode them again
    cost a round trip per entry)."""
    if not keys:
        return {}
    rows = conn.execute(text("SELECT key, state::text AS state FROM translator_state WHERE cluster = :c "
                             "AND key = ANY(:k)"), {"c": cluster, "k": list(keys)}).all()
    return {str(r.key): str(r.state) for r in rows}


@dataclass(frozen=True, slots=True)
class StateRows:
    """Translator state entries to write: ``upserts`` maps a state key to its entry as JSON text, ``deletes``
    lists keys whose entry is gone. A snapshot taken with :func:`dirty_rows`, so the translator may go on
    changing its memory while the rows are written (a pipelined ingest)."""

    upserts: dict[str, str]
    deletes: list[str]

    @property
    def changes(self) -> bool:
        """Whether the rows change ``translator_state`` at all (only such an append is counted in
        ``cluster_appends``: one that changes nothing there cannot leave another writer's state behind)."""
        return bool(self.upserts or self.deletes)


def dirty_rows(state: TranslatorState) -> StateRows:
    """Snapshot the keys in ``state.dirty`` as rows to write, and clear ``dirty``."""
    upserts = {k: _entry_json(state, k) for k in state.dirty if k in state.entries}
    deletes = [k for k in state.dirty if k not in state.entries]
    state.dirty.clear()
    return StateRows(upserts=upserts, deletes=deletes)


def save_state(conn: Connection, cluster: str, state: TranslatorState) -> None:
    """Persist the keys in ``state.dirty`` (upsert, or delete when gone), clear ``dirty`` and move
    ``state.appends`` to the cluster's count after this write (:func:`save_state_rows`)."""
    state.appends = save_state_rows(conn, cluster, dirty_rows(state), appends=state.appends)


def save_state_rows(conn: Connection, cluster: str, rows: StateRows, *, appends: int) -> int:
    """Upsert ``rows.upserts`` into ``translator_state`` and delete ``rows.deletes``, in the caller's transaction,
    which holds the append lock; when they change anything, count the append in ``cluster_appends``.

    The only writer of ``translator_state``, so the one place that counts its changes: an append that changes
    nothing there (a bookmark's checkpoint, lines already recorded) cannot leave another writer's state behind, and
    counted it made that writer load its whole state again for nothing.

    Args:
        appends: the cluster's count as read under this lock (:func:`read_appends`).

    Returns:
        The count after this write: ``appends + 1`` when the rows change anything, else ``appends``.
    """
    # One statement per JSON document {key: entry} (one for most batches; see STATE_DOCUMENT_CHARS): the
    # entries are JSON text already, so a document is a join of strings, and the server parses it once. Passing
    # them as text[]/jsonb[] arrays instead cost the client an array-literal escape of every entry (7 % of an
    # ingest's samples).
    for document in _state_documents(rows.upserts):
        conn.execute(text("INSERT INTO translator_state (cluster, key, state) "
                          "SELECT :c, e.key, e.value FROM jsonb_each(CAST(:doc AS jsonb)) AS e "
                          "ON CONFLICT ON CONSTRAINT translator_state_pkey DO UPDATE SET state = excluded.state"),
                     {"c": cluster, "doc": document})
    if rows.deletes:
        conn.execute(text("DELETE FROM translator_state WHERE cluster = :c AND key = ANY(:k)"),
                     {"c": cluster, "k": rows.deletes})
    return count_append(conn, cluster) if rows.changes else appends


STATE_DOCUMENT_CHARS = 16 * 2**20
"""Most characters of one JSON document of :func:`save_state_rows` (an entry longer than this goes alone).

Why: the document is one ``jsonb`` value, and ``jsonb`` refuses one whose elements total more than
268,435,455 bytes (``ProgramLimitExceeded``). A pool entry takes ~850 bytes per device, so a batch of 5,000
pools of 64 devices or more (the first slice List of a large cluster) was past it, and no retry helped.
16 Mi characters stay below it however the text grows as ``jsonb`` (UTF-8, numbers stored as numeric)."""


def _state_documents(upserts: dict[str, str]) -> Iterator[str]:
    """Yield ``upserts`` as JSON documents ``{key: entry}`` of at most :data:`STATE_DOCUMENT_CHARS` characters."""
    members: list[str] = []
    size = 0
    for key, entry in upserts.items():
        member = f"{json.dumps(key)}:{entry}"
        if members and size + len(member) > STATE_DOCUMENT_CHARS:
            yield "{" + ",".join(members) + "}"
            members, size = [], 0
        members.append(member)
        size += len(member) + 1
    if members:
        yield "{" + ",".join(members) + "}"


def _entry_json(state: TranslatorState, key: str) -> str:
    stored = state.entries.packed_json(key)
    return stored if stored is not None else as_json(state.entries[key])


def _recorded(row: RowMapping) -> RecordedEvent:
    payload = row["payload"]
    source = row["source"]
    assert isinstance(payload, dict) and isinstance(source, dict)
    return RecordedEvent(
        global_position=GlobalPosition(int(str(row["global_position"]))), cluster=str(row["cluster"]),
        stream=StreamId(str(row["stream"])), stream_position=StreamPosition(int(str(row["stream_position"]))),
        type=str(row["type"]), occurred_at=row["occurred_at"], recorded_at=row["recorded_at"],
        payload=payload, source=source)


_EVENT_COLUMNS = ("global_position, cluster, stream, stream_position, type, occurred_at, recorded_at, payload, "
                  "source")


def read_all(conn: Connection, *, after: GlobalPosition, limit: int, types: Iterable[str] | None = None,
             stream: str | None = None, cluster: str | None = None, with_source: bool = True) -> list[RecordedEvent]:
    """Read events with ``global_position > after`` in position order, at most ``limit``.

    Args:
        after: exclusive lower bound (0 = from the first event).
        limit: maximum number of events returned (> 0).
        types: only these event types, when given.
        stream: only this stream, when given.
        cluster: only this cluster's events, when given.
        with_source: ``False`` gives every event an empty ``source`` (projections never read it, and
            decoding it was a fifth of a rebuild's time).
    """
    where = ["global_position > :after"]
    params: dict[str, object] = {"after": after, "limit": limit}
    if types is not None:
        where.append("type = ANY(:types)")
        params["types"] = list(types)
    if stream is not None:
        where.append("stream = :stream")
        params["stream"] = stream
    if cluster is not None:
        where.append("cluster = :cluster")
        params["cluster"] = cluster
    columns = _EVENT_COLUMNS if with_source else _EVENT_COLUMNS.replace(", source", ", '{}'::json AS source")
    rows = conn.execute(text(f"SELECT {columns} FROM events WHERE {' AND '.join(where)} "
                             "ORDER BY global_position LIMIT :limit"), params).mappings().all()
    return [_recorded(r) for r in rows]


def read_stream(conn: Connection, *, cluster: str, stream: str) -> list[RecordedEvent]:
    """Read one stream in stream position order (1-based positions)."""
    rows = conn.execute(text(f"SELECT {_EVENT_COLUMNS} FROM events WHERE cluster = :c AND stream = :s "
                             "ORDER BY stream_position"), {"c": cluster, "s": stream}).mappings().all()
    return [_recorded(r) for r in rows]


@dataclass(frozen=True, slots=True)
class EntryBehind:
    """A translator state entry whose stream position is below its stream's (see :func:`entries_behind_streams`)."""

    key: str
    """The entry's key, which is also its stream (``claim:<uid>``, ``pool:<driver>/<pool>``, ...)."""
    position: int
    """The stream position the entry says its object's stream is at (its ``pos``)."""
    head: int
    """The stream's last position in table ``events``."""


def entries_behind_streams(conn: Connection, cluster: str) -> list[EntryBehind]:
    """The entries of ``cluster``'s translator state (table ``translator_state``) whose ``pos`` is below the last
    position of the stream of the same name (table ``events``), ordered by key.

    Such an entry makes every event translated against it expect a position its stream has passed, so each is
    refused as a ``StreamConflict`` (``ledger.translator.repair`` says how release 0.3.0 left them). Entries whose
    key names no stream (``slice:<uid>``) are never returned; a pool's device positions (``devpos``) are not
    checked. One look-up in ``events_stream_position_key`` per entry: about a second for 100,000 entries.
    """
    rows = conn.execute(text(
        "SELECT s.key, COALESCE((s.state->>'pos')::bigint, 0) AS position, h.head FROM translator_state s "
        "CROSS JOIN LATERAL (SELECT max(e.stream_position) AS head FROM events e "
        "                    WHERE e.cluster = s.cluster AND e.stream = s.key) h "
        "WHERE s.cluster = :c AND h.head > COALESCE((s.state->>'pos')::bigint, 0) ORDER BY s.key"),
        {"c": cluster}).all()
    return [EntryBehind(key=str(r.key), position=int(r.position), head=int(r.head)) for r in rows]


_ENCODER = msgspec.json.Encoder()


def as_json(value: object) -> str:
    """Encode a decoded JSON value (dicts, lists, str, int, float, bool, None) as text for a ``jsonb`` column.

    Why msgspec: the ingest writes three or four JSON columns per watch event (observation body, event
    payload and source, translator state); its C encoder is several times faster than ``json.dumps``
    and that encoding was the largest single cost of an append after translation. The text differs
    from ``json.dumps`` only in spelling (UTF-8 instead of ``\\u`` escapes, ``1e16`` for ``1e+16``),
    which ``jsonb`` stores identically. Values it cannot encode fall back to ``json.dumps``.
    Non-finite floats never get here (the readers reject them: ``jsonb`` has no NaN).
    """
    return json_bytes(value).decode("utf-8")


def json_bytes(value: object) -> bytes:
    """Encode a decoded JSON value, or a Struct such as an event (its payload) or an :class:`EventSource`, as UTF-8
    JSON text, the form the ``json`` and ``jsonb`` columns of :func:`copy_binary_rows` take (:func:`as_json` is the
    same text as ``str``).

    msgspec's encoder: a Struct is written in C with its stored key spelling (``rename``), the object
    :func:`ledger.events.to_payload` builds and the ``events.source`` column holds (tested on every event of the
    fixtures), ~1 µs an event less than building the dict first. What it cannot encode (a lone surrogate, an
    integer past 64 bits) goes through ``json.dumps`` with ASCII escapes, a Struct as ``msgspec.to_builtins``
    spells it. The bytes are never decoded to ``str`` and encoded again on the append path.
    """
    try:
        return _ENCODER.encode(value)
    except (TypeError, UnicodeEncodeError, OverflowError):
        return json.dumps(msgspec.to_builtins(value)).encode("ascii")


# --- watch checkpoints (migration 0002) ----------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchCheckpointRow:
    """One row of table ``watch_checkpoints``: where the watch of one kind resumes."""

    kind: str
    api_version: str
    resource_version: str
    """Opaque; compared only for equality."""


def upsert_watch_checkpoints(conn: Connection, cluster: str, rows: Sequence[WatchCheckpointRow]) -> None:
    """Store the resourceVersion each kind's watch resumes from (insert or replace, ``updated_at`` = now()).

    Call inside the transaction that writes the observations the checkpoints cover.
    """
    if not rows:
        return
    conn.execute(text(
        "INSERT INTO watch_checkpoints (cluster, kind, api_version, resource_version, updated_at) "
        "VALUES (:cluster, :kind, :api_version, :resource_version, now()) "
        "ON CONFLICT ON CONSTRAINT watch_checkpoints_pkey DO UPDATE SET api_version = excluded.api_version, "
        "resource_version = excluded.resource_version, updated_at = excluded.updated_at"),
        [{"cluster": cluster, "kind": r.kind, "api_version": r.api_version,
          "resource_version": r.resource_version} for r in rows])


def load_watch_checkpoints(conn: Connection, cluster: str) -> list[WatchCheckpointRow]:
    """Read every watch checkpoint of ``cluster`` from table ``watch_checkpoints``, ordered by kind."""
    rows = conn.execute(text("SELECT kind, api_version, resource_version FROM watch_checkpoints "
                             "WHERE cluster = :c ORDER BY kind"), {"c": cluster}).all()
    return [WatchCheckpointRow(kind=str(r.kind), api_version=str(r.api_version),
                               resource_version=str(r.resource_version)) for r in rows]
