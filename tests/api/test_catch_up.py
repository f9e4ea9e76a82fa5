"""The API process catches the read models up while it serves (``api.catch_up``), unless another process applies."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import text

from api import catch_up
from api.app import create_app
from ledger import services
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle
from tests.factories import served_api
from tests.paths import HISTORIES

EXPECTED: dict[str, Any] = json.loads((HISTORIES / "seed-lab.expected.json").read_text())
FIRST = EXPECTED["checks"][0]
"""The seed lab's first check (09:30: 8 devices, 6 allocated)."""
DEADLINE_S = 60.0
"""How long a test waits for the catch-up to happen before it fails (a generous bound, not a measured time)."""


@pytest.fixture()
def recorded(ledger: LedgerHandle) -> LedgerHandle:
    """The seed lab recorded but not applied: events in the store, read models empty (a replay cut short)."""
    report = services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=ledger.cluster,
                                   catch_up=False)
    assert report.events > 0
    assert max(services.projection_lag(ledger.db).values()) > 0
    return ledger


@pytest.fixture()
def serve(recorded: LedgerHandle) -> Iterator[Callable[[float], TestClient[Litestar]]]:
    """Start the app (its lifespan runs) over the recorded ledger with a given catch-up interval."""
    clients: list[TestClient[Litestar]] = []

    def start(interval_s: float) -> TestClient[Litestar]:
        client = TestClient(create_app(db=recorded.db, config=DEFAULT, catch_up_interval_s=interval_s))
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def _allocated(client: TestClient[Litestar]) -> int:
    response = client.get("/v1/occupancy", params={"at": FIRST["at"]})
    assert response.status_code == 200, response.text
    allocated = response.json()["totals"]["allocated"]
    assert isinstance(allocated, int)
    return allocated


def _wait_until_caught_up(ledger: LedgerHandle) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while (lag := max(services.projection_lag(ledger.db).values())) > 0:
        assert time.monotonic() < deadline, f"the read models are still {lag} events behind"
        time.sleep(0.05)


def test_the_served_answers_reach_the_recorded_events_without_another_process(
        serve: Callable[[float], TestClient[Litestar]], recorded: LedgerHandle) -> None:
    client = serve(0.05)
    _wait_until_caught_up(recorded)
    assert _allocated(client) == FIRST["devices_allocated"]


def test_without_an_interval_the_app_applies_nothing(serve: Callable[[float], TestClient[Litestar]],
                                                     recorded: LedgerHandle) -> None:
    client = serve(0)
    assert _allocated(client) == 0  # the read models are as the cut-short replay left them: empty
    assert max(services.projection_lag(recorded.db).values()) > 0


def test_the_catch_up_leaves_events_to_another_process_applying_them(
        serve: Callable[[float], TestClient[Litestar]], recorded: LedgerHandle) -> None:
    held, release, released = threading.Event(), threading.Event(), threading.Event()

    def other_process() -> None:
        with services.applying(recorded.db):  # the applying marker, as a replay holds it to its last line
            held.set()
            release.wait()
        released.set()

    other = threading.Thread(target=other_process)
    other.start()
    try:
        assert held.wait(DEADLINE_S)
        client = serve(0.02)
        time.sleep(0.5)  # some 25 ticks of the catch-up while the marker is held
        assert _allocated(client) == 0
    finally:
        release.set()
        other.join()
    assert released.is_set()
    _wait_until_caught_up(recorded)
    assert _allocated(client) == FIRST["devices_allocated"]


def test_a_running_serve_with_two_workers_applies_events_recorded_after_it_started(ledger: LedgerHandle) -> None:
    # Through the real command: serve starts on an empty ledger, then a replay records the seed lab without applying
    # it (as one stopped while applying); the workers' catch-up brings the answers to the events, and says so.
    url = f"/v1/occupancy?at={FIRST['at']}"
    with served_api("--workers", "2", "--catch-up-interval", "0.2", database_url=ledger.db.url) as server:
        before = httpx.get(server.base + url, timeout=30)
        assert before.status_code == 200 and before.json()["totals"]["allocated"] == 0
        services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=ledger.cluster, catch_up=False)
        _wait_until_caught_up(ledger)
        after = httpx.get(server.base + url, timeout=30)
    assert after.status_code == 200, after.text
    assert after.json()["totals"]["allocated"] == FIRST["devices_allocated"]
    # Each worker says what it applied; together, every event of the seed lab (51), each applied once.
    applied = [int(n) for n in re.findall(r"read models: (\d+) events applied", server.output)]
    assert sum(applied) == 51, server.output
    assert server.process.returncode == 0, server.output


def test_a_catch_up_that_fails_for_any_reason_is_logged_and_tried_again(
        serve: Callable[[float], TestClient[Litestar]], recorded: LedgerHandle,
        caplog: pytest.LogCaptureFixture) -> None:
    # Not a lost connection nor a projection's failure: a table missing under the running process (a migration run
    # beside an older serve). The loop ended on it, silently, and the read models stayed behind for good.
    caplog.set_level(logging.INFO, logger=catch_up.log.name)
    catch_up.log.addHandler(caplog.handler)  # Litestar's logging setup stops uvicorn's loggers from propagating
    try:
        _fail_then_recover(serve, recorded, caplog)
    finally:
        catch_up.log.removeHandler(caplog.handler)
    said = [r for r in caplog.records if r.name == catch_up.log.name]
    [failed] = [r for r in said if "catch-up failed" in r.getMessage()]  # once for the run of failures
    assert failed.levelno == logging.ERROR and failed.exc_info is not None
    assert "checkpoints" in "".join(traceback.format_exception(*failed.exc_info))


def _fail_then_recover(serve: Callable[[float], TestClient[Litestar]], recorded: LedgerHandle,
                       caplog: pytest.LogCaptureFixture) -> None:
    with recorded.engine.begin() as conn:
        conn.execute(text("ALTER TABLE checkpoints RENAME TO checkpoints_away"))
    try:
        serve(0.05)
        deadline = time.monotonic() + DEADLINE_S
        while not [r for r in caplog.records if "catch-up failed" in r.getMessage()]:
            assert time.monotonic() < deadline, "the failure was never logged"
            time.sleep(0.05)
    finally:
        with recorded.engine.begin() as conn:
            conn.execute(text("ALTER TABLE checkpoints_away RENAME TO checkpoints"))
    _wait_until_caught_up(recorded)
    deadline = time.monotonic() + DEADLINE_S
    while not [r for r in caplog.records if r.getMessage() == "read models: catch-up works again"]:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.05)
