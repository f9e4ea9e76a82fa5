"""The dra-ledger benchmark suite: one command, a table on stdout, a JSON file with every figure.

Run (needs a PostgreSQL the benchmark may create databases on; default the local one)::

    .venv/bin/python -m bench.run                       # default size, a few minutes on 2 cores
    .venv/bin/python -m bench.run --admin-url postgresql://postgres@127.0.0.1:5432/postgres -o out.json
    .venv/bin/python -m bench.run --skip ingest,worker --query-url URL   # queries + API on an existing ledger
    .venv/bin/python -m bench.run --skip ingest,queries,api --fleet-hours 0.5 --fleet-utilisation 10 \
        --worker-relist -o bench/results-worker-100k.json   # the worker at 100,000 claims, ~20 minutes

Phases (each figure is printed next to its DESIGN §10 target):

1. ``ingest``: a simulated history (``ledger.simulate``) is translated and appended (observations,
   events, translator state) through ``services.ingest``; watch events/s. The same rows are then
   dumped and loaded with a raw ``COPY`` into an empty ledger database in the same run: the ratio
   ingest-rate / COPY-rate is what the translator and the append protocol cost over the bare disk path.
2. ``rebuild``: ``runner.rebuild`` of every read model from position 0; events/s.
3. ``worker``: a ``dra-ledger fake-apiserver`` plays a 40,000-device fleet (5,000 nodes x 8 GPUs by
   default) and a ``dra-ledger watch`` process follows it into a fresh ledger; peak RSS (VmHWM) of
   the worker process, sampled from ``/proc``, and the claims it recorded (created, live at the end).
   The ``--fleet-*`` options set the fleet's :class:`~ledger.simulate.FleetSpec` knobs: with demand above
   the fleet's GPUs (``--fleet-utilisation 10``), the workloads that find no free device keep their claims
   pending, so 30 simulated minutes leave over 100,000 live claims (DESIGN §10's worker size).
   ``--worker-relist`` then restarts the worker on the same ledger with every watch answered 410 once, so
   it lists every kind again (the largest lists a worker holds), and reports that worker's peak as well.
4. ``occupancy`` / ``usage``: on the fleet ledger of phase 3 (40,000 devices; with ``--query-url``, on
   another ledger, e.g. the 10 M-event one of :mod:`bench.full`), ``occupancy`` at random instants
   (p50/p99 of what ``GET /v1/occupancy`` serves without a page token: the first page at the default
   limit plus the totals over every device, computed in SQL) and device-hours per team over a 30-day
   window.
5. ``api``: ``dra-ledger serve --workers N`` on loopback against the fleet ledger (``--api-workers``, default
   one a core, as the README advises for a machine that serves the API), loaded by a separate process
   (``bench.load``) asking ``GET /v1/occupancy`` (first page, default limit) for a fixed time.

Nothing here runs in the test suite; tests never assert wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from ledger import services
from ledger.projections import queries, runner
from ledger.recorded import read_history
from ledger.simulate import FleetSpec, SimulationSummary, write_history
from ledger.store.database import LedgerDatabase
from ledger.testing.pg import create_database, drop_database
from ledger.translator.relist import RELISTED_KINDS

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
CLUSTER = "bench"

COPY_TABLES = {
    "observations": "cluster, digest, status, kind, api_version, namespace, name, uid, resource_version, watch_type, "
                    "observed_at, recorded_at, origin, error, body",
    "events": "event_id, cluster, stream, stream_position, type, occurred_at, recorded_at, schema_version, payload, "
              "source",
    "translator_state": "cluster, key, state",
}
"""The rows one ingest writes, by table: what the raw-COPY baseline loads."""


@dataclass(slots=True)
class Figure:
    """One measured figure with its target (``None``: reported, no target)."""

    name: str
    value: float
    unit: str
    target: str | None = None
    met: bool | None = None
    note: str = ""

    def row(self) -> list[str]:
        """The figure as table cells: name, value with unit, target, verdict, note."""
        verdict = "" if self.met is None else ("met" if self.met else "MISSED")
        return [self.name, f"{self.value:,.{2 if self.value < 10 else 1}f} {self.unit}", self.target or "", verdict,
                self.note]


@dataclass(slots=True)
class Report:
    """Every figure of a run, plus the sizes they were measured at."""

    figures: list[Figure] = field(default_factory=list)
    sizes: dict[str, object] = field(default_factory=dict)

    def add(self, figure: Figure) -> None:
        """Record ``figure`` and print it with its verdict at once (long runs show progress)."""
        self.figures.append(figure)
        print(f"  {figure.name}: {figure.value:,.1f} {figure.unit}"
              + (f" (target {figure.target}: {'met' if figure.met else 'MISSED'})" if figure.target else ""),
              flush=True)

    def table(self) -> str:
        """Every figure as an aligned text table."""
        rows = [["figure", "measured", "target", "", "note"], *[f.row() for f in self.figures]]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths))
        return "\n".join(lines)


@contextmanager
def fresh_database(admin_url: str, label: str, *, keep: bool) -> Iterator[LedgerDatabase]:
    """A new database at the head schema revision, dropped afterwards unless ``keep``."""
    name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
    db = LedgerDatabase.from_url(create_database(admin_url, name))
    db.upgrade()
    try:
        yield db
    finally:
        db.dispose()
        if not keep:
            drop_database(admin_url, name)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    """Run ``fn``; return (wall seconds, its result)."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def count(engine: Engine, table: str) -> int:
    """Rows in ``table`` (``count(*)``)."""
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


