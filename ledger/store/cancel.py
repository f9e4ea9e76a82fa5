"""Cancelling, from another thread, the statements a piece of database work runs in its own thread.

Why: an interrupt reaches the main thread only. Work handed to a thread (a pipelined ingest's writes, the jobs'
rollups and snapshots under ``asyncio.to_thread``) went on after Ctrl-C or SIGTERM, and a statement of it that
waited for a lock held elsewhere (a ``rebuild`` holds the read models for minutes) kept the process from stopping
for as long, without end where no ``lock_timeout`` is set. The main thread's own statements stop at once: psycopg
cancels the statement the interrupted thread waits in. :meth:`StatementCancel.request` does that for the other
thread's connections.

Two ways to name the connections: :meth:`StatementCancel.begin` / :meth:`StatementCancel.end` around one
connection (the ingest's writer), or :meth:`StatementCancel.run`, under which every connection the work checks out
of an engine made by :func:`ledger.store.postgres.make_engine` is named as it is checked out (pool events, see
:func:`watch_engine`), so the work's code needs no handle passed down.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg.errors import QueryCanceled
from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

P = ParamSpec("P")
T = TypeVar("T")

CANCEL_TIMEOUT = 5.0
"""Seconds one cancel request may take to reach the server (psycopg ``cancel_safe``)."""
CANCEL_REPEAT = 0.25
"""Seconds between two cancel requests to work that has not ended yet (:func:`ledger.services.ingest`'s writer,
:func:`ledger.threads.in_thread`): PostgreSQL drops a request that reaches a connection between two statements."""


class ThreadCancelled(BaseException):
    """A statement of work run under :meth:`StatementCancel.run` was cancelled at the request of the work's caller
    (Ctrl-C, SIGTERM, a scheduler shutting down). Its transaction rolled back.

    A ``BaseException``, as ``KeyboardInterrupt`` is: no handler of the work's own errors (a projection batch that
    failed, an ANALYZE left to autovacuum) takes it for a failure of the work, logs it or goes on after it.
    """


@dataclass(eq=False, slots=True)
class StatementCancel:
    """Stops the statements of work that another thread runs: each connection named to it (:meth:`begin`, or every
    connection checked out under :meth:`run`) gets a cancel request from :meth:`request`.

    Thread-safe: :meth:`request` runs in the caller's thread while the work's thread names and forgets connections.
    """

    _lock: threading.Lock = field(default_factory=threading.Lock)
    _connections: set[psycopg.Connection[Any]] = field(default_factory=set)
    _requested: bool = False

    @property
    def requested(self) -> bool:
        """Whether :meth:`request` was called (the work should begin nothing more)."""
        return self._requested

    def request(self) -> None:
        """Ask PostgreSQL to cancel the statement each named connection runs now (its transaction rolls back and
        the statement raises); from now on :attr:`requested` is ``True``.

        PostgreSQL ignores a request that reaches a connection between two statements: send it again until the
        work ended (every :data:`CANCEL_REPEAT` seconds). A request that cannot be sent (the server unreachable,
        or not answering within :data:`CANCEL_TIMEOUT` seconds) is dropped the same way.
        """
        with self._lock:  # the work forgets a connection under this lock: never a request to a pooled one
            self._requested = True
            for connection in self._connections:
                with suppress(psycopg.Error):
                    connection.cancel_safe(timeout=CANCEL_TIMEOUT)

    def begin(self, connection: psycopg.Connection[Any]) -> None:
        """Name ``connection``: :meth:`request` cancels what it runs until :meth:`end` forgets it."""
        with self._lock:
            self._connections.add(connection)

    def end(self, connection: psycopg.Connection[Any]) -> bool:
        """Forget ``connection``; ``True`` when a cancel request may have been sent to it: then it must not be used
        again (a request still on its way could stop its next statement)."""
        with self._lock:
            named = connection in self._connections
            self._connections.discard(connection)
            return named and self._requested

    def run(self, work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call ``work(*args, **kwargs)`` in this thread with every connection it checks out named to this object.

        Made for a worker thread (``asyncio.to_thread(cancel.run, work, ...)``); the context variable it sets is
        this call's own, since each ``to_thread`` call runs in a copy of the caller's context.

        Raises:
            ThreadCancelled: a statement of ``work`` was cancelled by :meth:`request`; its transaction rolled
                back. Anything else ``work`` raises, as it raises it.
        """
        token = _RUNNING.set(self)
        try:
            return work(*args, **kwargs)
        finally:
            _RUNNING.reset(token)
            with self._lock:  # one the work left checked out (not closed yet): no later request may reach it
                self._connections.clear()


_RUNNING: ContextVar[StatementCancel | None] = ContextVar("ledger_statement_cancel", default=None)
"""The :class:`StatementCancel` whose :meth:`~StatementCancel.run` this thread is in, if any."""


def watch_engine(engine: Engine) -> None:
    """Let :meth:`StatementCancel.run` reach ``engine``'s connections: each one checked out under it is named to
    the running :class:`StatementCancel`, forgotten at check-in (and closed there, never pooled again, when a cancel
    request may have been sent to it); a statement it cancelled raises :class:`ThreadCancelled`, and so does every
    statement the work would begin after the request.

    Why the last: work that polls with short statements and sleeps between them (a rebuild's wait for the read
    models' locks polls ``pg_locks`` for up to a minute) is rarely inside a statement when a request comes, and a
    request that reaches a connection between statements is dropped.

    Outside :meth:`StatementCancel.run` (every other use of the engine: the API's requests, the ingest) each
    listener does one context-variable read. Pool and dialect events only: a connection event such as
    ``before_cursor_execute`` switches on SQLAlchemy's per-statement event dispatch, which cost 4-5 µs a statement
    (an in-memory SQLite engine, 50,000 ``SELECT 1``), where the ``do_execute`` events cost under 1 µs, and the
    pool events ~1 µs a checkout. Called once per
    engine, by :func:`ledger.store.postgres.make_engine`.
    """
    event.listen(engine, "checkout", _named)
    event.listen(engine, "checkin", _forgotten)
    for executing in ("do_execute", "do_execute_no_params", "do_executemany"):
        event.listen(engine, executing, _refused)
    event.listen(engine, "handle_error", _cancelled)


def _named(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: PoolProxiedConnection) -> None:
    cancel = _RUNNING.get()
    if cancel is not None and isinstance(dbapi_connection, psycopg.Connection):
        cancel.begin(dbapi_connection)


def _forgotten(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
    cancel = _RUNNING.get()
    if cancel is not None and isinstance(dbapi_connection, psycopg.Connection) and cancel.end(dbapi_connection):
        record.invalidate()  # closed now; the pool opens a new connection in its place when one is next wanted


def _refused(*_: Any) -> bool:
    """The ``do_execute`` events' listener: ``False`` (SQLAlchemy runs the statement) unless a cancel was
    requested."""
    cancel = _RUNNING.get()
    if cancel is not None and cancel.requested:
        # SQLAlchemy takes a BaseException raised here for an exit: it closes this connection, never pooled again.
        raise ThreadCancelled("a statement was refused: the work's caller was interrupted")
    return False


def _cancelled(context: ExceptionContext) -> BaseException | None:
    cancel = _RUNNING.get()
    if cancel is not None and cancel.requested and isinstance(context.original_exception, QueryCanceled):
        return ThreadCancelled("a statement was cancelled: the work's caller was interrupted")
    return None
