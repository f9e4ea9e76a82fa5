"""A CLI query while another process applies events to the read models answers from them as they stand, and says
so, instead of waiting until that process has applied everything."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner, Result

from ledger import cli, services
from ledger.cli import app
from ledger.projections.runner import WHOLE_HISTORY_FROM
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

WIDE = {"COLUMNS": "250"}
AT = "2026-11-02T09:30:00Z"  # the seed lab: 8 GPUs, 6 allocated (README, "What the demo shows")
WAIT_S = 60.0
"""How long the test lets the query run before it calls it stuck (it answers within a second or two)."""


def _invoke_aside(args: list[str]) -> tuple[threading.Thread, list[Result]]:
    done: list[Result] = []
    thread = threading.Thread(target=lambda: done.append(CliRunner().invoke(app, args, env=WIDE)), daemon=True)
    thread.start()
    return thread, done


def test_a_query_while_another_process_holds_the_checkpoints_answers_and_says_how_far_behind(
        ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    # A second cluster recorded but not applied yet: its events are what the read models lack.
    report = services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=f"{ledger.cluster}-b",
                                   catch_up=False)
    assert report.events > 0
    args = ["occupancy", "--at", AT, "--cluster", ledger.cluster, "--database-url", ledger.db.url, "-o", "json"]
    with ledger.engine.connect() as holder:
        # What a replay's catch-up holds while it applies a batch (the checkpoint rows, FOR UPDATE).
        holder.execute(text("SELECT position FROM checkpoints FOR UPDATE"))
        thread, done = _invoke_aside(args)
        thread.join(WAIT_S)
        stuck = thread.is_alive()
        holder.rollback()
    thread.join(WAIT_S)

    assert not stuck, "the query waited for the checkpoint rows"
    [result] = done
    assert result.exit_code == 0, result.output
    # The events of the other cluster were not applied: the note counts them.
    assert result.stderr == (f"note: another process is applying events to the read models; this answer is from "
                             f"them as they stand, {report.events:,} events behind the newest\n")
    body: Any = json.loads(result.stdout)
    assert (body["totals"]["devices"], body["totals"]["allocated"]) == (8, 6)
    # The lock released, the next query applies the lag itself and says nothing.
    after = CliRunner().invoke(app, args, env=WIDE)
    assert after.exit_code == 0 and after.stderr == ""
    assert max(services.projection_lag(ledger.db).values()) == 0


def test_the_note_tells_a_whole_history_build_from_batches(capsys: pytest.CaptureFixture[str]) -> None:
    # Every projection lacking the same large number of events: the other process builds them from the whole
    # history in one transaction, and the query's reads wait for it; otherwise they do not.
    cli._say_behind({"device_inventory": WHOLE_HISTORY_FROM, "claims": WHOLE_HISTORY_FROM})
    cli._say_behind({"device_inventory": 2_000, "claims": 1_500})

    assert capsys.readouterr().err.splitlines() == [
        f"note: another process is building the read models from the whole history ({WHOLE_HISTORY_FROM:,} events); "
        "this answer waits until that build commits",
        "note: another process is applying events to the read models; this answer is from them as they stand, "
        "2,000 events behind the newest"]
