"""Test harness for the watch workers: a fake API server, in-process workers, lockstep playing.

Every wait is bounded (``WAIT_S``) so that a broken worker fails a test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s
from sqlalchemy.exc import OperationalError

from ledger import services
from ledger.recorded import BrokenLine, WatchLine, read_history
from ledger.store import postgres as pg
from ledger.store.database import LedgerDatabase
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI
from tests.paths import HISTORIES
from workers.fake_apiserver import FakeApiServer, Released
from workers.health import WorkerMetrics
from workers.k8s.client import Clock
from workers.k8s.kinds import BY_KIND
from workers.main import run_worker
from workers.settings import WatchSettings
from workers.sink import LedgerSink, keep_projections_current

SEED_LAB: Path = HISTORIES / "seed-lab.jsonl"
WAIT_S = 15.0
"""Longest any single wait in these tests may take, s."""
CLUSTER = "default"

FAST = WatchSettings(server_timeout_s=30, request_timeout_s=10.0, list_page_size=3, batch_size=50,
                     error_backoffs_s=(0.02, 0.05, 0.1), jitter=0.2, lease_name="dra-ledger-watch",
                     lease_namespace="dra-ledger", lease_duration_s=2, renew_deadline_s=1.2, retry_period_s=0.2,
                     catch_up_interval_s=0.05, stop_grace_s=0.5, health_port=-1)
"""Small timings: backoffs of tens of ms, a 2 s Lease, list pages of 3 (so paging is exercised), a projection
catch-up every 50 ms."""


def seed_lab() -> list[WatchLine | BrokenLine]:
    """The seed-lab history lines."""
    return list(read_history(SEED_LAB))


class ClaimSource:
    """A stand-in for the ResourceClaim ``KubeSource``: what the sinks read of one (the kind, the served
    apiVersion), for tests that hand them lists or watch events directly."""

    info = BY_KIND["ResourceClaim"]
    api_version = BY_KIND["ResourceClaim"].api_version("v1")


def insert_events_failing(monkeypatch: pytest.MonkeyPatch, failures: Mapping[int, BaseException]) -> list[int]:
    """Make the n-th call (1-based) of ``pg.insert_events`` raise ``failures[n]``; the others pass through.

    Returns the list of calls made so far (1, 2, ...), which grows as the ledger writes.
    """
    real = pg.insert_events
    calls: list[int] = []

    def insert_events(*args: Any, **kwargs: Any) -> None:
        calls.append(len(calls) + 1)
        if (error := failures.get(len(calls))) is not None:
            raise error
        real(*args, **kwargs)

    monkeypatch.setattr(pg, "insert_events", insert_events)
    return calls


def lost_connection() -> OperationalError:
    """What SQLAlchemy raises when the server closes the connection in the middle of a statement."""
    return OperationalError("INSERT INTO events ...", {}, Exception("server closed the connection unexpectedly"))


def api_client(url: str) -> k8s.ApiClient:
    """A real kubernetes-asyncio client pointed at ``url`` (no auth, plain HTTP)."""
    configuration = k8s.Configuration(host=url)
    return k8s.ApiClient(configuration)


def run(coro: Callable[[], object], timeout_s: float = 90.0) -> None:
    """Run an async scenario with an overall bound."""
    async def bounded() -> None:
        await asyncio.wait_for(coro(), timeout_s)  # type: ignore[arg-type]  # a coroutine function

    asyncio.run(bounded())


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``check`` (in a thread: it may query the database) until true; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; tasks:\n{_tasks()}")
        await asyncio.sleep(0.01)


def _tasks() -> str:
    out = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=6, file=out)
    return out.getvalue()


def stored_version(db: LedgerDatabase, kind: str) -> int:
    """The stored watch checkpoint of ``kind`` as an int (fake server resourceVersions are ints), 0 if none."""
    stored = services.load_watch_checkpoints(db, CLUSTER).get(kind)
    return int(stored.resource_version) if stored else 0


async def wait_stored(db: LedgerDatabase, played: Sequence[Released], timeout_s: float = WAIT_S) -> None:
    """Wait until the ledger's checkpoints cover every played event (BOOKMARK lines need nothing)."""
    for item in played:
        if item.type == "BOOKMARK":
            continue
        rv = int(item.resource_version)
        await eventually(lambda item=item, rv=rv: stored_version(db, item.kind) >= rv,  # type: ignore[misc]
                         f"{item.kind} {item.type} {item.name} rv {rv} stored", timeout_s)


async def caught_up(db: LedgerDatabase, server: FakeApiServer, kinds: Sequence[str] | None = None,
                    timeout_s: float = WAIT_S) -> None:
    """Wait until every kind's stored checkpoint reached the server's newest resourceVersion (all listed)."""
    newest = int(server.resource_version)
    for kind in kinds or ("Namespace", "DeviceClass", "ResourceSlice", "ResourceClaim", "Pod"):
        await eventually(lambda kind=kind: stored_version(db, kind) >= newest,  # type: ignore[misc]
                         f"{kind} caught up with resourceVersion {newest}", timeout_s)


async def lockstep(server: FakeApiServer, db: LedgerDatabase, *, lines: int | None = None,
                   before_each: Callable[[], None] | None = None) -> None:
    """Play ``lines`` history lines (all when None) one at a time, each stored before the next is played.

    One line at a time, the simulated clock equals the line's ``observedAt`` when the worker stamps
    it, and the cross-kind order is the file's: the live ledger can be compared row for row.
    """
    count = 0
    while server.peek() is not None and (lines is None or count < lines):
        if before_each is not None:
            before_each()
        await wait_stored(db, server.advance(1))
        count += 1


