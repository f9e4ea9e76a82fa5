"""Runs the projections: catch up from their checkpoints, rebuild from position 0, report lag.

Rows and checkpoints commit in one transaction per batch, so a crash leaves every projection exactly
at its checkpoint. ``SELECT ... FOR UPDATE`` on the checkpoint rows makes one runner at a time; a batch that
forgets rolled usage hours also holds the rolled-hours lock (``ledger.store.locks``), so it waits for a rollup
chunk in flight and forgets the rows that chunk writes.
Appends hold an advisory append lock until commit (see ``ledger.store.postgres``), so
global positions become visible in order and reading ``global_position > checkpoint`` never skips one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, OperationalError
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_exponential

from ledger.errors import CheckpointsLocked, LedgerError, ProjectionFailed
from ledger.events import RecordedEvent
from ledger.projections import counts
from ledger.projections import whole_history as whole
from ledger.projections.base import Projection, earliest_by_cluster
from ledger.projections.batch import BATCH_APPLIERS, segments
from ledger.projections.models import ALL, ALLOCATION_EVENTS
from ledger.projections.rollups import (
    forget_all_rolled_hours,
    forget_rolled_hours,
    split_inputs_changed,
    unpublished_starts,
)
from ledger.store.database import (
    connection_lost,
    deadlock_detected,
    lock_not_available,
    lock_statement,
    read_models_held,
)
from ledger.store.locks import applying
from ledger.store.postgres import first_line, read_all
from ledger.store.tables import READ_MODELS
from ledger.types import GlobalPosition

Progress = Callable[[int], None]
Built = Callable[[str], None]
"""Told a read-model table's name once a whole-history build has written its rows (see
:func:`ledger.projections.whole_history.build`)."""
Waiting = Callable[[float], None]
"""Told, once, the seconds a rebuild has waited for other sessions to let go of the read models, when that passes
:data:`WAITING_SAID_AFTER_S`."""
_log = logging.getLogger(__name__)
ALLOCATIONS = "device_allocations"
"""The projection whose rows the hourly usage rollups sum."""
INVENTORY = "device_inventory"
"""The projection whose capacities split the rolled hours of shared devices (``ledger.projections.split``)."""
COUNTED = frozenset({"device_inventory", ALLOCATIONS, "claim_consumers", "pod_phases"})
"""The projections whose intervals the occupancy counts are computed from (``ledger.projections.counts``)."""


def _lock_checkpoints(conn: Connection, names: Sequence[str]) -> dict[str, int]:
    now = datetime.now(UTC)
    for name in names:
        conn.execute(text("INSERT INTO checkpoints (projection, position, updated_at) VALUES (:p, 0, :now) "
                          "ON CONFLICT (projection) DO NOTHING"), {"p": name, "now": now})
    rows = conn.execute(text("SELECT projection, position FROM checkpoints WHERE projection = ANY(:names) "
                             "ORDER BY projection FOR UPDATE"), {"names": list(names)}).all()
    return {str(r.projection): int(r.position) for r in rows}


NO_WAIT_LOCK_TIMEOUT = "200ms"
"""How long ``catch_up(wait=False)`` waits for the checkpoint rows (PostgreSQL ``lock_timeout`` syntax). Long
enough to pass over the instant between two batches of another runner, when the rows are free; short against a
whole-history build or a batch of the other runner in progress, which is what it does not wait for."""


def _lock_checkpoints_or_stop(conn: Connection, names: Sequence[str], *, applied: int) -> dict[str, int]:
    """:func:`_lock_checkpoints` waiting at most :data:`NO_WAIT_LOCK_TIMEOUT` for each lock, the rows' own and an
    uncommitted insert of a missing row alike (another process's first catch-up).

    Raises:
        CheckpointsLocked: the wait ran out (``applied``: the events this catch-up applied before).
    """
    # Only these statements: back to the session's default after them, so the batch itself waits as long as the
    # session allows (a rollup chunk it must wait for is short work, not another runner).
    conn.execute(text(f"SET LOCAL lock_timeout = '{NO_WAIT_LOCK_TIMEOUT}'"))
    try:
        positions = _lock_checkpoints(conn, names)
    except OperationalError as e:
        if not lock_not_available(e):
            raise
        raise CheckpointsLocked(applied=applied) from e
    conn.execute(text("SET LOCAL lock_timeout TO DEFAULT"))
    return positions


def table_names(projections: Sequence[Projection] = ALL) -> list[str]:
    """The tables of ``projections`` (default: every read model's) in :data:`ledger.store.tables.READ_MODELS`
    order, the order reads lock them in: what :func:`rebuild` empties with ``TRUNCATE``.

    Raises:
        LedgerError: a projection has a table that ``READ_MODELS`` does not list (reads would not lock it, and
            their lock order would not cover it).
    """
    wanted = {tbl.name for p in projections for tbl in p.tables}
    ordered = [tbl.name for tbl in READ_MODELS if tbl.name in wanted]
    if unlisted := wanted - set(ordered):
        raise LedgerError(f"read-model tables missing from ledger.store.tables.READ_MODELS: {sorted(unlisted)}")
    return ordered


def _apply_batch(conn: Connection, projections: Sequence[Projection], positions: dict[str, int],
                 batch: Sequence[RecordedEvent], *, set_based: bool = True) -> None:
    if COUNTED & positions.keys():
        # Occupancy counts are a step function of four tables' intervals: forget what this batch may change
        # (before applying it, to tell a pod's first phase from later ones).
        counts.forget_for_batch(conn, [e for e in batch if e.global_position > min(positions.values())])
    # Allocations the batch's device events will fill change model and node from their own start, which may
    # precede the batch's events: read which before applying (afterwards they no longer wait for the device).
    filled = (unpublished_starts(conn, (e for e in batch if e.global_position > positions[ALLOCATIONS]))
              if ALLOCATIONS in positions else {})
    if set_based and all(p.name in BATCH_APPLIERS for p in projections):
        # Set-based path (ledger.projections.batch): per segment, each projection folds its events in
        # memory and writes them with a few pipelined statements. Segments keep the reads of
        # device_allocations at the right global position, so batch boundaries never change the rows.
        for segment in segments(batch):
            for projection in projections:
                after = positions[projection.name]
                BATCH_APPLIERS[projection.name](conn, [e for e in segment if e.global_position > after])
    else:
        for event in batch:
            for projection in projections:
                if event.global_position > positions[projection.name]:
                    projection.apply_event(conn, event)
    if ALLOCATIONS in positions:
        # Rolled usage hours are sums of device_allocations, split by the capacities in device_inventory: forget
        # those this batch may have changed.
        earliest = earliest_by_cluster(
            e for e in batch if e.type in ALLOCATION_EVENTS and e.global_position > positions[ALLOCATIONS])
        changed = (split_inputs_changed(conn, (e for e in batch if e.global_position > positions[INVENTORY]))
                   if INVENTORY in positions else {})
        for cluster, start in [*changed.items(), *filled.items()]:
            earliest[cluster] = min(start, earliest.get(cluster, start))
        forget_rolled_hours(conn, earliest)
    last = batch[-1].global_position
    now = datetime.now(UTC)
    for projection in projections:
        if positions[projection.name] < last:
            positions[projection.name] = last
            conn.execute(text("UPDATE checkpoints SET position = :pos, updated_at = :now WHERE projection = :p"),
                         {"pos": last, "now": now, "p": projection.name})


WHOLE_HISTORY_FROM = 20_000
"""Default of :func:`catch_up`'s ``whole_history_from``: below it a whole-history build saves little (its fixed
statements cost about what a few batches do), and the test histories keep exercising the batch path."""


def catch_up(engine: Engine, *, projections: Sequence[Projection] = ALL, batch_size: int = 2000,
             progress: Progress | None = None, built: Built | None = None,
             whole_history_from: int = WHOLE_HISTORY_FROM,
             wait: bool = True, until: int | None = None) -> int:
    """Apply every event after each projection's checkpoint.

    Read models that have applied nothing yet (every checkpoint at 0) while the store already holds
    ``whole_history_from`` events or more (read off the newest global position) are built from the whole
    history at once, as :func:`rebuild` builds them, and then caught up as usual: after a first replay of a
    large file that is several times faster than applying the events batch after batch (191,046 events:
    ~2 s against ~12 s). Should that build fail (an event it cannot take), it rolls back and the batches
    apply the events instead, stopping before the bad one as they always do.

    Args:
        engine: the ledger database.
        projections: which read models (default: all, in their dependency order).
        batch_size: events per transaction.
        progress: called with the number of events applied after each batch (once for a whole-history build).
        built: told each table's name as a whole-history build writes it (the build's steps; not called otherwise).
        whole_history_from: the store size, in events, from which read models that applied nothing are built
            from the whole history (``0``: never).
        wait: ``False``: should another process hold the checkpoint rows (it is applying events: a replay's
            catch-up, a whole-history build, ``serve``'s job) for more than :data:`NO_WAIT_LOCK_TIMEOUT`, stop
            and raise :class:`~ledger.errors.CheckpointsLocked` instead of waiting until it commits (a
            whole-history build of a large replay holds them for minutes); what was applied until then stays.
        until: stop once every checkpoint is at or past this global position (a query's head when it started),
            rather than follow the events another process keeps appending; ``None``: the newest event.

    While it runs it holds the applying marker (``ledger.store.locks.applying``), so that a CLI query that finds
    the marker held does not start applying the same events too.

    Returns:
        How many events were applied (0 = already caught up).

    Raises:
        CheckpointsLocked: ``wait`` is ``False`` and another process held the checkpoint rows.
        ProjectionFailed: a batch failed (a statement the database refused, or an event a projection could
            not take); it is rolled back with its checkpoints and retried from there on the next call (a
            bad event stops the projections, never is skipped).
        sqlalchemy.exc.SQLAlchemyError: the database could not be reached (``connection_lost``), or reading
            the checkpoints or the events failed.
    """
    with applying(engine):
        return _catch_up(engine, projections=projections, batch_size=batch_size, progress=progress, built=built,
                         whole_history_from=whole_history_from, wait=wait, until=until)


def _catch_up(engine: Engine, *, projections: Sequence[Projection], batch_size: int, progress: Progress | None,
              built: Built | None, whole_history_from: int, wait: bool, until: int | None) -> int:
    """:func:`catch_up`'s loop, run while the caller holds the applying marker."""
    names = [p.name for p in projections]
    applied = 0
    # Asked once, in the first transaction, and only when every checkpoint is 0: read models already built pay
    # nothing for it (catch_up runs on every query command and every tick of the worker's catch-up loop).
    may_build = whole_history_from > 0 and whole.supports(names)
    while True:
        span: tuple[int, int] | None = None  # global positions: the checkpoint, the batch's last event
        try:
            with engine.begin() as conn:
                positions = _lock_checkpoints(conn, names) if wait else _lock_checkpoints_or_stop(conn, names,
                                                                                                   applied=applied)
                if may_build and not any(positions.values()):
                    from_nothing = _build_from_nothing(conn, projections, positions, from_events=whole_history_from,
                                                       progress=progress, built=built)
                    if from_nothing:
                        applied += from_nothing
                        continue  # committed; the batches apply what was appended since
                may_build = False
                after = min(positions.values())
                if until is not None and after >= until:
                    return applied
                batch = read_all(conn, after=GlobalPosition(after), limit=batch_size, with_source=False)
                if until is not None:
                    batch = [e for e in batch if e.global_position <= until]
                if not batch:
                    return applied
                span = (after, batch[-1].global_position)
                _apply_batch(conn, projections, positions, batch)
        except BATCH_FAILURES as e:
            if span is None or (isinstance(e, DBAPIError) and connection_lost(e)):
                raise
            reason = first_line(e) if isinstance(e, DBAPIError) else f"{type(e).__name__}: {e}"
            raise ProjectionFailed(projections=tuple(names), after=span[0], through=span[1], reason=reason) from e
        applied += len(batch)
        if progress is not None:
            progress(len(batch))


def _build_from_nothing(conn: Connection, projections: Sequence[Projection], positions: dict[str, int], *,
                        from_events: int, progress: Progress | None, built: Built | None) -> int:
    """In the caller's transaction (checkpoints locked, all at 0): build ``projections`` from the whole history if
    the store holds at least ``from_events`` events; returns the events applied (0: not built, the batches apply
    them). A build that fails is rolled back to a savepoint, logged, and left to the batches."""
    newest = int(conn.execute(text("SELECT coalesce(max(global_position), 0) FROM events")).scalar_one())
    if newest < from_events:
        return 0
    try:
        with conn.begin_nested():
            _reset(conn, projections, positions)
            return _build_whole(conn, [p.name for p in projections], progress=progress, built=built)
    except BATCH_FAILURES as e:
        if isinstance(e, DBAPIError) and connection_lost(e):
            raise
        # Rolled back to the savepoint, the checkpoints at 0 as ``positions`` says: the batches apply the events up
        # to the bad one and report it with its positions.
        _log.warning("building the read models from the whole history failed (%s); applying the events in "
                     "batches instead", first_line(e) if isinstance(e, DBAPIError) else f"{type(e).__name__}: {e}")
        return 0


BATCH_FAILURES = (DBAPIError, LedgerError, LookupError, ValueError, TypeError, AttributeError, ArithmeticError)
"""What applying a batch raises for an event the projections cannot take: a statement the database refuses (a
constraint, a value out of range), or a payload without a field, a value of the wrong type, an invalid quantity.
:func:`catch_up` reports them as :class:`~ledger.errors.ProjectionFailed` (a lost connection excepted), so the
worker keeps recording and retries later."""


def rebuild(engine: Engine, *, projections: Sequence[Projection] = ALL, batch_size: int = 5000,
            progress: Progress | None = None, built: Built | None = None, waiting: Waiting | None = None,
            set_based: bool = True, whole_history: bool = True) -> int:
    """Rebuild read models from global position 0 in one transaction and swap them in at commit.

    Readers never see a half-built model: the TRUNCATE's ACCESS EXCLUSIVE lock makes them wait for the commit,
    then they read the rebuilt rows. A REPEATABLE READ reader must take its table locks before its snapshot
    (:meth:`ledger.store.database.LedgerDatabase.snapshot` does), as TRUNCATE is not MVCC-safe.

    Three ways, one result (tests compare them row for row, and with live catch-up):

    * default: each table is built once from the whole history (:mod:`ledger.projections.whole_history`),
      the fast path, used whenever it supports ``projections``;
    * ``whole_history=False``: batches of ``batch_size`` events through the set-based batch path
      (:mod:`ledger.projections.batch`, what :func:`catch_up` runs);
    * ``set_based=False``: one event at a time through each projection's ``apply_event`` (the
      reference semantics).

    Args:
        engine: the ledger database (table ``events`` is read, the projections' tables are replaced).
        projections: which read models (default: all).
        batch_size: events per batch of the batch paths (> 0; unused by the whole-history path).
        progress: called with the number of events applied, after each batch (once for the whole history).
        built: told each table's name as the whole-history path writes it (its steps; the batch paths do not call it).
        waiting: told the seconds waited so far, once, when taking the read models from their readers takes longer
            than :data:`WAITING_SAID_AFTER_S` (see :func:`_lock_for_truncate`).
        set_based: ``False`` selects the reference path.
        whole_history: ``False`` selects the batch path.

    Returns:
        How many events were applied (every event up to the head read at the start; 1-based positions).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: a statement failed; everything rolls back and the old read
            models and checkpoints stay (a bad event stops the rebuild, never is skipped).
    """
    applied = 0
    # The applying marker too, as catch_up holds it: a CLI query then answers at once, saying the read models are
    # being rebuilt, instead of trying to catch them up.
    with applying(engine), engine.begin() as conn:
        names = [p.name for p in projections]
        positions = _lock_checkpoints(conn, names)
        _reset(conn, projections, positions, waiting=waiting)
        if set_based and whole_history and whole.supports(names):
            return _build_whole(conn, names, progress=progress, built=built)
        after = GlobalPosition(0)
        while batch := read_all(conn, after=after, limit=batch_size, with_source=False):
            _apply_batch(conn, projections, positions, batch, set_based=set_based)
            after = batch[-1].global_position
            applied += len(batch)
            if progress is not None:
                progress(len(batch))
    return applied


def _reset(conn: Connection, projections: Sequence[Projection], positions: dict[str, int], *,
           waiting: Waiting | None = None) -> None:
    """Empty the read models ``projections`` and what is derived from them, and set their checkpoints to 0 (the
    caller holds the checkpoint rows)."""
    names = [p.name for p in projections]
    tables = ", ".join(table_names(projections))
    if COUNTED & set(names):
        # Before the TRUNCATE: a refresh holds the coverage rows and then reads these tables, so taking the
        # rows first keeps one lock order (the hourly job then computes the counts again).
        counts.forget_all(conn)
    if ALLOCATIONS in names:
        # Hourly rollups are sums of device_allocations: forget them all (the hourly job rolls them up
        # again; until then usage reads the live intervals). Before the TRUNCATE for the same reason: a rollup
        # chunk holds the rolled-hours lock and then reads device_allocations, so this takes that lock first.
        forget_all_rolled_hours(conn)
    _lock_for_truncate(conn, table_names(projections), waiting=waiting)
    # No RESTART IDENTITY: resetting the row-id sequences needs their owner, and the ledger runs without
    # DDL rights (SECURITY.md); row ids carry no meaning.
    conn.execute(text(f"TRUNCATE {tables}"))
    for name in names:
        positions[name] = 0
    conn.execute(text("UPDATE checkpoints SET position = 0 WHERE projection = ANY(:names)"), {"names": names})


TRUNCATE_LOCK_TRY_S = 0.2
"""Seconds one attempt of a rebuild waits for the read models' ACCESS EXCLUSIVE locks (:func:`_lock_for_truncate`):
below PostgreSQL's default ``deadlock_timeout`` (1 s), so that a reader that waits for a table the attempt holds
gets it before the server would look for, and break, a deadlock."""
TRUNCATE_LOCK_PATIENCE_S = 60.0
"""Seconds a rebuild keeps to such attempts before it waits for the locks without bound, as a plain ``TRUNCATE``
would: readers that hold the read models without pause (dashboards polling long queries) must not keep it out."""
WAITING_SAID_AFTER_S = 2.0
"""Seconds of waiting for the read models' locks after which a rebuild says so (its caller's ``waiting``)."""


def _lock_for_truncate(conn: Connection, names: Sequence[str], *, waiting: Waiting | None = None) -> None:
    """ACCESS EXCLUSIVE locks on the tables ``names`` (:func:`table_names` order) for the ``TRUNCATE`` that follows.

    Why not a plain wait: the ledger's own reads lock every read model first, in this order
    (``LedgerDatabase.reading``), so they wait for a rebuild holding nothing. A client's single statement cannot:
    a Grafana query on ``reporting.claim_consumers`` locks ``claim_consumers`` and then ``claims``. When the rebuild
    waited for a table a long reader held, having taken ``claims`` already, such a query took ``claim_consumers``,
    waited for ``claims``, and PostgreSQL aborted one of the two as a deadlock once the long reader let go.

    So, for :data:`TRUNCATE_LOCK_PATIENCE_S`: wait, holding nothing, until no other session holds a lock on any of
    the tables (read from ``pg_locks``: polling writes nothing to the server log, where each refused attempt writes
    an ERROR), then take them all in one attempt of :data:`TRUNCATE_LOCK_TRY_S` at most, under a savepoint, so that
    a failed one gives back what it took and the reader it held up passes. Then a plain wait, as a ``TRUNCATE``
    alone: should PostgreSQL choose this rebuild as a deadlock's victim there (a reader's statement locked out of
    order), it rolls back to its savepoint, letting the reader finish, and waits in line again; it never fails for a
    deadlock. A reader chosen instead is aborted: only under readers that kept the read models busy for the whole
    patience (measured: four dashboards' loops with no pause between statements), and only in their out-of-order
    views. Pauses between polls grow from 0.05 s to 1 s (tenacity).

    Raises:
        sqlalchemy.exc.OperationalError: a statement failed for another reason than a lock not granted.
    """
    started = time.monotonic()
    said = False

    def taken() -> bool:
        nonlocal said
        if not said and waiting is not None and time.monotonic() - started >= WAITING_SAID_AFTER_S:
            said = True
            waiting(time.monotonic() - started)
        if read_models_held(conn, names, by_readers=True):
            return False
        try:
            with conn.begin_nested():  # a failed attempt rolls back to here: its locks are given back
                conn.exec_driver_sql(lock_statement(names, mode="ACCESS EXCLUSIVE", wait_s=TRUNCATE_LOCK_TRY_S))
        except OperationalError as e:
            if not _lock_refused(e):
                raise
            return False
        return True

    # Polls and attempts until one takes the locks, or the patience is spent (False, not an error).
    if Retrying(retry=retry_if_result(lambda got: not got), wait=wait_exponential(multiplier=0.05, max=1.0),
                stop=stop_after_delay(TRUNCATE_LOCK_PATIENCE_S), retry_error_callback=lambda _: False)(taken):
        return
    while True:  # in line; a deadlock that picks this rebuild puts it back in line at once, not to the polls
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(lock_statement(names, mode="ACCESS EXCLUSIVE"))
            return
        except OperationalError as e:
            if not deadlock_detected(e):
                raise


def _lock_refused(error: BaseException) -> bool:
    """Whether ``error`` ended an attempt of :func:`_lock_for_truncate` that may be made again: ``lock_timeout``
    passed (55P03), or PostgreSQL chose the attempt as a deadlock's victim (40P01: a ``deadlock_timeout`` set below
    :data:`TRUNCATE_LOCK_TRY_S`)."""
    return isinstance(error, OperationalError) and (lock_not_available(error) or deadlock_detected(error))


def _build_whole(conn: Connection, names: Sequence[str], *, progress: Progress | None, built: Built | None) -> int:
    """Build the (emptied) read models ``names`` from every event up to the head, with their checkpoints at the
    head; returns how many events that was."""
    # One snapshot of the head for every statement of the build (see whole_history's docstring).
    count, head = conn.execute(text("SELECT count(*), coalesce(max(global_position), 0) FROM events")).one()
    if count:
        whole.build(conn, names=list(names), head=GlobalPosition(int(head)), built=built)
        conn.execute(text("UPDATE checkpoints SET position = :pos, updated_at = :now WHERE projection = ANY(:names)"),
                     {"pos": int(head), "now": datetime.now(UTC), "names": list(names)})
        if progress is not None:
            progress(int(count))
    return int(count)


def lag(engine: Engine) -> dict[str, int]:
    """Return head global position minus checkpoint, per projection (events not yet applied)."""
    with engine.connect() as conn:
        return lag_on(conn)


def tables_locked(conn: Connection, projections: Sequence[Projection] = ALL) -> bool:
    """Whether another transaction holds a lock that keeps reads off a table of ``projections`` now (the ACCESS
    EXCLUSIVE lock of a ``TRUNCATE``: a rebuild, or a first catch-up building the read models from the whole
    history, until it commits); never waits (:func:`ledger.store.database.read_models_held`)."""
    return read_models_held(conn, table_names(projections))


def lag_on(conn: Connection) -> dict[str, int]:
    """:func:`lag` on an open connection."""
    return head_and_lag_on(conn)[1]


def count_events(conn: Connection) -> int:
    """How many events table ``events`` holds (every cluster's; gaps in the global positions are not counted)."""
    return int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())


def unapplied_events(conn: Connection, *, head: int, lags: Mapping[str, int]) -> int:
    """How many events the read model furthest behind lacks, counted in table ``events`` (after its checkpoint, up
    to ``head``), from what :func:`head_and_lag_on` read: its lag less the gaps in the global positions (an append
    rolled back, by Ctrl-C say, has used its positions up)."""
    return int(conn.execute(text("SELECT count(*) FROM events WHERE global_position > :after "
                                 "AND global_position <= :head"),
                            {"after": head - max(lags.values(), default=0), "head": head}).scalar_one())


def head_and_lag_on(conn: Connection) -> tuple[int, dict[str, int]]:
    """The newest global position (0 for no events) and :func:`lag` per projection, read in one snapshot when
    ``conn``'s transaction is REPEATABLE READ."""
    head = int(conn.execute(text("SELECT coalesce(max(global_position), 0) FROM events")).scalar_one())
    rows = conn.execute(text("SELECT projection, position FROM checkpoints")).all()
    known = {str(r.projection): int(r.position) for r in rows}
    return head, {p.name: head - known.get(p.name, 0) for p in ALL}
