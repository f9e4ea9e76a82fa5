"""The ledger's database as one object: connections, the append transaction, reads.

:mod:`ledger.services` talks to PostgreSQL only through :class:`LedgerDatabase`, so the use cases
(and everything above them: CLI, API, workers) never touch SQLAlchemy or psycopg directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ledger.errors import (
    Invalid,
    LedgerError,
    NoFreeConnection,
    ObservationConflict,
    ReadModelsRebuilding,
    StateConflict,
    StatementCancelled,
    StoreUnavailable,
)
from ledger.events import NewEvent, RecordedEvent
from ledger.store import postgres as pg
from ledger.store import schema, tables
from ledger.store.cancel import StatementCancel
from ledger.store.postgres import ObservationKey, ObservationRow, first_line
from ledger.translator.translate import TranslatorState
from ledger.types import GlobalPosition


def connection_lost(error: DBAPIError) -> bool:
    """Whether ``error`` is a refused or lost connection (transient for a long-running process), not a
    statement the database refused: SQLAlchemy ``OperationalError`` / ``InterfaceError`` (psycopg
    ``OperationalError``: refused, reset, server shutting down), or any error whose connection was
    invalidated under it."""
    return isinstance(error, OperationalError | InterfaceError) or error.connection_invalidated


LOCK_NOT_AVAILABLE = "55P03"
"""SQLSTATE ``lock_not_available``: a lock not granted within ``lock_timeout``, or at once under ``NOWAIT``."""
QUERY_CANCELED = "57014"
"""SQLSTATE ``query_canceled``: a ``statement_timeout``, an administrator's cancel, or the client's (Ctrl-C)."""
DEADLOCK_DETECTED = "40P01"
"""SQLSTATE ``deadlock_detected``: this transaction was chosen as a deadlock's victim."""
INSUFFICIENT_PRIVILEGE = "42501"
"""SQLSTATE ``insufficient_privilege`` (``permission denied``, ``must be owner``)."""
TIMED_OUT = frozenset({QUERY_CANCELED, LOCK_NOT_AVAILABLE})
"""The SQLSTATEs of a statement the server ended for a timeout of its own (``statement_timeout``, ``lock_timeout``):
the database answers, so it is no lost connection, though psycopg raises both as ``OperationalError``."""