@dataclass
class Worker:
    """One in-process worker and what it exposes."""

    task: asyncio.Task[None]
    stop: asyncio.Event
    metrics: WorkerMetrics
    client: k8s.ApiClient
    sink: LedgerSink
    identity: str

    async def close(self) -> None:
        """Ask it to stop, and wait (bounded)."""
        self.stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), WAIT_S)
        finally:
            if not self.task.done():
                self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            await self.client.close()

    async def crash(self) -> None:
        """Die without releasing the Lease or finishing anything (as a killed process would)."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.client.close()


@dataclass
class Workers:
    """Starts in-process workers against one fake server and one ledger database."""

    server: FakeApiServer
    db: LedgerDatabase
    settings: WatchSettings = field(default_factory=lambda: FAST)
    started: list[Worker] = field(default_factory=list)

    def start(self, *, identity: str = "worker-a", elect: bool = True, clock: Clock | None = None) -> Worker:
        """Start one worker whose receive times come from the fake server's simulated clock."""
        client = api_client(self.server.url)
        metrics = WorkerMetrics()
        sink = LedgerSink(self.db, cluster=CLUSTER, batch_size=self.settings.batch_size, metrics=metrics)
        stop = asyncio.Event()
        async def catch_up() -> None:
            await keep_projections_current(sink, settings=self.settings, metrics=metrics)

        task = asyncio.ensure_future(run_worker(api_client=client, sink=sink, settings=self.settings, stop=stop,
                                                clock=clock or self.server.now, identity=identity, elect=elect,
                                                metrics=metrics, while_leading=[catch_up]))
        worker = Worker(task=task, stop=stop, metrics=metrics, client=client, sink=sink, identity=identity)
        self.started.append(worker)
        return worker

    async def close(self) -> None:
        """Stop every worker still running, and close the client of every worker started (one whose run ended on its
        own too: its aiohttp session was left open, and reported unclosed when the interpreter exited)."""
        for worker in self.started:
            if worker.task.done():
                await worker.client.close()
            else:
                await worker.close()


@contextlib.asynccontextmanager
async def fake_cluster(db: LedgerDatabase, lines: Sequence[WatchLine | BrokenLine] | None = None,
                       **server_options: object) -> AsyncIterator[Workers]:
    """A fake API server playing ``lines`` (default seed-lab) and a worker starter; all closed on exit."""
    async with FakeApiServer(lines if lines is not None else seed_lab(), **server_options) as server:  # type: ignore[arg-type]
        workers = Workers(server=server, db=db)
        try:
            yield workers
        finally:
            await workers.close()


def assert_same_ledger(live: LedgerHandle, clean: LedgerHandle) -> None:
    """Assert two ledgers hold the same events and read models (LedgerHandle.snapshot), showing rows that differ."""
    a, b = live.snapshot(), clean.snapshot()
    if a == b:
        return
    lines: list[str] = []
    for table in sorted(set(a) | set(b)):
        only_live = set(map(repr, a.get(table, []))) - set(map(repr, b.get(table, [])))
        only_clean = set(map(repr, b.get(table, []))) - set(map(repr, a.get(table, [])))
        lines += [f"{table}: live only {r}" for r in sorted(only_live)]
        lines += [f"{table}: clean only {r}" for r in sorted(only_clean)]
        if not only_live and not only_clean and a.get(table) != b.get(table):
            lines.append(f"{table}: same rows, different multiplicity (a duplicate)")
    raise AssertionError("ledgers differ:\n" + "\n".join(line[:600] for line in lines))


def kubeconfig(path: Path, url: str) -> Path:
    """Write a kubeconfig for the fake server at ``url`` (plain HTTP, no credentials)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {url}\n"
        "users:\n- name: fake\n  user: {}\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n", encoding="utf-8")
    return path


FAST_ENV = {
    "LEDGER_WATCH_SERVER_TIMEOUT_S": "30", "LEDGER_WATCH_REQUEST_TIMEOUT_S": "10",
    "LEDGER_WATCH_ERROR_BACKOFFS_S": "[0.02, 0.05, 0.1]", "LEDGER_WATCH_LEASE_DURATION_S": "2",
    "LEDGER_WATCH_RENEW_DEADLINE_S": "1.2", "LEDGER_WATCH_RETRY_PERIOD_S": "0.2", "LEDGER_WATCH_STOP_GRACE_S": "0.5",
    "LEDGER_WATCH_HEALTH_HOST": "127.0.0.1",
}


def spawn_worker(*, server_url: str, database_url: str, directory: Path, identity: str,
                 health_port: int = -1, elect: bool = True, jobs: bool = False,
                 env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``dra-ledger watch`` in a process of its own (receive times from the fake server's clock).

    ``jobs``: also run the report jobs while leader (they use the wall clock, so off by default); ``env``: settings
    over :data:`FAST_ENV`."""
    config = kubeconfig(directory / f"{identity}.kubeconfig", server_url)
    argv = [*CLI, "watch", "--kubeconfig", str(config),
            "--database-url", database_url, "--cluster", CLUSTER, "--identity", identity,
            "--health-port", str(health_port), "--clock-url", server_url,
            "--leader-election" if elect else "--no-leader-election", "--jobs" if jobs else "--no-jobs"]
    log = (directory / f"{identity}.log").open("ab")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **FAST_ENV, **(env or {})})


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``process`` if it still runs, and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=WAIT_S)


def metric_sample(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    """Sum of a metric's samples named ``name`` whose labels include ``labels`` (0 when there is none)."""
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
