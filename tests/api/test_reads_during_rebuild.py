"""An API read that starts while a rebuild holds the read models waits for the rebuild's commit and answers from the
rebuilt rows, never from the tables its ``TRUNCATE`` emptied."""

from __future__ import annotations

import threading
import time
from typing import Any

from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import Connection, text

from ledger.testing.handle import LedgerHandle

AT = "2026-11-02T09:30:00Z"  # the seed lab: 8 GPUs, 6 allocated (seed-lab.expected.json)
WAIT_S = 60.0
"""How long the test waits for a request before it calls it stuck (each takes well under a second alone)."""


def _wait_until_blocked_on_a_lock(conn: Connection) -> bool:
    """Whether another session of this database is waiting for a lock within :data:`WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        waiting = conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'")).scalar_one()
        conn.rollback()  # pg_stat_activity is read once per transaction
        if waiting:
            return True
        time.sleep(0.05)
    return False


def test_occupancy_requested_during_a_rebuild_waits_for_its_commit_and_answers_the_rebuilt_rows(
        seeded: LedgerHandle, client: TestClient[Litestar]) -> None:
    answers: list[Any] = []

    def request() -> None:
        response = client.get("/v1/occupancy", params={"at": AT, "cluster": seeded.cluster})
        answers.append((response.status_code, response.json()))

    # What a rebuild does in its one transaction: the tables emptied, then filled again from the events, committed
    # later (the same rows here, so the right answer is the seed lab's).
    with seeded.engine.connect() as rebuild, seeded.engine.connect() as watcher:
        rebuild.execute(text("CREATE TEMPORARY TABLE kept ON COMMIT DROP AS SELECT * FROM device_inventory"))
        rebuild.execute(text("TRUNCATE device_inventory"))
        rebuild.execute(text("INSERT INTO device_inventory OVERRIDING SYSTEM VALUE SELECT * FROM kept"))
        thread = threading.Thread(target=request, daemon=True)
        thread.start()
        blocked = _wait_until_blocked_on_a_lock(watcher)
        rebuild.commit()
    thread.join(WAIT_S)

    assert blocked
    [(status, body)] = answers
    assert status == 200, body
    # A snapshot taken before the commit (by reading the checkpoints first) saw device_inventory empty after it.
    assert (body["totals"]["devices"], body["totals"]["allocated"], len(body["devices"])) == (8, 6, 8)
    assert sum(len(d["allocations"]) for d in body["devices"]) == 6
