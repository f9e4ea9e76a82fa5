"""The API's own catch-up: a ``serve`` process brings the read models up to the newest event while it serves.

Why: ``serve`` catches the read models up once, before it listens, and a watch worker keeps them current while it
leads. A ledger fed by ``replay`` alone (a backfill, a test environment, a demo) had nobody else: a replay stopped
while applying its events (Ctrl-C, SIGTERM) left them behind, and the API answered from the old state for as long
as it ran (``/v1/occupancy`` counted 915 allocated devices where the events said 963), visible only on ``/readyz``.
Now every ``catch_up_interval_s`` the process applies what is missing, as a CLI query does before it reads
(:func:`ledger.services.catch_up_for_query`): where another process is applying events (a replay still running, a
watch worker's catch-up, a rebuild) it leaves them to it, so the API never applies events beside their writer, and
several worker processes of one ``serve`` take turns rather than apply the same events together.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ledger import services
from ledger.errors import ProjectionFailed, Unavailable
from ledger.store.database import LedgerDatabase
from ledger.threads import in_thread

log = logging.getLogger("uvicorn.error")
"""uvicorn's server log, which `serve` prints at INFO (`INFO:     read models: ...`) beside its own lines."""

DEFAULT_CATCH_UP_INTERVAL_S: Final = 5.0
"""Seconds between two catch-ups of a ``serve`` process (``LEDGER_API_CATCH_UP_INTERVAL_S``): each costs two short
queries when nothing is missing, and events appended without a watch worker (a replay cut short) show in the
answers within this time."""

MAX_FAILURE_DELAY_S: Final = 60.0
"""Longest wait, in seconds, after catch-ups that failed in a row (the wait doubles from the interval up to it)."""


async def keep_read_models_current(db: LedgerDatabase, *, interval_s: float) -> None:
    """Every ``interval_s`` seconds, apply the events the read models lack (table ``events`` into the projections'
    tables, :func:`ledger.services.catch_up_for_query`) unless another process is applying them; run until
    cancelled. Returns at once when ``interval_s`` is 0 or less.

    The database work runs in a thread (:func:`ledger.threads.in_thread`): a cancel (the server stopping) cancels
    its statement, and the batch it was applying rolls back with its checkpoint, so nothing applied is lost or
    applied twice. Events applied are logged (``read models: N events applied``). A failure never ends the loop:
    a database outage or a batch the projections cannot apply (they stay at their checkpoint) is logged as a
    warning, any other error with its traceback, once per run of failures, and tried again after twice the last
    wait, up to :data:`MAX_FAILURE_DELAY_S`.

    Raises:
        asyncio.CancelledError: when cancelled, once the thread's work has ended.
    """
    if interval_s <= 0:
        return
    delay_s = interval_s
    failing = False
    while True:
        await asyncio.sleep(delay_s)
        applied = 0

        def count(events: int) -> None:
            nonlocal applied
            applied += events

        try:
            behind = await in_thread(services.catch_up_for_query, db, progress=count)
        except (Unavailable, ProjectionFailed) as e:
            if not failing:
                log.warning("read models: catch-up failed, answers may lag the newest events (retrying): %s", e)
        except Exception:
            # This loop is the API's supervisor of its catch-up, as main.py is a worker's: anything else (a table
            # renamed or a grant revoked under the running process, a bug) is logged with its traceback and tried
            # again, never the silent end of the catch-up (the task's error was only read at shutdown, and dropped).
            if not failing:
                log.exception("read models: catch-up failed, answers may lag the newest events (retrying)")
        else:
            if failing:
                log.info("read models: catch-up works again")
            failing, delay_s = False, interval_s
            if applied:
                log.info("read models: %d events applied%s", applied,
                         f", {behind.events} still missing" if behind is not None and behind.events else "")
            continue
        failing = True
        delay_s = min(max(delay_s * 2, interval_s), MAX_FAILURE_DELAY_S)
