"""Report slots: an API process computes a bounded number of whole-fleet reports at once, in arrival order, and a
request that cannot get a slot, or a pooled database connection, in time is a 503 with ``Retry-After``, never a
500; requests waiting for a slot hold no thread, so the other endpoints keep answering."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any

import anyio
import pytest
import uvicorn
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import Engine, create_engine, text

from api.app import WORKER_SPEC_ENV, WorkerSpec, create_app, create_app_for_worker
from api.deps import AppState, ClientGone, ReportSlots
from api.limits import DEFAULT_REPORT_SLOTS
from ledger import services
from ledger.config import DEFAULT
from ledger.errors import Busy, Invalid, NoFreeConnection
from ledger.store.database import LedgerDatabase
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI

AT = "2026-11-02T09:30:00Z"
REPORTS = [f"/v1/quotas?at={AT}", f"/v1/shared?at={AT}", f"/v1/pending?at={AT}", f"/v1/reports/idle-claims?at={AT}"]
"""The four whole-fleet reports, at an instant of the seed-lab history."""


def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` until it holds; fail after 30 s, naming ``what``."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def test_no_more_reports_than_slots_run_at_once_and_every_one_runs() -> None:
    slots = ReportSlots(2, wait_s=30)
    inside, most, ran = 0, 0, []
    lock = threading.Lock()
    pair = threading.Barrier(2, timeout=10)  # the first two in wait for each other: two at once is reached

    def report(n: int) -> int:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        pair.wait()
        with lock:
            inside -= 1
            ran.append(n)
        return n * 10

    results: list[int] = []

    async def main() -> None:
        async def one(n: int) -> None:
            results.append(await slots.run(partial(report, n)))

        async with anyio.create_task_group() as tasks:
            for n in range(8):
                tasks.start_soon(one, n)

    anyio.run(main)
    assert most == 2
    assert sorted(ran) == list(range(8))
    assert sorted(results) == [n * 10 for n in range(8)]  # each report's own answer came back


def test_waiting_reports_get_the_slot_in_the_order_they_came() -> None:
    slots = ReportSlots(1, wait_s=30)
    gate = threading.Event()
    order: list[int] = []

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(slots.run, partial(gate.wait, 30))  # holds the only slot until the gate opens
            for n in range(6):
                while slots.waiting != n:  # the previous one is queued before the next comes
                    await anyio.sleep(0.005)
                tasks.start_soon(slots.run, partial(order.append, n))
            while slots.waiting != 6:
                await anyio.sleep(0.005)
            gate.set()

    anyio.run(main)
    assert order == [0, 1, 2, 3, 4, 5]


def test_a_request_that_gets_no_slot_in_time_is_busy_and_the_slot_is_free_again_after() -> None:
    slots = ReportSlots(1, wait_s=0.05)
    gate = threading.Event()

    async def main() -> tuple[Busy, str]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(slots.run, partial(gate.wait, 30))
            while slots.running == 0:  # until the holder has the slot
                await anyio.sleep(0.005)
            try:
                await slots.run(lambda: "never")
            except Busy as e:
                refused = e
            else:
                raise AssertionError("a second report ran while the only slot was held")
            gate.set()
        return refused, await slots.run(lambda: "ran")  # released by the holder, and the refused wait took none

    refused, after = anyio.run(main)
    assert refused.retry_after_s == 1  # the wait rounded, at least a second
    assert str(refused) == ("this API process is computing as many whole-fleet reports at once as it may (1, "
                            "serve --report-slots) and none finished within 0.05 s; retry later")
    assert after == "ran"


def test_a_report_that_raises_frees_its_slot() -> None:
    slots = ReportSlots(1, wait_s=0.05)

    def broken() -> None:
        raise Invalid("a bad instant")

    async def main() -> str:
        with pytest.raises(Invalid, match="a bad instant"):
            await slots.run(broken)
        return await slots.run(lambda: "ran")

    assert anyio.run(main) == "ran"


def test_zero_slots_is_refused() -> None:
    with pytest.raises(Invalid, match="report slots: 0; at least 1"):
        ReportSlots(0)


def _hold_the_slot(client: TestClient[Litestar], slots: ReportSlots, gate: threading.Event) -> Future[bool]:
    """Start, on the app's event loop, a report that holds a slot until ``gate`` opens; return its future."""
    future = client.blocking_portal.start_task_soon(slots.run, partial(gate.wait, 60))
    _until(lambda: slots.running == 1, "the report holds the slot")
    return future


def test_each_whole_fleet_report_waits_for_a_slot_and_says_503_when_none_comes(seeded: LedgerHandle) -> None:
    slots = ReportSlots(1, wait_s=0.05)
    gate = threading.Event()
    with TestClient(create_app(db=seeded.db, config=DEFAULT, reports=slots)) as client:
        holder = _hold_the_slot(client, slots, gate)
        busy = [client.get(url) for url in REPORTS]
        paged = client.get(f"/v1/occupancy?at={AT}")
        gate.set()
        holder.result(timeout=30)
        after = [client.get(url) for url in REPORTS]
    assert [r.status_code for r in busy] == [503] * 4
    assert {r.headers["retry-after"] for r in busy} == {"1"}
    assert {r.headers["content-type"] for r in busy} == {"application/problem+json"}
    assert {r.json()["title"] for r in busy} == {"Service Unavailable"}
    assert all("as many whole-fleet reports at once as it may (1, " in r.json()["detail"] for r in busy)
    assert paged.status_code == 200  # occupancy is paged, and no report
    assert [r.status_code for r in after] == [200] * 4  # each 503 left the slot free


