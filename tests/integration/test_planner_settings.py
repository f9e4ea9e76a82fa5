"""Planner settings that the occupancy pages and totals set for one block (``queries._planner_settings``): restored
when the block ends, and never at the cost of the block's own error or of a report from the garbage collector."""

from __future__ import annotations

import gc
import sys

import psycopg
import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from ledger.projections.queries import _planner_settings


def _work_mem(conn: Connection) -> str:
    return str(conn.execute(text("SELECT current_setting('work_mem')")).scalar_one())


def test_the_settings_hold_in_the_block_and_the_previous_ones_come_back_after(ledger_engine: Engine) -> None:
    with ledger_engine.connect() as conn:
        conn.execute(text("SET LOCAL work_mem = '5MB'"))
        with _planner_settings(conn, {"work_mem": "32MB"}):
            inside = _work_mem(conn)
        after = _work_mem(conn)

    assert (inside, after) == ("32MB", "5MB")


def test_an_error_in_the_block_is_raised_as_itself(ledger_engine: Engine) -> None:
    # The restore ran in a finally on the failed transaction: "current transaction is aborted" was raised in place
    # of the statement's own error (a timeout said as a failed transaction).
    with (ledger_engine.connect() as conn, pytest.raises(DBAPIError) as raised,
          _planner_settings(conn, {"work_mem": "32MB"})):
        conn.execute(text("SELECT 1 / 0"))

    assert isinstance(raised.value.orig, psycopg.errors.DivisionByZero)


def test_settings_whose_block_never_ran_leave_nothing_for_the_garbage_collector_to_report(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # A signal between the generator's yield and the block (the SIGTERM of a user's trial) left the generator
    # suspended; collected after the connection closed, its restore failed there and Python printed "Exception
    # ignored in: <generator object _planner_settings ...>" with a traceback.
    reported: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(repr(unraisable.exc_value)))
    with ledger_engine.connect() as conn:
        settings = _planner_settings(conn, {"work_mem": "32MB"})
        settings.__enter__()  # the block never runs, and __exit__ is never called
    del settings
    gc.collect()

    assert reported == []
