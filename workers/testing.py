"""pytest plugin shipped with dra-ledger (entry point ``pytest11``): a fake Kubernetes API server per test.

Fixture ``fake_apiserver``: a factory ``fake_apiserver(history, served=None)`` that starts a
:class:`workers.fake_apiserver.FakeApiServer` on 127.0.0.1 in a thread of its own (its own event
loop), so that synchronous tests, kubectl, the sync ``kubernetes`` client or a ``dra-ledger watch``
subprocess can talk to it. Every server is stopped at the end of the test. Example::

    def test_my_controller_survives_a_410(fake_apiserver):
        server = fake_apiserver("histories/my-cluster.jsonl")
        server.advance(10)              # play 10 lines; the clock is the 10th line's observedAt
        server.expire()                 # older resourceVersions now answer 410
        run_my_controller(server.url)
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger.recorded import BrokenLine, WatchLine, read_history
from workers.fake_apiserver import FakeApiServer, Fault, Released

T = TypeVar("T")
START_TIMEOUT_S = 30.0
"""Longest a control call on the server thread may take, s."""


class ThreadedFakeApiServer:
    """A :class:`FakeApiServer` on its own event loop in a daemon thread, with a synchronous API."""

    def __init__(self, history: Iterable[WatchLine | BrokenLine], *,
                 served: Mapping[str, Sequence[str]] | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-apiserver", daemon=True)
        self._thread.start()
        self.server: FakeApiServer = self._call(self._make(list(history), served))
        self.url: str = self._call(self.server.start())

    @staticmethod
    async def _make(history: list[WatchLine | BrokenLine], served: Mapping[str, Sequence[str]] | None) -> FakeApiServer:
        return FakeApiServer(history, served=served)  # built on the server loop (its Condition belongs there)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(START_TIMEOUT_S)

    def _run(self, fn: Callable[[], T]) -> T:
        async def call() -> T:
            return fn()
        return self._call(call())

    def advance(self, count: int | None = 1, *, until: datetime | None = None) -> list[Released]:
        """Play history lines forward (see :meth:`FakeApiServer.advance`)."""
        return self._run(lambda: self.server.advance(count, until=until))

    def expire(self) -> None:
        """Compact: older resourceVersions answer 410 from now on."""
        self._run(self.server.expire)

    def inject(self, *faults: Fault) -> None:
        """Queue faults (see :class:`Fault`)."""
        self._run(lambda: self.server.inject(*faults))

    @property
    def now(self) -> datetime:
        """The simulated clock."""
        return self.server.clock

    @property
    def requests(self) -> list[str]:
        """``METHOD path?query`` of every request so far."""
        return self._run(lambda: list(self.server.requests))

    def stop(self) -> None:
        """Stop the server and its thread."""
        try:
            self._call(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT_S)
            self._loop.close()


@pytest.fixture()
def fake_apiserver() -> Iterator[Callable[..., ThreadedFakeApiServer]]:
    """A factory of fake API servers: ``fake_apiserver(history_path_or_lines, served=None)``."""
    started: list[ThreadedFakeApiServer] = []

    def start(history: Path | str | Iterable[WatchLine | BrokenLine], *,
              served: Mapping[str, Sequence[str]] | None = None) -> ThreadedFakeApiServer:
        lines = read_history(history) if isinstance(history, str | Path) else history
        server = ThreadedFakeApiServer(lines, served=served)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
