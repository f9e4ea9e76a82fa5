"""Workers as real processes (``dra-ledger watch``): SIGKILL mid-batch, and two replicas on one Lease."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from sqlalchemy import text

from ledger.recorded import WatchLine
from ledger.testing.handle import LedgerHandle
from tests.factories import free_port
from tests.workers.harness import (
    SEED_LAB,
    WAIT_S,
    assert_same_ledger,
    caught_up,
    eventually,
    fake_cluster,
    lockstep,
    run,
    seed_lab,
    spawn_worker,
    stop_process,
    stored_version,
    wait_stored,
)

_BLOCKED = text(
    "SELECT a.pid FROM pg_stat_activity a WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' "
    "AND a.query ILIKE '%translator_state%'")
_WROTE_EVENTS = text(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "WHERE l.pid = :pid AND c.relname = 'events' AND l.mode = 'RowExclusiveLock'")


@pytest.mark.parametrize(("stop", "exit_code", "grace"), [(signal.SIGKILL, -signal.SIGKILL, None),
                                                          (signal.SIGTERM, 0, None), (signal.SIGTERM, 0, "600")],
                         ids=["SIGKILL", "SIGTERM", "SIGTERM twice"])
def test_a_worker_stopped_mid_batch_and_restarted_leaves_the_ledger_identical(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path, stop: signal.Signals, exit_code: int,
        grace: str | None) -> None:
    # SIGTERM: the batch waits for a lock this test holds until the worker has exited, so the worker stops only
    # because its write is cancelled once LEDGER_WATCH_STOP_GRACE_S is over (it waited for the lock without end).
    # With a grace of ten minutes, only a second SIGTERM can cut it short (it did nothing).
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)
    lines = seed_lab()
    # The batch to kill: the allocation of train-0's claim (09:02:05.498), which appends ClaimAllocated.
    target = next(i for i, x in enumerate(lines) if isinstance(x, WatchLine) and x.observed_at is not None
                  and x.observed_at.isoformat().startswith("2026-11-02T09:02:05"))
    claim_key = "claim:897a4b4b-03a9-30aa-6df0-70dbf8841cb8"

    async def scenario() -> None:
        async with fake_cluster(live.db, lines) as cluster:
            server = cluster.server
            server.advance(4)
            worker = spawn_worker(server_url=server.url, database_url=live.db.url, directory=tmp_path,
                                  identity="doomed", elect=False,
                                  env={"LEDGER_WATCH_STOP_GRACE_S": grace} if grace else None)
            try:
                await caught_up(live.db, server, timeout_s=WAIT_S * 2)  # includes the process start
                await lockstep(server, live.db, lines=target - 4)
                with live.engine.connect() as conn, conn.begin():
                    # Hold the claim's translator_state row: the worker's transaction writes its
                    # observations and events, then waits on this lock while saving the state.
                    assert conn.execute(text("SELECT 1 FROM translator_state WHERE cluster = 'default' "
                                             "AND key = :k FOR UPDATE"), {"k": claim_key}).scalar() == 1
                    played = server.advance(1)
                    assert played[0].type == "MODIFIED" and played[0].kind == "ResourceClaim"
                    pids: list[int] = []

                    def blocked() -> bool:
                        with live.engine.connect() as probe:
                            pids[:] = list(probe.execute(_BLOCKED).scalars())
                            return bool(pids) and probe.execute(_WROTE_EVENTS, {"pid": pids[0]}).scalar() == 1

                    await eventually(blocked, "the worker blocked inside its batch, events already inserted")
                    worker.send_signal(stop)
                    if grace is not None:
                        await asyncio.sleep(0.5)
                        assert worker.poll() is None  # waiting out its grace
                        worker.send_signal(stop)
                    assert worker.wait(timeout=WAIT_S) == exit_code
                    conn.rollback()
                said = (tmp_path / "doomed.log").read_text(encoding="utf-8")
                assert ("the append transaction in flight is cancelled" in said) == (stop == signal.SIGTERM)
                if stop == signal.SIGTERM:
                    assert "stopping (SIGTERM): an append transaction in flight gets up to " in said
                    assert ("as a second signal came" if grace else "of the stop (LEDGER_WATCH_STOP_GRACE_S)") in said
                assert stored_version(live.db, "ResourceClaim") < int(played[0].resource_version)
                assert "ClaimAllocated" not in {e.type for e in live.events() if e.stream == claim_key}
                worker = spawn_worker(server_url=server.url, database_url=live.db.url, directory=tmp_path,
                                      identity="restarted", elect=False)
                # Simulated time stands still until the restarted worker stored the event again, so the
                # re-delivered event carries the same receive time as in the clean run.
                await wait_stored(live.db, played, timeout_s=WAIT_S * 2)
                await lockstep(server, live.db)
            finally:
                stop_process(worker)

    run(scenario, timeout_s=120)
    assert_same_ledger(live, clean)


async def _metrics(port: int) -> dict[str, float]:
    """GET /healthz, /readyz (both must answer 200) and /metrics of a worker; retried until it listens."""
    deadline = time.monotonic() + WAIT_S * 2
    while True:
        try:
            return await _metrics_once(port)
        except aiohttp.ClientConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _metrics_once(port: int) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                assert resp.status == 200, path
        async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
            body = await resp.text()
    values: dict[str, float] = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def test_two_workers_at_once_one_writes_and_the_other_takes_over_when_it_is_killed(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    clean, live = ledger_factory(), ledger_factory()
    clean.replay(SEED_LAB)

    async def scenario() -> None:
        async with fake_cluster(live.db) as cluster:
            server = cluster.server
            server.advance(4)
            ports = {"worker-a": free_port(), "worker-b": free_port()}
            procs: dict[str, subprocess.Popen[bytes]] = {}

            def holder() -> object:
                lease = server.lease("dra-ledger", "dra-ledger-watch")
                spec = lease.get("spec") if lease else None
                return spec.get("holderIdentity") if isinstance(spec, dict) else None

            try:
                procs["worker-a"] = spawn_worker(server_url=server.url, database_url=live.db.url,
                                                 directory=tmp_path, identity="worker-a", health_port=ports["worker-a"],
                                                 jobs=True)
                await eventually(lambda: holder() == "worker-a", "worker-a holds the Lease", WAIT_S * 2)
                procs["worker-b"] = spawn_worker(server_url=server.url, database_url=live.db.url,
                                                 directory=tmp_path, identity="worker-b", health_port=ports["worker-b"],
                                                 jobs=True)
                await caught_up(live.db, server, timeout_s=WAIT_S * 2)
                await lockstep(server, live.db, lines=15)
                a = await _metrics(ports["worker-a"])
                b = await _metrics(ports["worker-b"])  # answers, so it is up: a standby
                assert a["dra_ledger_leader"] == 1 and a.get("dra_ledger_watch_events_total", 0) > 0
                assert b["dra_ledger_leader"] == 0 and b.get("dra_ledger_watch_events_total", 0) == 0
                assert holder() == "worker-a"

                procs["worker-a"].send_signal(signal.SIGKILL)  # no release: the Lease must expire
                procs["worker-a"].wait(timeout=WAIT_S)
                await lockstep(server, live.db)
                assert holder() == "worker-b"
                b = await _metrics(ports["worker-b"])
                assert b["dra_ledger_leader"] == 1 and b.get("dra_ledger_watch_events_total", 0) > 0
                lease = server.lease("dra-ledger", "dra-ledger-watch")
                assert lease is not None and lease["spec"]["leaseTransitions"] == 1  # type: ignore[index,call-overload]
            finally:
                for proc in procs.values():
                    stop_process(proc)

    run(scenario, timeout_s=120)
    assert_same_ledger(live, clean)
