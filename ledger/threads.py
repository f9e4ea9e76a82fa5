"""Database work of event-loop coroutines (the workers, the API's catch-up), run in threads that a cancel can stop.

The ledger's database calls are synchronous (SQLAlchemy Core on psycopg), so the workers' coroutines hand them to
threads; :func:`in_thread` is ``asyncio.to_thread`` plus a way to stop the thread's statements when the coroutine
is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from ledger.store.cancel import CANCEL_REPEAT, StatementCancel

P = ParamSpec("P")
T = TypeVar("T")


async def in_thread(work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``work(*args, **kwargs)`` in a worker thread (as ``asyncio.to_thread`` does) and return what it returns;
    cancelled, cancel the statements it runs and return once its thread is done.

    Why: a cancelled ``to_thread`` leaves its thread running, and ``asyncio.run`` waits for it as it ends. A rollup
    chunk or a snapshot waiting for a lock (a ``rebuild`` holds the read models for minutes) kept an interrupted
    ``jobs --once`` from exiting until the lock came free, without end where no ``lock_timeout`` is set. Now the
    statement is cancelled at once and again every :data:`~ledger.store.cancel.CANCEL_REPEAT` seconds (PostgreSQL
    ignores a request that reaches the connection between two statements) until the thread is done: what it had
    not committed rolls back (:mod:`ledger.store.cancel`).

    Raises:
        asyncio.CancelledError: the caller was cancelled, once the thread is done (its outcome is dropped: a
            transaction that committed before the cancel stays committed).
        Whatever ``work`` raises.
    """
    return await in_thread_with_grace(functools.partial(work, *args, **kwargs), grace_s=0.0)


async def in_thread_with_grace(work: Callable[[], T], *, grace_s: float,
                               grace_over: Callable[[], None] | None = None,
                               hurry: asyncio.Event | None = None) -> T:
    """:func:`in_thread` for work worth finishing: cancelled, ``work`` first gets ``grace_s`` seconds to end on
    its own, and only then are its statements cancelled. A second cancel meanwhile, or ``hurry`` set (before or
    during the grace), cuts the grace short.

    Used for a watch worker's append transaction (:class:`workers.sink.LedgerSink`): at a stop it nearly always
    commits within milliseconds, which spares delivering its batch again; one that waits for a lock held
    elsewhere is cancelled after the grace, so the process stops and hands the Lease on.

    Args:
        grace_s: seconds, >= 0 (0: cancel the statements at once, as :func:`in_thread` does).
        grace_over: called in the event loop when the work is still running as its statements are cancelled (to
            say so); not called when the work ended within the grace.
        hurry: set by whoever wants no grace any more (a second SIGTERM or Ctrl-C, which a process receives as
            one more call of its handler, not as a second cancel of this coroutine).

    Raises:
        asyncio.CancelledError: the caller was cancelled, once the thread is done (what ``work`` committed
            before its statements were cancelled stays committed).
        Whatever ``work`` raises.
    """
    cancel = StatementCancel()
    # The executor's future itself, as asyncio.to_thread makes it (in a copy of this context), not a task wrapping
    # it: asyncio.run cancels every task still running when its main coroutine ends, and that cancel, taken for the
    # thread's end, stopped the cancel requests below while the thread ran on.
    done = asyncio.get_running_loop().run_in_executor(
        None, functools.partial(contextvars.copy_context().run, cancel.run, work))
    # Read once done, so that an outcome dropped below is never reported as "exception was never retrieved".
    done.add_done_callback(lambda future: future.cancelled() or future.exception())
    try:
        return await asyncio.shield(done)  # the caller's cancel reaches this await, not the thread's task
    except asyncio.CancelledError:
        if grace_s > 0 and not (hurry is not None and hurry.is_set()):
            hurried = asyncio.ensure_future(hurry.wait() if hurry is not None else asyncio.Event().wait())
            try:
                with contextlib.suppress(asyncio.CancelledError):  # a second cancel: cancel the statements now
                    either: list[asyncio.Future[Any]] = [done, hurried]
                    await asyncio.wait(either, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                hurried.cancel()
        if grace_over is not None and not done.done():
            grace_over()
        while not done.done():
            cancel.request()
            try:
                await asyncio.wait([done], timeout=CANCEL_REPEAT)
            except asyncio.CancelledError:
                # A further cancel (a second Ctrl-C, asyncio.run cancelling what is left) must not end the repeats:
                # a statement that began as the first request was sent can miss it, and only a repeat stops it.
                continue
        raise
