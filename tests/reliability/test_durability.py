"""Durability: an append commits whole or not at all, and a database outage is a clean, retryable answer.

* A replay process is killed with SIGKILL at random instants, in a loop; after each kill every stored
  observation has all of its events and no event lacks its observation, and after running the replay
  again the ledger equals a clean run's.
* With PostgreSQL stopped, every API read answers 503 problem details with ``Retry-After`` (no hang, no 500,
  no hang), ``/readyz`` says unavailable, and the CLI prints one line and exits 2; once the server is back
  the same requests answer 200.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger.embedded import EmbeddedPostgres
from ledger.store import schema
from ledger.store.database import LedgerDatabase
from ledger.testing import pg
from ledger.testing.handle import LedgerHandle
from tests import factories as f
from tests.reliability.world import READ_PATHS, client, line

KILLS = 5
"""Kills at the least; more, up to :data:`MAX_KILLS`, until :data:`MID_WAY_KILLS` have landed while batches were
being written (where a kill lands depends on the machine's speed: a fast replay can be past its last batch)."""
MAX_KILLS = 15
MID_WAY_KILLS = 3
CLAIMS = 200


def busy_history(path: Path, claims: int = 400) -> Path:
    """A history of ``claims`` claims created, allocated, reserved and deleted over 8 GPUs (about 2,000 lines)."""
    pool = f.uid("pool")
    lines = [line("ADDED", f.namespace("busy", "team-busy"), 0),
             line("ADDED", f.resource_slice(name="busy", pool=pool, devices=[f.gpu(f"gpu-{i}") for i in range(8)]), 0)]
    for n in range(claims):
        uid, minute, device = f.uid("busy"), 1 + n, f"gpu-{n % 8}"
        base: dict[str, Any] = {"name": f"c{n}", "namespace": "busy", "claim_uid": uid, "pool": pool}
        lines += [line("ADDED", f.claim(**base), minute),
                  line("MODIFIED", f.claim(**base, results=[device], allocated_at=minute + 0.1), minute + 0.1),
                  line("MODIFIED", f.claim(**base, results=[device], allocated_at=minute + 0.1,
                                           reserved=[(f"p{n}", f"pod-{uid}")]), minute + 0.2),
                  line("DELETED", f.claim(**base, results=[device], allocated_at=minute + 0.1), minute + 7.5)]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_replay(url: str, path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "LEDGER_DATABASE_URL": url, "LEDGER_BATCH_SIZE": "40"}
    return subprocess.Popen([*f.CLI, "replay", str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def assert_batches_whole(ledger: LedgerHandle, clean: LedgerHandle) -> None:
    """Every stored observation has all the events the clean run made from it, and nothing else exists."""
    query = text("SELECT o.digest, count(e.event_id) FROM observations o LEFT JOIN events e "
                 "ON e.source->>'digest' = o.cluster || '/' || o.digest GROUP BY o.digest")
    with ledger.engine.connect() as conn:
        mine = {str(r[0]): int(r[1]) for r in conn.execute(query).all()}
        orphans = conn.execute(text(
            "SELECT count(*) FROM events e WHERE NOT EXISTS (SELECT 1 FROM observations o "
            "WHERE e.source->>'digest' = o.cluster || '/' || o.digest)")).scalar_one()
    with clean.engine.connect() as conn:
        expected = {str(r[0]): int(r[1]) for r in conn.execute(query).all()}
    assert orphans == 0
    assert {d: expected[d] for d in mine} == mine


def test_a_replay_killed_at_random_points_leaves_whole_batches_and_finishes_equal_to_a_clean_run(
        ledger_factory: Any, tmp_path: Path) -> None:
    path = busy_history(tmp_path / "busy.jsonl", claims=CLAIMS)
    clean = ledger_factory()
    started = time.monotonic()
    done = run_replay(clean.db.url, path)
    assert done.wait(timeout=120) == 0, done.stderr.read() if done.stderr else ""
    duration = time.monotonic() - started
    expected = clean.snapshot()
    rng = random.Random(7)
    killed_mid_way = 0
    total = 2 + 4 * CLAIMS
    attempt = 0
    while attempt < KILLS or (killed_mid_way < MID_WAY_KILLS and attempt < MAX_KILLS):
        ledger = ledger_factory()
        process = run_replay(ledger.db.url, path)
        if attempt % 3 == 2:
            time.sleep(rng.uniform(0.3, duration))  # anywhere, catching up the projections included
        else:
            # Right after a random batch committed, while the next one is being written.
            threshold = rng.randrange(1, total - 100)
            while observations(ledger) < threshold and process.poll() is None:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.01))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        killed_mid_way += 0 < observations(ledger) < total
        assert_batches_whole(ledger, clean)
        again = run_replay(ledger.db.url, path)
        assert again.wait(timeout=120) == 0
        assert ledger.snapshot() == expected
        attempt += 1
    assert killed_mid_way >= MID_WAY_KILLS, "the kills should land while batches are being written"


def observations(ledger: LedgerHandle) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM observations")).scalar_one())


@pytest.fixture()
def own_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A PostgreSQL of our own (embedded, run as ``nobody`` when we are root) with a seeded ledger."""
    with pg.temporary_data_dir() as data_dir:
        server = EmbeddedPostgres(data_dir)
        try:
            admin = server.start()
            url = pg.create_database(admin, "ledger")
            db = LedgerDatabase.from_url(url)
            schema.upgrade(db.engine)
            db.dispose()
            yield server, url
        finally:
            server.stop()


def test_with_postgresql_down_the_api_answers_503_problem_details_and_recovers(
        own_server: tuple[EmbeddedPostgres, str], tmp_path: Path) -> None:
    server, url = own_server
    ledger = LedgerHandle(engine=LedgerDatabase.from_url(url).engine)
    ledger.replay(busy_history(tmp_path / "h.jsonl", claims=5))
    paths = [*READ_PATHS, "/v1/events", "/v1/claims/busy/c1/history",
             "/v1/devices/gpu.example.com/x/gpu-0/timeline"]
    with client(ledger) as api:
        assert all(api.get(p).status_code in (200, 404) for p in paths)
        before = api.get("/v1/occupancy", params={"at": f.stamp(4)}).json()
        assert before["totals"]["allocated"] == 3
        server.stop()
        for path in [*paths, "/v1/usage?from=2026-11-02T09:00:00Z&to=2026-11-02T10:00:00Z"]:
            response = api.get(path, timeout=60)  # a hang fails here; no wall-clock assertion
            assert response.status_code == 503, (path, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.headers["retry-after"] == "5"
            body = response.json()
            assert body["status"] == 503 and body["title"] == "Service Unavailable"
            assert "Traceback" not in response.text and "psycopg" not in response.text
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["database"] == "unreachable"
        assert api.get("/healthz").status_code == 200
        metrics = api.get("/metrics")
        assert metrics.status_code == 200 and "dra_ledger_database_up 0.0" in metrics.text
        during = api.get("/v1/occupancy", params={"at": f.stamp(4)})
    # The server comes back (on a new port, as the embedded server picks a free one): nothing committed was lost.
    back = LedgerHandle(engine=LedgerDatabase.from_url(server.start().rsplit("/", 1)[0] + "/ledger").engine)
    with client(back) as api:
        after = api.get("/v1/occupancy", params={"at": f.stamp(4)})
        assert after.status_code == 200 and api.get("/readyz").status_code == 200
    assert during.status_code == 503
    assert after.json() == before
    back.engine.dispose()


def test_with_postgresql_down_the_cli_prints_one_line_and_exits_2(own_server: tuple[EmbeddedPostgres, str],
                                                                   tmp_path: Path) -> None:
    server, url = own_server
    path = busy_history(tmp_path / "h.jsonl", claims=2)
    server.stop()
    env = {**os.environ, "LEDGER_DATABASE_URL": url}
    for args in (["replay", str(path)], ["occupancy"], ["claims"], ["rebuild"]):
        result = subprocess.run([*f.CLI, *args], env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
        assert "connection" in lines[0].lower() or "database" in lines[0].lower()