# --- phase 1 and 2: ingest vs raw COPY, rebuild ------------------------------------------------


def dump_rows(db: LedgerDatabase, workdir: Path) -> dict[str, Path]:
    """The rows an ingest wrote, as COPY text files in ``workdir``, by table (streamed: a 10 M-event
    ledger's rows are larger than memory)."""
    raw = db.engine.raw_connection()
    try:
        out: dict[str, Path] = {}
        cur = raw.driver_connection.cursor()  # type: ignore[union-attr]  # psycopg 3 connection
        for table, cols in COPY_TABLES.items():
            path = workdir / f"{table}.copy"
            with path.open("wb") as f, cur.copy(f"COPY (SELECT {cols} FROM {table} ORDER BY 1) TO STDOUT") as copy:
                for chunk in copy:
                    f.write(chunk)
            out[table] = path
        return out
    finally:
        raw.close()


def copy_rows(db: LedgerDatabase, dump: dict[str, Path]) -> float:
    """Load ``dump`` with raw COPY into the (empty) ledger ``db`` in one transaction; seconds taken
    (reading the files included, as the ingest's reading of its history file is)."""
    raw = db.engine.raw_connection()
    try:
        conn = raw.driver_connection
        start = time.perf_counter()
        with conn.cursor() as cur:  # type: ignore[union-attr]  # psycopg 3 connection
            for table, cols in COPY_TABLES.items():
                with dump[table].open("rb") as f, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                    while block := f.read(1 << 20):
                        copy.write(block)
        conn.commit()  # type: ignore[union-attr]
        return time.perf_counter() - start
    finally:
        raw.close()