def test_requests_waiting_for_a_slot_hold_no_thread_so_other_endpoints_answer_meanwhile(
        seeded: LedgerHandle) -> None:
    # More waiting reports than the 40 threads Litestar runs sync handlers on: a wait inside a thread filled the
    # pool, and occupancy, /readyz and the app's after-request hook then queued behind the reports.
    slots = ReportSlots(1, wait_s=60)
    gate = threading.Event()
    waiting = 45
    with TestClient(create_app(db=seeded.db, config=DEFAULT, reports=slots)) as client, \
            ThreadPoolExecutor(waiting) as pool:
        holder = _hold_the_slot(client, slots, gate)
        reports = [pool.submit(client.get, REPORTS[n % 4]) for n in range(waiting)]
        _until(lambda: slots.waiting == waiting, f"{waiting} reports wait for the slot")
        meanwhile = [client.get(f"/v1/occupancy?at={AT}"), client.get("/readyz"), client.get("/healthz")]
        still_waiting = slots.waiting
        gate.set()
        holder.result(timeout=30)
        answers = [r.result(timeout=120) for r in reports]
    assert [r.status_code for r in meanwhile] == [200, 200, 200]
    assert still_waiting == waiting  # answered while every report still waited
    assert [r.status_code for r in answers] == [200] * waiting


def test_a_pool_with_no_free_connection_in_time_is_a_503_that_says_so(seeded: LedgerHandle) -> None:
    engine = create_engine(seeded.db.url, pool_size=1, max_overflow=0, pool_timeout=0.05)
    with _app_over(engine) as (client, db):
        with engine.connect():  # the pool's only connection, in use
            with pytest.raises(NoFreeConnection, match=r"^no free database connection"), db.reading():
                pass
            answer = client.get(f"/v1/occupancy?at={AT}")
        again = client.get(f"/v1/occupancy?at={AT}")
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["detail"].startswith("every database connection of this API process stayed in use")
    assert again.status_code == 200


def test_a_query_the_database_cancels_for_its_statement_timeout_is_a_503_that_says_so(seeded: LedgerHandle) -> None:
    # The role's statement_timeout (here the connection's) ends the audit log's query while another session holds
    # the events table. It was answered "the ledger database is not reachable", which sent operators to the network.
    with _app_over(create_engine(seeded.db.url, connect_args={"options": "-c statement_timeout=200"})) as (client, _):
        with seeded.engine.connect() as holder:
            holder.execute(text("LOCK TABLE events IN ACCESS EXCLUSIVE MODE"))
            answer = client.get("/v1/events")
            holder.rollback()
        again = client.get("/v1/events")
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    assert answer.json()["detail"].startswith("the ledger database cancelled the query (a statement_timeout")
    assert again.status_code == 200


@contextmanager
def _app_over(engine: Engine) -> Iterator[tuple[TestClient[Litestar], LedgerDatabase]]:
    """A test client of the open app over its own ``engine`` (disposed on the way out), and the database."""
    db = LedgerDatabase(engine=engine)
    try:
        with TestClient(create_app(db=db, config=DEFAULT)) as client:
            yield client, db
    finally:
        engine.dispose()


