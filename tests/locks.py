"""Locks held by another session, for tests of work that must stop while it waits for one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, text

GUARD_S = 60.0
"""Only against a hang: the holder lets go after this even when nothing cancelled the waiting statement."""


@contextmanager
def held(engine: Engine, statement: str) -> Iterator[threading.Event]:
    """Hold what ``statement`` locks in another session's open transaction until the block ends (or
    :data:`GUARD_S`); the event yielded is set once the holder has let go."""
    locked, done, released = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with engine.connect() as conn, conn.begin():
            conn.execute(text(statement))
            locked.set()
            done.wait(GUARD_S)
        released.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(GUARD_S)
        yield released
    finally:
        done.set()
        holder.join()


def someone_waits_for_a_lock(engine: Engine) -> bool:
    """Whether a session of ``engine``'s database waits for a lock now (``pg_locks``, not granted)."""
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE NOT l.granted AND a.datname = current_database()")).scalar_one())