def sqlstate(error: DBAPIError) -> str | None:
    """The SQLSTATE of what the database said (``error.orig``, psycopg's error), or ``None`` (no server error)."""
    state = getattr(error.orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def lock_not_available(error: OperationalError) -> bool:
    """Whether ``error`` is PostgreSQL's ``lock_not_available`` (:data:`LOCK_NOT_AVAILABLE`): a lock not granted
    within ``lock_timeout``, or at once under ``NOWAIT``."""
    return sqlstate(error) == LOCK_NOT_AVAILABLE


def deadlock_detected(error: OperationalError) -> bool:
    """Whether ``error`` is PostgreSQL's ``deadlock_detected`` (:data:`DEADLOCK_DETECTED`): the server chose this
    statement's transaction as the victim of a deadlock (its transaction, or savepoint, must be rolled back)."""
    return sqlstate(error) == DEADLOCK_DETECTED


def lock_statement(names: Sequence[str], *, mode: str, wait_s: float | None = None) -> str:
    """``LOCK TABLE`` of ``names`` (table names from :mod:`ledger.store.tables`, never input) in ``mode``, in that
    order; with ``wait_s``, bounded by a ``lock_timeout`` set for this statement alone (set and reset around it, as
    several statements without parameters, which psycopg sends as one simple query: one round trip)."""
    lock = f"LOCK TABLE {', '.join(names)} IN {mode} MODE"
    if wait_s is None:
        return lock
    return f"SET LOCAL lock_timeout = '{max(1, round(wait_s * 1000))}ms'; {lock}; SET LOCAL lock_timeout TO DEFAULT"


@dataclass(slots=True)
class AppendBatch:
    """What one append transaction writes: observations, events, and the translator state.

    Built inside :meth:`LedgerDatabase.append`; written when the ``with`` block ends without error.
    """

    conn: Connection
    cluster: str
    observations: list[ObservationRow] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)

    def known(self, keys: Sequence[ObservationKey]) -> dict[str, str | None]:
        """Return the digests of the observations of ``keys`` ((receive time or ``None``, digest) pairs) already
        stored for this cluster, each with its rejection reason (``None`` when it was recorded)."""
        return pg.known_digests(self.conn, self.cluster, keys)

    def load_entries(self, keys: Sequence[str]) -> dict[str, str]:
        """Return the stored translator state entries of ``keys`` as JSON text (tombstones kept out of
        memory; load them with ``StateEntries.load_json``)."""
        return pg.load_entries(self.conn, self.cluster, keys)

    def entries_behind_streams(self) -> list[pg.EntryBehind]:
        """The translator state entries of this cluster behind their streams (:func:`pg.entries_behind_streams`),
        read under the append lock, so no writer moves a stream meanwhile."""
        return pg.entries_behind_streams(self.conn, self.cluster)

    def read_stream(self, stream: str) -> list[RecordedEvent]:
        """Every event of ``stream`` in this cluster, by stream position (table ``events``)."""
        return pg.read_stream(self.conn, cluster=self.cluster, stream=stream)

    def save_watch_checkpoints(self, rows: Sequence[pg.WatchCheckpointRow]) -> None:
        """Upsert watch checkpoints in this transaction, so they commit with the batch's observations."""
        pg.upsert_watch_checkpoints(self.conn, self.cluster, rows)


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    """One batch translated ahead of its write (:meth:`LedgerDatabase.write`): the rows are final, and
    ``state`` is a snapshot of the translator entries the batch changed (:func:`pg.dirty_rows`)."""

    observations: list[ObservationRow]
    events: list[NewEvent]
    state: pg.StateRows
    appends: int
    """The cluster's append count the batch was translated against (``TranslatorState.appends`` before it)."""

    @property
    def appends_after(self) -> int:
        """The count once this batch committed: one more when ``state`` changes anything (the rule of
        :func:`pg.save_state_rows`)."""
        return self.appends + 1 if self.state.changes else self.appends


class WriteCancelled(Exception):
    """A :meth:`LedgerDatabase.write` asked to stop (:class:`~ledger.store.cancel.StatementCancel`) before it began;
    nothing was written."""


