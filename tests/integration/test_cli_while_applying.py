"""A CLI query while another process applies events to the read models answers from them as they stand, and says
so, instead of waiting until that process has applied everything or applying the events beside it."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, text
from typer.testing import CliRunner, Result

from ledger import cli, services
from ledger.cli import app
from ledger.projections import runner
from ledger.store.locks import APPLYING_LOCK_KEY
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

WIDE = {"COLUMNS": "250"}
AT = "2026-11-02T09:30:00Z"  # the seed lab: 8 GPUs, 6 allocated (README, "What the demo shows")
WAIT_S = 60.0
"""How long the test lets a query run before it calls it stuck (it answers within a second or two)."""


def _invoke_aside(args: list[str]) -> tuple[threading.Thread, list[Result]]:
    done: list[Result] = []
    thread = threading.Thread(target=lambda: done.append(CliRunner().invoke(app, args, env=WIDE)), daemon=True)
    thread.start()
    return thread, done


def _seed_lab_and_a_second_cluster_not_applied(ledger: LedgerHandle) -> int:
    """The seed lab applied, then the same history as a second cluster recorded only; returns that cluster's events
    (what the read models lack)."""
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    report = services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=f"{ledger.cluster}-b",
                                   catch_up=False)
    assert report.events > 0
    return report.events


def _occupancy_args(ledger: LedgerHandle) -> list[str]:
    return ["occupancy", "--at", AT, "--cluster", ledger.cluster, "--database-url", ledger.db.url, "-o", "json"]


@contextmanager
def _held(ledger: LedgerHandle, *statements: str) -> Iterator[Connection]:
    """A session of another "process" running ``statements`` in an open transaction, rolled back and unlocked at the
    end (``pg_advisory_unlock_all``: a session lock outlives the rollback)."""
    with ledger.engine.connect() as other:
        for statement in statements:
            other.execute(text(statement))
        try:
            yield other
        finally:
            other.rollback()
            other.execute(text("SELECT pg_advisory_unlock_all()"))
            other.commit()


def _behind_note(events: int) -> str:
    return (f"note: another process is applying events to the read models; this answer is from them as they stand, "
            f"{events:,} events behind the newest\n")


def test_a_query_while_another_process_holds_the_applying_marker_answers_from_the_read_models_as_they_stand(
        ledger: LedgerHandle) -> None:
    missing = _seed_lab_and_a_second_cluster_not_applied(ledger)
    # What a replay holds from its first line to the end of its catch-up (services.applying).
    with _held(ledger, f"SELECT pg_advisory_lock_shared({APPLYING_LOCK_KEY})"):
        thread, done = _invoke_aside(_occupancy_args(ledger))
        thread.join(WAIT_S)
        stuck = thread.is_alive()
        lag_meanwhile = max(services.projection_lag(ledger.db).values())
    thread.join(WAIT_S)

    assert not stuck, "the query waited for the other process"
    [result] = done
    assert result.exit_code == 0, result.output
    assert result.stderr == _behind_note(missing)
    assert lag_meanwhile == missing  # the query left the events to the process that holds the marker
    body: Any = json.loads(result.stdout)
    assert (body["totals"]["devices"], body["totals"]["allocated"]) == (8, 6)
    # Once the other process has gone, the next query applies the events itself and says nothing.
    after = CliRunner().invoke(app, _occupancy_args(ledger), env=WIDE)
    assert after.exit_code == 0 and after.stderr == ""
    assert max(services.projection_lag(ledger.db).values()) == 0


def test_a_query_while_another_process_holds_the_checkpoint_rows_does_not_wait_for_them(ledger: LedgerHandle) -> None:
    # A runner without the marker (one started after the query looked): the checkpoint rows, FOR UPDATE, as a
    # catch-up's batch holds them.
    missing = _seed_lab_and_a_second_cluster_not_applied(ledger)
    with _held(ledger, "SELECT position FROM checkpoints FOR UPDATE"):
        thread, done = _invoke_aside(_occupancy_args(ledger))
        thread.join(WAIT_S)
        stuck = thread.is_alive()
    thread.join(WAIT_S)

    assert not stuck, "the query waited for the checkpoint rows"
    [result] = done
    assert result.exit_code == 0, result.output
    assert result.stderr == _behind_note(missing)


def test_a_query_during_a_rebuild_says_it_waits_for_it_and_then_answers(ledger: LedgerHandle) -> None:
    missing = _seed_lab_and_a_second_cluster_not_applied(ledger)
    # What a rebuild holds until it commits: the marker, and its TRUNCATE's lock on the read models' tables.
    with _held(ledger, f"SELECT pg_advisory_lock_shared({APPLYING_LOCK_KEY})",
               "LOCK TABLE device_inventory IN ACCESS EXCLUSIVE MODE"):
        thread, done = _invoke_aside(_occupancy_args(ledger))
        thread.join(3.0)
        waiting = thread.is_alive()  # reading device_inventory waits for the "rebuild"
    thread.join(WAIT_S)

    assert waiting
    [result] = done
    assert result.exit_code == 0, result.output
    assert result.stderr == ("note: another process is rebuilding the read models (dra-ledger rebuild, or a first "
                             "replay building them from the whole history); this answer waits until it commits\n")
    assert missing == max(services.projection_lag(ledger.db).values())
    body: Any = json.loads(result.stdout)
    assert (body["totals"]["devices"], body["totals"]["allocated"]) == (8, 6)


def test_a_query_that_applies_many_events_itself_says_so_first(ledger: LedgerHandle,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    missing = _seed_lab_and_a_second_cluster_not_applied(ledger)
    monkeypatch.setattr(cli, "PROGRESS_MIN_LINES", missing)  # the seed lab is short of the 5,000 events it takes

    result = CliRunner().invoke(app, _occupancy_args(ledger), env=WIDE)

    assert result.exit_code == 0, result.output
    assert result.stderr == f"read models: applying {missing:,} events before answering ...\n"
    assert max(services.projection_lag(ledger.db).values()) == 0


def test_a_catch_up_until_a_position_stops_there(ledger: LedgerHandle) -> None:
    missing = _seed_lab_and_a_second_cluster_not_applied(ledger)
    with ledger.engine.connect() as conn:
        head, _ = runner.head_and_lag_on(conn)
    until = head - missing // 2  # half of the second cluster's events

    applied = runner.catch_up(ledger.engine, until=until, batch_size=7)

    with ledger.engine.connect() as conn:
        positions = {int(p) for p in conn.execute(text("SELECT position FROM checkpoints")).scalars()}
    assert positions == {until}
    assert applied == missing - missing // 2
    assert runner.catch_up(ledger.engine, until=until) == 0


def test_a_replay_holds_the_applying_marker_from_its_first_line_and_a_query_meanwhile_leaves_its_events(
        ledger: LedgerHandle) -> None:
    import os
    import subprocess
    import time

    from tests.factories import CLI

    lines = (HISTORIES / "seed-lab.jsonl").read_bytes().splitlines(keepends=True)
    # Batches of 5 lines, so that some commit while the rest has not come yet.
    replay = subprocess.Popen([*CLI, "replay", "/dev/stdin", "--cluster", ledger.cluster, "--database-url",
                               ledger.db.url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "LEDGER_BATCH_SIZE": "5"})
    assert replay.stdin is not None
    try:
        # Half of the history, then the replay waits for more: it is reading, not applying yet.
        replay.stdin.write(b"".join(lines[: len(lines) // 2]))
        replay.stdin.flush()
        # Until its full batches are committed (the last few lines wait for a batch to fill): no change for 2 s.
        deadline, seen, since = time.monotonic() + WAIT_S, -1, time.monotonic()
        while time.monotonic() < deadline and (seen <= 0 or time.monotonic() - since < 2.0):
            lag = max(services.projection_lag(ledger.db).values())
            if lag != seen:
                seen, since = lag, time.monotonic()
            time.sleep(0.05)
        held = services.others_applying_events(ledger.db)
        recorded = max(services.projection_lag(ledger.db).values())
        query = CliRunner().invoke(app, _occupancy_args(ledger), env=WIDE)
        assert max(services.projection_lag(ledger.db).values()) == recorded  # nothing applied or added meanwhile
        replay.stdin.write(b"".join(lines[len(lines) // 2:]))
        replay.stdin.close()
        replay.wait(timeout=WAIT_S)
        assert replay.stderr is not None
        stderr = replay.stderr.read()
    finally:
        replay.kill()
        replay.wait()

    assert held
    assert replay.returncode == 0, stderr
    # The query applied none of the events the replay had recorded (left to it) and said how many it lacked.
    assert query.exit_code == 0, query.output
    assert recorded > 0
    assert query.stderr == _behind_note(recorded)
    assert not services.others_applying_events(ledger.db)  # released at the end of the replay
    assert max(services.projection_lag(ledger.db).values()) == 0


def test_a_query_during_a_rebuild_of_current_read_models_says_it_waits_and_answers_the_rebuilt_rows(
        ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")  # nothing missing: a rebuild's reset of the checkpoints is uncommitted
    # What a rebuild does in its transaction: the marker, then the tables emptied and filled again, committed later.
    with ledger.engine.connect() as rebuild:
        rebuild.execute(text(f"SELECT pg_advisory_lock_shared({APPLYING_LOCK_KEY})"))
        rebuild.execute(text("CREATE TEMPORARY TABLE kept ON COMMIT DROP AS SELECT * FROM device_inventory"))
        rebuild.execute(text("TRUNCATE device_inventory"))
        rebuild.execute(text("INSERT INTO device_inventory OVERRIDING SYSTEM VALUE SELECT * FROM kept"))
        thread, done = _invoke_aside(_occupancy_args(ledger))
        thread.join(3.0)
        waiting = thread.is_alive()
        rebuild.commit()
        rebuild.execute(text("SELECT pg_advisory_unlock_all()"))
        rebuild.commit()
    thread.join(WAIT_S)

    assert waiting
    [result] = done
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("note: another process is rebuilding the read models")
    # A snapshot taken before the commit saw the truncated table empty after it (0 devices).
    body: Any = json.loads(result.stdout)
    assert (body["totals"]["devices"], body["totals"]["allocated"], len(body["devices"])) == (8, 6, 8)
