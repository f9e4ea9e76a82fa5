"""A second Ctrl-C while ``serve`` stops (uvicorn's forced exit) ends the app's lifespan as a shutdown: no
traceback, exit code 0, one worker or several."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.types import LifeSpanReceiveMessage, LifeSpanSendMessage

from api.server import LifespanEndsOnCancel
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI, free_port

LIFESPAN_SCOPE: Any = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}


def test_a_lifespan_cancelled_while_it_waits_for_the_shutdown_message_shuts_the_app_down() -> None:
    hooks: list[str] = []
    app = Litestar(route_handlers=[], on_startup=[lambda: hooks.append("startup")],
                   on_shutdown=[lambda: hooks.append("shutdown")])
    sent: list[str] = []

    async def main() -> None:
        messages: asyncio.Queue[LifeSpanReceiveMessage] = asyncio.Queue()
        await messages.put({"type": "lifespan.startup"})

        async def receive() -> LifeSpanReceiveMessage:
            return await messages.get()  # the shutdown message never comes: a forced exit skipped it

        async def send(message: LifeSpanSendMessage) -> None:
            sent.append(message["type"])

        lifespan = asyncio.ensure_future(LifespanEndsOnCancel(app)(LIFESPAN_SCOPE, receive, send))
        while "lifespan.startup.complete" not in sent:
            await asyncio.sleep(0)
        lifespan.cancel()  # what the event loop's close does to the tasks left
        await lifespan  # ends as a shutdown; without the wrapper, CancelledError after a "shutdown.failed"

    asyncio.run(main())
    assert hooks == ["startup", "shutdown"]
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_requests_pass_through_the_wrapper_unchanged(ledger: LedgerHandle) -> None:
    from litestar.testing import TestClient

    from api.app import create_app
    from ledger.config import LedgerConfig

    with TestClient(LifespanEndsOnCancel(create_app(db=ledger.db, config=LedgerConfig()))) as client:
        answer = client.get("/v1/occupancy")
    assert answer.status_code == 200
    assert answer.json()["totals"]["devices"] == 0  # an empty ledger


@pytest.mark.parametrize("workers", [1, 2])
def test_two_ctrl_cs_20_ms_apart_while_serve_stops_end_it_without_a_traceback(ledger: LedgerHandle, tmp_path: Path,
                                                                              workers: int) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the server and its workers. The second one, while
    # uvicorn stops, forces its exit: it skipped the lifespan shutdown, and Litestar's lifespan, cancelled as the
    # event loop closed, logged "ERROR: Traceback ... CancelledError" (every time with one worker).
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [*CLI, "serve", "--port", str(free_port()), "--workers", str(workers), "--database-url", ledger.db.url],
            stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not a shell's background job
    try:
        deadline = time.monotonic() + 120  # start-up on a busy machine, not a timing assertion
        while (log.read_text().count(STARTED) < workers and time.monotonic() < deadline
               and process.poll() is None):
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGINT)
        time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert output.count(STARTED) == workers, output  # every worker was serving when the Ctrl-Cs came
    assert process.returncode == 0, output
    assert "Traceback" not in output and "ERROR" not in output, output


STARTED = "Application startup complete."
"""uvicorn's line once a process's lifespan startup is done (one per worker)."""