@dataclass(slots=True)
class LedgerDatabase:
    """A ledger database (schema at head) behind a SQLAlchemy engine."""

    engine: Engine
    unanalyzed_events: int = 0
    """Events this object's catch-ups applied since it last analyzed the tables (``ledger.services.catch_up``)."""
    read_models_wait_s: float | None = None
    """Seconds a read waits for the read models while a rebuild holds them (:func:`lock_for_reading`) before it
    raises :class:`~ledger.errors.ReadModelsRebuilding`; ``None``: until the rebuild commits. The CLI and the jobs
    wait (a rebuild ends, and their answer is wanted then); the API sets a bound (``api.limits.REBUILD_WAIT_S``), so
    that its requests answer 503 with ``Retry-After`` rather than hold its pooled connections for the rebuild's
    minutes."""
    rebuild_seen: bool = False
    """Set when a read of this object found the read models held past :attr:`read_models_wait_s`; while set, a read
    first asks ``pg_locks`` (:func:`read_models_held`) and raises at once while they are still held, so that the
    requests after the first ones do not each hold a thread and a connection for the whole wait (an API process
    runs 6 handlers at once on 2 cores: its health checks waited behind them). Cleared by the first read that finds
    them free."""

    @classmethod
    def from_url(cls, url: str, *, session_name: str | None = None) -> LedgerDatabase:
        """Open the database at ``url`` (``postgresql://`` or ``postgresql+psycopg://``); its sessions are named
        ``session_name`` (default :data:`ledger.store.postgres.SESSION_NAME`)."""
        return cls(engine=pg.make_engine(url, session_name=session_name))

    @property
    def url(self) -> str:
        """The database URL, with its password, for handing to another process."""
        return self.engine.url.render_as_string(hide_password=False)

    @property
    def libpq_url(self) -> str:
        """The same URL as libpq takes it (``postgresql://user@host:port/db``, with its password), for ``psql``,
        Grafana and other non-SQLAlchemy clients, which refuse :attr:`url`'s ``postgresql+psycopg://`` scheme
        (``psql`` reads it as a database name). The ledger's own ``--database-url`` takes either form."""
        return self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

    def require_current(self) -> None:
        """Raise ``SchemaNotReady`` unless the schema is at this code's head revision."""
        schema.require_current(self.engine)

    def upgrade(self) -> None:
        """Migrate the schema to head (needs DDL rights)."""
        schema.upgrade(self.engine)

    def analyze(self) -> pg.Analyzed:
        """``ANALYZE`` every table of the ledger (``ledger.store.tables.metadata``: the event store and the read
        models) that the role may analyze (:func:`ledger.store.postgres.analyze_tables`).

        Raises:
            LedgerError: the connection could not be made or was lost (the tables analyzed before keep their new
                statistics). A table whose ANALYZE the server refuses is not an error: it is in ``failed``.
        """
        try:
            return pg.analyze_tables(self.engine, sorted(tables.metadata.tables))
        except DBAPIError as e:
            raise LedgerError(f"ANALYZE failed: {first_line(e)}") from e

    def load_state(self, cluster: str) -> TranslatorState:
        """Load the translator's memory for ``cluster``."""
        with self.engine.connect() as conn:
            return pg.load_state(conn, cluster)

    @contextmanager
    def append(self, cluster: str, state: TranslatorState) -> Iterator[AppendBatch]:
        """One append transaction under the append lock (see :mod:`ledger.store.postgres`).

        On a clean exit the batch's observations, events and ``state.dirty`` commit together; on an
        error nothing is written and ``state`` is emptied and marked stale (``TranslatorState.forget``):
        memory may hold changes that never committed. Loading it again is the caller's (``ledger.services``
        does it once, before the state's next use): reloaded here, the stale copy stayed referenced while
        the fresh one loaded, and a caller that dropped the state anyway loaded it a second time.

        Under the lock, before the batch is handed out, ``state`` is loaded again (in place, in this transaction)
        when the cluster's append count is not the one it reflects: another writer committed since it was
        loaded (a former leader's write that committed after this replica took the Lease; a replay beside a
        watch). Translated against what that writer stored, no batch saves an entry older than it: a stale entry
        written back on a line that appends no event (a ``resourceVersion`` moved) left ``translator_state``
        behind its stream for good, and every later event of the object was refused as a ``StreamConflict``.

        Raises:
            StreamConflict: another writer appended to one of the batch's streams.
        """
        try:
            with self.engine.begin() as conn:
                pg.lock_appends(conn)
                if pg.read_appends(conn, cluster) != state.appends:
                    assert not state.dirty, "a batch begins with every change of the last one saved"
                    state.forget()  # the stale copy goes before the fresh one loads
                    state.take(pg.load_state(conn, cluster))
                batch = AppendBatch(conn=conn, cluster=cluster)
                yield batch
                pg.insert_observations(conn, cluster, batch.observations)
                pg.insert_events(conn, cluster, batch.events)
                pg.save_state(conn, cluster, state)
        except BaseException:
            state.forget()
            raise

    def known_digests(self, cluster: str, keys: Sequence[ObservationKey]) -> dict[str, str | None]:
        """The digests of the observations of ``keys`` ((receive time or ``None``, digest) pairs) stored for
        ``cluster``, each with its rejection reason (``None``: recorded); read outside the append lock, for a
        pipelined ingest (one writer per cluster).

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        with self.reading(read_models=False) as conn:
            return pg.known_digests(conn, cluster, keys)

    def load_entries(self, cluster: str, keys: Sequence[str]) -> dict[str, str]:
        """The stored translator state entries of ``keys`` as JSON text (see :func:`pg.load_entries`).

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        with self.reading(read_models=False) as conn:
            return pg.load_entries(conn, cluster, keys)

    def write(self, cluster: str, rows: PreparedAppend, cancel: StatementCancel | None = None) -> None:
        """Write ``rows`` (observations, events, translator state rows) in one transaction under the append
        lock: all of them commit or none. Safe to call from another thread than the translator's: it reads
        nothing but ``rows``, which the caller no longer changes. ``cancel`` lets the caller's thread stop it.

        Raises:
            StreamConflict: another writer appended to one of the events' streams; nothing was written.
            ObservationConflict: another writer recorded one of the observations first (the batch's duplicate
                check ran before this lock); nothing was written.
            StateConflict: another writer appended to the cluster since ``rows`` were translated (the append
                count is not ``rows.appends``); nothing was written.
            WriteCancelled: ``cancel`` was stopped before the write began; a cancel after raises what the
                cancelled statement raised (psycopg's ``QueryCanceled``). Nothing was written either way.
        """
        cancel = cancel if cancel is not None else StatementCancel()
        with self.engine.connect() as conn:
            raw = conn.connection.driver_connection
            assert isinstance(raw, psycopg.Connection)
            cancel.begin(raw)
            try:
                if cancel.requested:  # after begin(): a request from now on reaches this connection's statements
                    raise WriteCancelled("the write was cancelled before it began")
                with conn.begin():
                    pg.lock_appends(conn)
                    if pg.read_appends(conn, cluster) != rows.appends:
                        raise StateConflict("another writer appended to the cluster since this batch was translated")
                    try:
                        pg.insert_observations(conn, cluster, rows.observations)
                    except IntegrityError as e:
                        if pg.constraint_of(e) != "observations_cluster_observed_at_digest_key":
                            raise
                        raise ObservationConflict("another writer recorded an observation of this batch first") from e
                    pg.insert_events(conn, cluster, rows.events)
                    pg.save_state_rows(conn, cluster, rows.state, appends=rows.appends)
            finally:
                if cancel.end(raw):
                    # A cancel request may still be on its way to this session: never hand it back to the pool,
                    # where it could stop whatever statement runs on it next.
                    conn.invalidate()

    @contextmanager
    def reading(self, *, autocommit: bool = False, read_models: bool = True) -> Iterator[Connection]:
        """A connection for queries (one snapshot per statement); by default it first waits for, and holds, the read
        models' ACCESS SHARE locks (:func:`lock_for_reading`).

        Why the locks, first and all of them: a read that took one read model's lock and then waited for another
        that a rebuild had truncated, while the rebuild waited for the first, deadlocked, and PostgreSQL aborted one
        of them (a ``rebuild`` beside dashboards polling ``/v1/shared`` failed 6 times in 6). Taken in one statement
        in :data:`ledger.store.tables.READ_MODELS` order, the order of the rebuild's ``TRUNCATE``, the read waits
        holding nothing. By default, so that a new query cannot forget them.

        Args:
            autocommit: no transaction at all, each statement on its own, and no read-model locks (``LOCK TABLE``
                needs a transaction): for one-statement reads of tables a rebuild does not empty (the API's
                per-request checkpoint read, the clusters in ``events``). It saves the ``BEGIN`` and the
                ``ROLLBACK`` (two of such a read's four round trips, with the pool's ping). Not for reads that use
                transaction-local settings (``SET LOCAL``, ``set_config(..., true)``), which autocommit would drop.
            read_models: ``False`` for reads of the event store and the checkpoints only (tables a rebuild leaves
                alone), which must not wait for a rebuild: ingest, lag, the rebuild's own progress note.

        Raises:
            StoreUnavailable: the database cannot be reached (see :func:`unavailable_as_error`).
            ReadModelsRebuilding: a rebuild held the read models for :attr:`read_models_wait_s` (when set).
            Invalid: a query parameter PostgreSQL refuses (e.g. a NUL character in a name).
        """
        try:
            with unavailable_as_error(), self.engine.connect() as conn:
                if autocommit:
                    # Reset to the engine's level when the pool takes the connection back (SQLAlchemy does).
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                elif read_models:
                    self._fail_fast_while_rebuilding(conn)
                    self._lock_read_models(conn)
                yield conn
        except DataError as e:
            # A parameter PostgreSQL cannot take (a NUL character, a time out of range): the caller's input.
            raise Invalid(f"a parameter cannot be used: {first_line(e)}") from e

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A connection inside one REPEATABLE READ transaction: every statement sees the same snapshot
        (a page and its totals, or a cached body and the version it was computed at, agree).

        The read models' ACCESS SHARE locks are taken first, waiting for a rebuild to commit (as :meth:`reading`):
        ``LOCK TABLE`` takes no snapshot, and the snapshot is fixed by the next statement, so it holds the rebuilt
        rows. Why: ``TRUNCATE`` is not MVCC-safe. A snapshot taken before a rebuild commits, by a block whose first
        statement reads a table the rebuild left alone (the checkpoints), sees the truncated tables empty after the
        commit: occupancy answered 0 devices.

        Raises:
            StoreUnavailable: the database cannot be reached.
            ReadModelsRebuilding: a rebuild held the read models for :attr:`read_models_wait_s` (when set).
            Invalid: a query parameter PostgreSQL refuses.
        """
        with self.reading(read_models=False) as conn:
            self._fail_fast_while_rebuilding(conn)
            conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                self._lock_read_models(conn)
                yield conn

    def _fail_fast_while_rebuilding(self, conn: Connection) -> None:
        """While :attr:`rebuild_seen`, raise :class:`~ledger.errors.ReadModelsRebuilding` at once if the read models
        are still held (:func:`read_models_held`), else clear it. Its own transaction, ended here: a REPEATABLE READ
        block must fix its snapshot after its locks (:meth:`snapshot`), not with this query."""
        if self.read_models_wait_s is None or not self.rebuild_seen:
            return
        held = read_models_held(conn)
        conn.rollback()
        if held:
            raise ReadModelsRebuilding(
                "the read models are still being rebuilt (a `dra-ledger rebuild`, a first build from a whole history, "
                "or a schema migration holds them until it commits); retry later",
                retry_after_s=max(1, math.ceil(self.read_models_wait_s)))
        self.rebuild_seen = False

    def _lock_read_models(self, conn: Connection) -> None:
        """:func:`lock_for_reading` with :attr:`read_models_wait_s`; a wait that runs out sets :attr:`rebuild_seen`."""
        try:
            lock_for_reading(conn, wait_s=self.read_models_wait_s)
        except ReadModelsRebuilding:
            self.rebuild_seen = True
            raise

    def read_all(self, *, after: GlobalPosition, limit: int, types: Sequence[str] | None = None,
                 stream: str | None = None, cluster: str | None = None) -> list[RecordedEvent]:
        """Events after global position ``after`` (see :func:`ledger.store.postgres.read_all`).

        Raises:
            Unavailable: the database cannot be reached.
        """
        with self.reading(read_models=False) as conn:
            return pg.read_all(conn, after=after, limit=limit, types=types, stream=stream, cluster=cluster)

    def read_stream(self, *, cluster: str, stream: str) -> list[RecordedEvent]:
        """One stream's events in stream position order.

        Raises:
            Unavailable: the database cannot be reached.
        """
        with self.reading(read_models=False) as conn:
            return pg.read_stream(conn, cluster=cluster, stream=stream)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def load_watch_checkpoints(self, cluster: str) -> list[pg.WatchCheckpointRow]:
        """Every watch checkpoint of ``cluster`` (table ``watch_checkpoints``), ordered by kind."""
        with self.engine.connect() as conn:
            return pg.load_watch_checkpoints(conn, cluster)

    def ping(self) -> None:
        """Run ``SELECT 1``.

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        with self.reading(read_models=False) as conn:
            conn.execute(text("SELECT 1"))


