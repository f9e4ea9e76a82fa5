"""Capture the SQL statements that run on an engine, for tests of which queries a call makes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, event


@contextmanager
def statements_run(engine: Engine) -> Iterator[list[tuple[str, object]]]:
    """Yield a list that receives ``(statement, parameters)`` of every statement run on ``engine`` in the block."""
    seen: list[tuple[str, object]] = []

    def capture(conn: object, cursor: object, statement: str, parameters: object, context: object,
                executemany: bool) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", capture)