def test_the_app_has_the_default_slots_unless_given_and_a_worker_takes_serves_number(
        seeded: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    state: AppState = create_app(db=seeded.db, config=DEFAULT).state.ledger
    assert state.reports.count == DEFAULT_REPORT_SLOTS == 2
    spec = WorkerSpec(database_url=seeded.db.url, cluster=None, report_slots=5,
                      config=DEFAULT.model_dump_json(by_alias=True))
    monkeypatch.setenv(WORKER_SPEC_ENV, spec.to_json())
    app = create_app_for_worker()
    try:
        assert app.state.ledger.reports.count == 5
    finally:
        app.state.ledger.db.dispose()


@pytest.mark.parametrize(("value", "bound"), [("0", "greater than or equal to 1"), ("16", "less than or equal to 15")])
def test_serve_refuses_report_slots_out_of_range_before_anything_else(value: str, bound: str) -> None:
    result = subprocess.run([*CLI, "serve", "--report-slots", value, "--database-url",
                             "postgresql://nobody@127.0.0.1:1/none"], capture_output=True, text=True, timeout=60)
    said = " ".join(result.stderr.replace("│", " ").split())  # the error box's lines joined
    assert result.returncode == 2
    assert "Invalid value for '--report-slots' (env var: 'LEDGER_API_REPORT_SLOTS'): Input should be " + bound in said


@pytest.mark.parametrize(("environment", "options", "said"), [
    ({"LEDGER_API_REPORT_SLOTS": "1_5"}, [], "'--report-slots' (env var: 'LEDGER_API_REPORT_SLOTS'): '1_5' is not a "
                                              "whole number (digits 0-9 only)"),
    ({}, ["--report-slots", "+3"], "'--report-slots' (env var: 'LEDGER_API_REPORT_SLOTS'): '+3' is not a whole"),
    ({"LEDGER_API_WORKERS": " 2"}, [], "'--workers' (env var: 'LEDGER_API_WORKERS'): ' 2' is not a whole number"),
    ({}, ["--workers", "\u0663"], "'--workers' (env var: 'LEDGER_API_WORKERS'): '\u0663' is not a whole number"),
    ({"LEDGER_API_REPORT_SLOTS": ""}, [], "LEDGER_API_REPORT_SLOTS is set but empty; unset it for its default"),
    ({"LEDGER_API_WORKERS": ""}, [], "LEDGER_API_WORKERS is set but empty; unset it for its default"),
    ({"LEDGER_API_WORKERS": " "}, [], "'--workers' (env var: 'LEDGER_API_WORKERS'): ' ' is not a whole number"),
])
def test_serve_takes_its_counts_in_plain_digits_only_and_refuses_an_empty_variable(
        environment: dict[str, str], options: list[str], said: str) -> None:
    # Python's int() read "1_5" as 15 and " 2" or "+3" as numbers: a typo became another setting without a word.
    result = subprocess.run([*CLI, "serve", *options, "--database-url", "postgresql://nobody@127.0.0.1:1/none"],
                            capture_output=True, text=True, timeout=60,
                            env={**{k: v for k, v in os.environ.items() if not k.startswith("LEDGER_API_")},
                                 **environment})
    assert result.returncode == 2
    assert said in " ".join(result.stderr.replace("│", " ").split())


def test_a_request_whose_client_left_gives_its_place_up_and_the_next_one_gets_the_slot() -> None:
    slots = ReportSlots(1, wait_s=30)
    gate = threading.Event()
    left = anyio.Event()
    ran: list[str] = []

    async def main() -> ClientGone:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(slots.run, partial(gate.wait, 30))
            while slots.running == 0:  # until the holder has the slot
                await anyio.sleep(0.005)
            outcome: list[ClientGone] = []

            async def leaver() -> None:
                try:
                    await slots.run(lambda: ran.append("leaver"), gone=left.wait)
                except ClientGone as e:
                    outcome.append(e)

            tasks.start_soon(leaver)
            tasks.start_soon(partial(slots.run, lambda: ran.append("stayer"), gone=anyio.Event().wait))
            while slots.waiting < 2:
                await anyio.sleep(0.005)
            left.set()  # the first waiter's client closes its connection
            while slots.waiting > 1:
                await anyio.sleep(0.005)
            gate.set()
        [gone] = outcome
        return gone

    gone = anyio.run(main)
    assert str(gone) == "the client closed its connection while its report waited for a slot"
    assert ran == ["stayer"]  # the report of the client that left never ran
    assert slots.running == 0 and slots.waiting == 0


class _Lines(logging.Handler):
    """Keeps the message of every record it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_closing_the_connection_of_a_waiting_report_frees_its_place_on_a_real_server(
        seeded: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    # The request's place is given up on the ASGI server's http.disconnect, which only a real server sends
    # (the test client's transport never disconnects): uvicorn on a socket of its own, raw HTTP over sockets.
    gate = threading.Event()
    quotas = services.quotas

    def held_quotas(*args: Any, **kwargs: Any) -> Any:
        gate.wait(60)
        return quotas(*args, **kwargs)

    monkeypatch.setattr(services, "quotas", held_quotas)
    slots = ReportSlots(1, wait_s=60)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(db=seeded.db, config=DEFAULT, reports=slots), log_level="info",
                                           lifespan="on"))
    access = _Lines()  # on the logger itself (after uvicorn configured it): the app sets the root handlers up
    logging.getLogger("uvicorn.access").addHandler(access)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()

    def send(path: str) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        return conn

    try:
        _until(lambda: server.started, "the server listens")
        holder = send(f"/v1/quotas?at={AT}")
        _until(lambda: slots.running == 1, "the quotas report holds the slot")
        leaver = send(f"/v1/pending?at={AT}")
        _until(lambda: slots.waiting == 1, "the pending report waits")
        leaver.close()
        _until(lambda: slots.waiting == 0, "the closed request gives its place up")
        gate.set()
        answer = holder.recv(64)
        holder.close()
        after = send(f"/v1/pending?at={AT}")
        again = after.recv(64)
        after.close()
    finally:
        gate.set()
        server.should_exit = True
        thread.join(30)
        logging.getLogger("uvicorn.access").removeHandler(access)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert again.startswith(b"HTTP/1.1 200 ")  # the slot was free: the request that left took none
    # The access log has the request that left, with status 499, as uvicorn writes its own lines (it writes none for
    # an answer sent after the client left).
    lines = access.lines
    assert [line.split(" - ", 1)[1] for line in lines if line.endswith(" 499")] == [
        f'"GET /v1/pending?at={AT} HTTP/1.1" 499']
    assert sum(line.endswith(" 200") for line in lines) == 2