def lock_for_reading(conn: Connection, *, wait_s: float | None = None) -> None:
    """ACCESS SHARE locks on every read model (:data:`ledger.store.tables.READ_MODELS`) in ``conn``'s transaction,
    in one statement, in that order (see :meth:`LedgerDatabase.reading`); waits for a rebuild holding any of them to
    commit, for ``wait_s`` seconds at most (``None``: without end). Also for a transaction that reads the read
    models and writes too (the snapshot job), which :meth:`LedgerDatabase.reading` does not commit.

    Raises:
        ReadModelsRebuilding: ``wait_s`` passed with a read model still held (``lock_timeout``, SQLSTATE 55P03);
            ``conn``'s transaction is aborted, roll it back.
    """
    if wait_s is None:
        conn.exec_driver_sql(lock_statement(_READ_MODEL_NAMES, mode="ACCESS SHARE"))
        return
    # lock_timeout for the LOCK only (lock_statement): the read's own statements then wait as the session says.
    try:
        conn.exec_driver_sql(lock_statement(_READ_MODEL_NAMES, mode="ACCESS SHARE", wait_s=wait_s))
    except OperationalError as e:
        if not lock_not_available(e):
            raise
        raise ReadModelsRebuilding(
            f"the read models are being rebuilt (a `dra-ledger rebuild`, a first build from a whole history, or a "
            f"schema migration holds them until it commits); this read waited {wait_s:g} s for them; retry later",
            retry_after_s=max(1, math.ceil(wait_s))) from e