def phase_ingest(report: Report, admin_url: str, history: Path, summary: SimulationSummary, *, keep: bool) -> None:
    """Phases 1 and 2: ingest vs raw COPY of the same rows, then rebuild (see the module docstring)."""
    with fresh_database(admin_url, "ingest", keep=keep) as db:
        print(f"ingest: {summary.lines:,} lines", flush=True)
        seconds, ingested = timed(lambda: services.ingest(db, read_history(history), cluster=CLUSTER))
        assert isinstance(ingested, services.IngestReport)
        events = ingested.events
        report.sizes.update({"ingestLines": summary.lines, "ingestEvents": events})
        rate = summary.lines / seconds
        dump = dump_rows(db, history.parent)
        with fresh_database(admin_url, "copy", keep=False) as target:
            copy_s = copy_rows(target, dump)
        size = sum(p.stat().st_size for p in dump.values())
        for path in dump.values():
            path.unlink()
        copy_rate = summary.lines / copy_s
        ratio = copy_s / seconds
        report.add(Figure("ingest (translate + append)", rate, "watch events/s", "≥ 20,000/s", rate >= 20_000,
                          f"{events:,} ledger events, {events / seconds:,.0f} events/s"))
        report.add(Figure("raw COPY of the same rows", copy_rate, "watch events/s", None, None,
                          f"{copy_s:.2f} s for {size / 1e6:,.1f} MB"))
        report.add(Figure("ingest / raw COPY", ratio, "x", "≥ 0.3", ratio >= 0.3))
        print("rebuild", flush=True)
        seconds, applied = timed(lambda: runner.rebuild(db.engine))
        assert isinstance(applied, int)
        rate = applied / seconds
        report.add(Figure("projection rebuild", rate, "events/s", "≥ 50,000/s", rate >= 50_000,
                          f"{applied:,} events in {seconds:.1f} s"))


# --- phase 3: the worker following a fleet -----------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_bytes(pid: int) -> int:
    """VmHWM (peak resident set) of ``pid`` from /proc, bytes; 0 when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def wait_port(port: int, timeout_s: float) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections.

    Raises:
        TimeoutError: nothing listened within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child process: SIGTERM, then SIGKILL if it has not exited within 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def cli(*args: str) -> list[str]:
    """The command line running ``dra-ledger`` with ``args`` under this interpreter."""
    return [sys.executable, "-c", "from ledger.cli import main; main()", *args]


def stored_lines(engine: Engine, *, at_least: int) -> int:
    """Watch lines stored so far (rows of table ``observations``), cheaply while fewer than ``at_least``.

    While the worker is behind, the highest ``observation_id`` stands in (an index lookup; identity values
    lost to rolled-back writes make it an overestimate); once it reaches ``at_least``, the exact ``count(*)``.
    Why: the poll runs every second, and a ``count(*)`` scans every row, on the cores the measured worker uses.
    """
    with engine.connect() as conn:
        highest = int(conn.execute(text("SELECT coalesce(max(observation_id), 0) FROM observations")).scalar_one())
    return highest if highest < at_least else count(engine, "observations")


def claim_counts(engine: Engine) -> dict[str, int]:
    """ResourceClaims the ledger recorded for :data:`CLUSTER`, from read model ``claims`` (one row per claim uid).

    Returns:
        ``created`` (every claim), ``live`` (not deleted), ``allocated`` and ``pending`` (live, by ``state``).
        Complete only once the projections caught up with the worker's events.
    """
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT count(*), count(*) FILTER (WHERE state <> 'deleted'), count(*) FILTER (WHERE state = 'allocated'), "
            "count(*) FILTER (WHERE state = 'pending') FROM claims WHERE cluster = :cluster"),
            {"cluster": CLUSTER}).one()
    return {"created": int(row[0]), "live": int(row[1]), "allocated": int(row[2]), "pending": int(row[3])}


def live_entries(engine: Engine) -> dict[str, int]:
    """Live (not deleted) translator entries of :data:`CLUSTER` by key prefix (``claim``, ``pod``, ``pool``, ...):
    what a worker holds in memory (table ``translator_state``; tombstones stay in the database)."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT split_part(key, ':', 1), count(*) FROM translator_state WHERE cluster = :cluster "
            "AND state -> 'deleted' IS DISTINCT FROM 'true'::jsonb GROUP BY 1 ORDER BY 1"), {"cluster": CLUSTER}).all()
    return {str(prefix): int(n) for prefix, n in rows}