_READ_MODEL_NAMES = tuple(t.name for t in tables.READ_MODELS)


def read_models_held(conn: Connection, names: Sequence[str] = _READ_MODEL_NAMES, *, by_readers: bool = False) -> bool:
    """Whether another session has a lock on one of the read models ``names`` (default: all,
    :data:`ledger.store.tables.READ_MODELS`) now; never waits. Read from ``pg_locks`` rather than by trying
    ``LOCK TABLE ... NOWAIT``, whose refusal the server writes to its log as an ERROR.

    Args:
        by_readers: ``False``: an ACCESS EXCLUSIVE lock held or waited for, as a rebuild's ``TRUNCATE`` has until it
            commits. A request waiting in line counts: reads that come after it queue behind it (a rebuild waiting
            for a ``pg_dump`` to let go of its first table held nothing granted, and each API read waited its 5 s).
            ``True``: a granted lock of any mode (readers too), what a rebuild waits to see gone before it takes
            the tables.
    """
    which = "granted" if by_readers else "mode = 'AccessExclusiveLock'"
    return bool(conn.execute(text(
        f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'relation' AND {which} "
        "AND pid <> pg_backend_pid() AND database = (SELECT oid FROM pg_database "
        "WHERE datname = current_database()) AND relation = ANY(CAST(:tables AS regclass[])))"),
        {"tables": list(names)}).scalar_one())


@contextmanager
def unavailable_as_error() -> Iterator[None]:
    """Re-raise a lost or refused database connection as :class:`~ledger.errors.StoreUnavailable`.

    A refused or lost connection (:func:`connection_lost`) is transient for a long-running writer, and so is a
    pool with every connection in use past its ``pool_timeout`` (30 s; an API process under more concurrent
    requests than its 15 connections answered 500 there); every other error passes.

    Raises:
        StoreUnavailable: the block failed because the database was unreachable; :class:`NoFreeConnection` when
            no pooled connection came free in time; :class:`StatementCancelled` when the server ended a statement
            for a timeout of its own (:data:`TIMED_OUT`), which is no lost connection.
    """
    try:
        yield
    except PoolTimeout as e:
        raise NoFreeConnection("no free database connection: every connection of the pool stayed in use past the "
                               "pool's timeout") from e
    except DBAPIError as e:
        if not connection_lost(e):
            raise
        if sqlstate(e) in TIMED_OUT:
            raise StatementCancelled(f"the database cancelled a statement: {first_line(e)}") from e
        raise StoreUnavailable(f"database unavailable: {first_line(e)}") from e