@dataclass(slots=True)
class Followed:
    """What :func:`watch_worker` saw of one ``dra-ledger watch`` process."""

    peak_bytes: int
    """VmHWM of the worker when it was stopped (or last seen), bytes."""
    seconds: float
    """From the worker's start until ``done`` held (or the timeout), s."""
    done: bool
    """``done`` held before the timeout."""
    peak_at_s: float
    """Seconds after the start when the highest VmHWM was first read (within the 1 s sampling)."""
    timeline: list[list[float]]
    """``[elapsed s, progress, RSS MiB]`` about every 30 s, the last at the end."""

    def rss_figure(self, name: str, note: str) -> Figure:
        """The peak RSS as a figure in MiB against the ≤ 500 MB target; ``note`` then when the peak came."""
        return Figure(name, self.peak_bytes / 2**20, "MiB", "≤ 500 MB", self.peak_bytes <= 500 * 10**6,
                      f"{note}; peak reached after {self.peak_at_s:.0f} s")


def watch_worker(worker: subprocess.Popen[bytes], *, start: float, progress: Callable[[], tuple[int, bool]],
                 timeout_s: float) -> Followed:
    """Sample ``worker``'s peak RSS once a second until ``progress()`` says done or ``timeout_s`` passed.

    Args:
        worker: a running ``dra-ledger watch`` process (left running).
        start: ``time.perf_counter()`` when the worker was started (elapsed times count from it).
        progress: returns (a progress count for the timeline, done).
        timeout_s: give up after this many seconds.
    """
    peak, peak_at, done, seen = 0, 0.0, False, 0
    timeline: list[list[float]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and worker.poll() is None:
        seen, done = progress()
        elapsed = time.perf_counter() - start
        rss = peak_rss_bytes(worker.pid)
        if rss > peak:
            peak, peak_at = rss, elapsed
        if not timeline or elapsed - timeline[-1][0] >= 30:
            timeline.append([round(elapsed), seen, round(rss / 2**20, 1)])
        if done:
            break
        time.sleep(1.0)
    seconds = time.perf_counter() - start
    if (rss := peak_rss_bytes(worker.pid)) > peak:
        peak, peak_at = rss, seconds
    timeline.append([round(seconds), seen, round(peak / 2**20, 1)])
    return Followed(peak_bytes=peak, seconds=seconds, done=done, peak_at_s=peak_at, timeline=timeline)


def fake_call(url: str, path: str, *, body: object = None) -> None:
    """POST to a control endpoint of the fake API server (``/fake/advance``, ``/fake/faults``), ``body`` as JSON.

    Raises:
        urllib.error.URLError: the server did not answer within 600 s, or answered an error.
    """
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as resp:
        resp.read()


def listed_kinds(health_port: int, *, after_410: bool = False) -> set[str]:
    """Kinds a worker has stored a full list of, from its ``/metrics`` on 127.0.0.1:``health_port`` (a sample
    ``dra_ledger_watch_events_total`` of type ``LIST`` exists once one was, even of no items); with
    ``after_410``, only kinds it was also told 410 Gone for (``dra_ledger_watch_expired_total``). Empty while
    the worker does not answer yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{health_port}/metrics", timeout=10) as resp:
            exposition = resp.read().decode()
    except OSError:
        return set()

    def kinds(prefix: str, also: str) -> set[str]:
        return {line[len(prefix):].split('"', 1)[0] for line in exposition.splitlines()
                if line.startswith(prefix) and also in line}
    listed = kinds('dra_ledger_watch_events_total{kind="', 'type="LIST"')
    return listed & kinds('dra_ledger_watch_expired_total{kind="', "") if after_410 else listed


def wait_listed(health_port: int, worker: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """Wait until ``worker`` has listed every kind it follows (:data:`RELISTED_KINDS`).

    Raises:
        TimeoutError: not within ``timeout_s`` seconds, or the worker exited.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and worker.poll() is None:
        if listed_kinds(health_port) >= set(RELISTED_KINDS):
            return
        time.sleep(0.2)
    raise TimeoutError(f"the worker did not list {', '.join(RELISTED_KINDS)} within {timeout_s} s")


def phase_worker(report: Report, db: LedgerDatabase, history: Path, summary: SimulationSummary, workdir: Path,
                 *, timeout_s: float, relist: bool) -> None:
    """Phase 3: peak RSS of a ``dra-ledger watch`` following ``history`` through the fake API server.

    Also reports, once the worker caught up, how many claims the ledger recorded (table ``claims``: created,
    live at the end) and the live translator entries by kind (table ``translator_state``), and a coarse
    timeline (``[elapsed s, lines stored, worker RSS MiB]`` about every 30 s) in ``report.sizes``.

    With ``relist``, the worker is then stopped, the fake API server compacted (every stored
    resourceVersion now answers 410), and a new worker started on the same ledger: it lists every kind again
    and reconciles the lists with what it recorded (a restart after a downtime longer than etcd's compaction
    window). Its peak RSS is a second figure.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    kubeconfig = workdir / "fake.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {url}\n"
        "users:\n- name: fake\n  user: {}\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n", encoding="utf-8")
    log = (workdir / "worker.log").open("ab")
    # Paused: the worker lists an empty cluster, then the whole history arrives as watch events
    # (every line is followed, not just the final state a list would show).
    server = subprocess.Popen(cli("fake-apiserver", "--history", str(history), "--port", str(port), "--paused"),
                              stdout=log, stderr=subprocess.STDOUT)
    worker: subprocess.Popen[bytes] | None = None

    def start_worker(*, health_port: int = -1) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cli("watch", "--kubeconfig", str(kubeconfig), "--database-url", db.url, "--cluster", CLUSTER,
                "--no-leader-election", "--no-jobs", "--health-port", str(health_port), "--clock-url", url),
            stdout=log, stderr=subprocess.STDOUT)

    def caught_up() -> bool:
        return sum(runner.lag(db.engine).values()) == 0

    try:
        wait_port(port, 300)
        print(f"worker: following {summary.devices:,} devices / {summary.claims:,} claims "
              f"({summary.lines:,} lines) from the fake API server", flush=True)
        start = time.perf_counter()
        health = free_port()
        worker = start_worker(health_port=health)
        # The worker lists the (empty) cluster and starts its watches; only then is the history played.
        wait_listed(health, worker, timeout_s=300)
        fake_call(url, "/fake/advance?all=1")

        def stored() -> tuple[int, bool]:
            seen = stored_lines(db.engine, at_least=summary.lines)
            return seen, seen >= summary.lines and caught_up()

        followed = watch_worker(worker, start=start, progress=stored, timeout_s=timeout_s)
        seen = stored_lines(db.engine, at_least=summary.lines)
        claims = claim_counts(db.engine)
        entries = live_entries(db.engine)
        report.sizes.update({"workerDevices": summary.devices, "workerClaims": summary.claims,
                             "workerLines": summary.lines, "workerSeconds": round(followed.seconds),
                             "workerClaimsCreated": claims["created"], "workerClaimsLive": claims["live"],
                             "workerClaimsLiveAllocated": claims["allocated"],
                             "workerClaimsLivePending": claims["pending"], "workerLiveEntries": entries,
                             "workerPeakAtSeconds": round(followed.peak_at_s), "workerTimeline": followed.timeline})
        report.add(followed.rss_figure("watch worker peak RSS",
                          f"{summary.devices:,} devices, {claims['created']:,} claims created, {claims['live']:,} live "
                          f"at the end ({claims['allocated']:,} allocated, {claims['pending']:,} pending); "
                          f"{seen:,}/{summary.lines:,} lines "
                          f"{'followed' if followed.done else 'followed before the timeout'} in "
                          f"{followed.seconds:.0f} s"))
        if not relist:
            return
        stop(worker)
        worker = None
        # One 410 Gone for the next watch of each kind: the new worker resumes from its stored resourceVersions,
        # is told they expired, and lists every kind again.
        fake_call(url, "/fake/faults", body=[{"action": "status", "status": 410, "kind": kind, "verb": "watch"}
                                             for kind in RELISTED_KINDS])
        print(f"worker: restarted after a 410, relisting {entries.get('claim', 0):,} claims and "
              f"{entries.get('pod', 0):,} pods", flush=True)
        health = free_port()
        start = time.perf_counter()
        worker = start_worker(health_port=health)

        def relisted() -> tuple[int, bool]:
            listed = listed_kinds(health, after_410=True)
            return len(listed), listed >= set(RELISTED_KINDS) and caught_up()

        again = watch_worker(worker, start=start, progress=relisted, timeout_s=timeout_s)
        report.sizes.update({"relistSeconds": round(again.seconds), "relistPeakAtSeconds": round(again.peak_at_s),
                             "relistTimeline": again.timeline})
        report.add(again.rss_figure("watch worker peak RSS, restart + relist",
                          f"a new worker on the same ledger, every watch answered 410 once: lists and reconciles "
                          f"{entries.get('claim', 0):,} live claims, {entries.get('pod', 0):,} pods, "
                          f"{entries.get('slice', 0):,} ResourceSlices; "
                          f"{'done' if again.done else 'not done before the timeout'} in {again.seconds:.0f} s"))
    finally:
        if worker is not None:
            stop(worker)
        stop(server)
        log.close()


# --- phase 4 and 5: queries and the API --------------------------------------------------------


def bounds(db: LedgerDatabase) -> tuple[datetime | None, datetime | None]:
    """First and last allocation start: random instants are drawn between them."""
    with db.engine.connect() as conn:
        row = conn.execute(text("SELECT min(lower(valid)), max(lower(valid)) FROM device_allocations")).one()
    return row[0], row[1]


def phase_queries(report: Report, db: LedgerDatabase, *, samples: int, seed: int) -> None:
    """Phase 4: occupancy at random instants (p50/p99) and device-hours per team over 30 days."""
    runner.catch_up(db.engine)
    with db.engine.begin() as conn:
        conn.execute(text("ANALYZE"))  # what autovacuum does after a bulk load; the planner needs the statistics
    # As in production, where the worker's occupancy-counts job keeps the counts: compute them first (timed
    # apart, reported below), then ask what GET /v1/occupancy serves.
    counts_s, written = timed(lambda: services.refresh_occupancy_counts(db, cluster=CLUSTER))
    lo, hi = bounds(db)
    if lo is None or hi is None:
        print("queries: no allocations, skipped", flush=True)
        return
    rng = random.Random(seed)
    span = (hi - lo).total_seconds()
    with db.engine.connect() as conn:
        devices = int(conn.execute(text("SELECT count(DISTINCT (driver, pool, device)) FROM device_inventory"))
                      .scalar_one())
        events = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
        report.sizes.update({"queryDevices": devices, "queryEvents": events})
        times = [lo + timedelta(seconds=rng.uniform(0, span)) for _ in range(samples)]
        # What the API serves for a first request: one page (default limit) plus totals over all devices,
        # each instant in its own transaction as services.occupancy_settled runs it.
        conn.commit()
        queries.occupancy(conn, at=times[0], cluster=CLUSTER)  # warm the buffer cache
        conn.commit()
        took = []
        for at in times:
            start = time.perf_counter()
            queries.occupancy(conn, at=at, cluster=CLUSTER, limit=queries.OCCUPANCY_DEFAULT_LIMIT)
            conn.commit()
            took.append((time.perf_counter() - start) * 1000)
        took.sort()
        p50, p99 = statistics.median(took), took[min(len(took) - 1, int(len(took) * 0.99))]
        size = (f"{devices:,} devices, {events:,} events, {samples} random instants; first page of "
                f"{queries.OCCUPANCY_DEFAULT_LIMIT} devices + totals over all, as the API serves it; "
                f"occupancy counts refreshed first in {counts_s:.1f} s (rows written per cluster, none if already "
                f"covered: {written})")
        report.add(Figure("occupancy at random T, p50", p50, "ms", "≤ 20 ms", p50 <= 20, size))
        report.add(Figure("occupancy at random T, p99", p99, "ms", "≤ 100 ms", p99 <= 100, size))
    start_t = hi - timedelta(days=30)
    # As in production, where the worker's hourly job keeps usage_rollups: roll the history up first (timed
    # apart), then ask services.usage, the path GET /v1/usage takes (whole hours from the rollups).
    roll_s, hours = timed(lambda: services.rollup_usage(db, end=hi))
    took = []
    for _ in range(5):
        start = time.perf_counter()
        services.usage(db, start=start_t, end=hi, group_by="team", cluster=CLUSTER)
        took.append((time.perf_counter() - start) * 1000)
    report.add(Figure("device-hours per team, 30 days", statistics.median(took), "ms", "≤ 200 ms",
                      statistics.median(took) <= 200,
                      f"median of 5, {devices:,} devices; {hours} hours rolled up first in {roll_s:.1f} s"))


def phase_api(report: Report, db: LedgerDatabase, workdir: Path, *, duration_s: float, concurrency: int,
              workers: int) -> None:
    """Phase 5: ``GET /v1/occupancy`` requests/s from a separate load process against ``dra-ledger serve`` with
    ``workers`` worker processes."""
    port = free_port()
    log = (workdir / "api.log").open("ab")
    server = subprocess.Popen(cli("serve", "--port", str(port), "--database-url", db.url, "--cluster", CLUSTER,
                                  "--workers", str(workers)), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, 120)
        load = subprocess.run(
            [sys.executable, "-m", "bench.load", "--url", f"http://127.0.0.1:{port}/v1/occupancy",
             "--duration", str(duration_s), "--concurrency", str(concurrency)],
            capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent.parent)
        result = json.loads(load.stdout)
        rps = float(result["ok"]) / float(result["seconds"])
        report.add(Figure("API occupancy now, one page", rps, "requests/s", "≥ 500/s", rps >= 500,
                          f"{concurrency} connections for {duration_s:.0f} s from a separate process, "
                          f"{workers} API worker process{'es' if workers > 1 else ''}; "
                          f"p50 {result['p50_ms']:.0f} ms, errors {result['errors']}"))
    finally:
        stop(server)
        log.close()


def main(argv: list[str] | None = None) -> int:
    """Run the phases not skipped, print the table, write the JSON; exit status 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--admin-url", default=os.environ.get("LEDGER_BENCH_DATABASE_URL", DEFAULT_ADMIN_URL),
                        help="PostgreSQL URL of a role that may create databases.")
    parser.add_argument("--nodes", type=int, default=50, help="Nodes of the ingest/rebuild history.")
    parser.add_argument("--hours", type=float, default=24.0, help="Hours of the ingest/rebuild history.")
    parser.add_argument("--fleet-nodes", type=int, default=5000, help="Nodes of the fleet the worker follows.")
    parser.add_argument("--fleet-hours", type=float, default=0.25, help="Hours of the fleet history.")
    fleet_defaults = FleetSpec()
    parser.add_argument("--fleet-utilisation", type=float, default=fleet_defaults.utilisation,
                        help="FleetSpec.utilisation of the fleet: demand as a fraction of its GPUs (above 1, the "
                             "workloads that find no free device stay pending, so live claims pile up).")
    parser.add_argument("--fleet-job-minutes", type=float, default=fleet_defaults.job_minutes,
                        help="FleetSpec.job_minutes of the fleet: mean hold time of a workload, minutes.")
    parser.add_argument("--fleet-idle-fraction", type=float, default=fleet_defaults.idle_fraction,
                        help="FleetSpec.idle_fraction of the fleet: share of workloads that leave a manual claim "
                             "allocated and unused for good.")
    parser.add_argument("--fleet-pending-fraction", type=float, default=fleet_defaults.pending_fraction,
                        help="FleetSpec.pending_fraction of the fleet: share of workloads over-requesting (pending "
                             "for an hour, then deleted).")
    parser.add_argument("--worker-relist", action="store_true",
                        help="After the worker caught up, restart it after a compaction (410) so that it lists every "
                             "kind again, and report that worker's peak RSS as well.")
    parser.add_argument("--worker-timeout", type=float, default=1800.0,
                        help="Seconds the worker phase waits for the worker to store every line and the read models "
                             "to catch up.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samples", type=int, default=50, help="Random instants for occupancy.")
    parser.add_argument("--api-seconds", type=float, default=10.0)
    parser.add_argument("--api-concurrency", type=int, default=8)
    parser.add_argument("--api-workers", type=int, default=os.cpu_count() or 1,
                        help="dra-ledger serve --workers for the api phase (default: one a core).")
    parser.add_argument("--skip", default="", help="Comma-separated phases to skip: ingest,worker,queries,api.")
    parser.add_argument("--keep", action="store_true", help="Keep the benchmark databases.")
    parser.add_argument("--query-url", default=None,
                        help="Run the occupancy/usage/API phases on this existing ledger (for example a 10 M-event "
                             "ledger kept by bench.full) instead of the fleet ledger built here.")
    parser.add_argument("-o", "--output", type=Path, default=Path("bench/results.json"))
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    report = Report()
    with tempfile.TemporaryDirectory(prefix="dra-ledger-bench-") as tmp:
        workdir = Path(tmp)
        if "ingest" not in skip:
            history = workdir / "history.jsonl"
            spec = FleetSpec(nodes=args.nodes, gpus_per_node=8, hours=args.hours, seed=args.seed)
            seconds, summary = timed(lambda: write_history(spec, history))
            assert isinstance(summary, SimulationSummary)
            print(f"simulated {args.nodes} nodes x {args.hours} h: {summary.lines:,} lines in {seconds:.1f} s",
                  flush=True)
            phase_ingest(report, args.admin_url, history, summary, keep=args.keep)
        query_db: LedgerDatabase | None = None
        if args.query_url:
            query_db = LedgerDatabase.from_url(args.query_url)
            query_db.require_current()
        with fresh_database(args.admin_url, "fleet", keep=args.keep) as fleet_db:
            if "worker" not in skip:
                fleet = workdir / "fleet.jsonl"
                spec = FleetSpec(nodes=args.fleet_nodes, gpus_per_node=8, hours=args.fleet_hours, seed=args.seed,
                                 utilisation=args.fleet_utilisation, job_minutes=args.fleet_job_minutes,
                                 idle_fraction=args.fleet_idle_fraction, pending_fraction=args.fleet_pending_fraction)
                seconds, summary = timed(lambda: write_history(spec, fleet))
                assert isinstance(summary, SimulationSummary)
                print(f"simulated {args.fleet_nodes} nodes x {args.fleet_hours} h: {summary.lines:,} lines, "
                      f"{summary.claims:,} claims in {seconds:.1f} s", flush=True)
                report.sizes["workerFleet"] = {
                    "nodes": spec.nodes, "gpusPerNode": spec.gpus_per_node, "hours": spec.hours, "seed": spec.seed,
                    "utilisation": spec.utilisation, "jobMinutes": spec.job_minutes,
                    "idleFraction": spec.idle_fraction, "pendingFraction": spec.pending_fraction,
                    "summary": summary.to_json()}
                phase_worker(report, fleet_db, fleet, summary, workdir, timeout_s=args.worker_timeout,
                             relist=args.worker_relist)
                query_db = query_db or fleet_db
            if query_db is not None and "queries" not in skip:
                phase_queries(report, query_db, samples=args.samples, seed=args.seed)
            if query_db is not None and "api" not in skip:
                phase_api(report, query_db, workdir, duration_s=args.api_seconds, concurrency=args.api_concurrency,
                          workers=args.api_workers)
    print()
    print(report.table())
    body = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "sizes": report.sizes,
            "figures": [{"name": f.name, "value": round(f.value, 3), "unit": f.unit, "target": f.target,
                         "met": f.met, "note": f.note} for f in report.figures]}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
