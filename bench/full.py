"""Build the DESIGN §10 scale ledger (over 10 M events, 61,000 devices) once and measure it.

Run (hours of machine time on 2 cores; needs ~80 GB free for the history file, the database and its WAL)::

    .venv/bin/python -m bench.full                       # simulate, ingest, rebuild, state RSS
    .venv/bin/python -m bench.run --skip ingest,worker \\
        --query-url postgresql+psycopg://postgres@127.0.0.1:5432/bench_full -o bench/results-full.json

Steps, each printed with its figure and written to ``--output`` (JSON):

1. ``simulate``: 5,000 nodes x 8 GPUs for ``--hours`` (52 h gives ~8.3 M watch lines, ~10.3 M events).
2. ``ingest``: :func:`ledger.services.ingest` of that file into database ``--database`` (created; kept),
   with a progress line a minute; watch lines/s, overall and for each million lines (``linesPerSecondByMillion``:
   whether the rate holds once the database outgrows the page cache).
3. ``rebuild``: :func:`ledger.projections.runner.rebuild` of every read model; events/s. Then the
   occupancy counts over the whole history (:func:`ledger.services.refresh_occupancy_counts`) and ``ANALYZE``.
4. ``state``: resident memory a worker pays at start for this cluster's translator state
   (:func:`ledger.services.load_state`), measured in a fresh process from ``/proc/self/status``.

The kept database then serves the query and API phases of :mod:`bench.run` (``--query-url``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from bench.run import CLUSTER, DEFAULT_ADMIN_URL, timed
from ledger import services
from ledger.projections import runner
from ledger.recorded import read_history
from ledger.simulate import FleetSpec, SimulationSummary, write_history
from ledger.store.database import LedgerDatabase
from ledger.testing.pg import create_database

_STATE_PROBE = """
import json, sys
from ledger import services
from ledger.store.database import LedgerDatabase

def rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS"))

db = LedgerDatabase.from_url(sys.argv[1])
before = rss_mib()
state = services.load_state(db, sys.argv[2])
print(json.dumps({"entries": len(state.entries), "rssBeforeMiB": before, "rssAfterMiB": rss_mib()}))
"""


def state_rss(url: str, cluster: str) -> dict[str, float]:
    """Load ``cluster``'s translator state in a fresh interpreter; entries and RSS before/after (MiB)."""
    out = subprocess.run([sys.executable, "-c", _STATE_PROBE, url, cluster], check=True, capture_output=True,
                         text=True)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    """Simulate, ingest, rebuild, measure the state; write ``--output``; exit status 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--admin-url", default=os.environ.get("LEDGER_BENCH_DATABASE_URL", DEFAULT_ADMIN_URL),
                        help="A server the script may create databases on.")
    parser.add_argument("--database", default="bench_full", help="Database to create and keep.")
    parser.add_argument("--hours", type=float, default=52.0, help="Simulated hours of 5,000 nodes x 8 GPUs.")
    parser.add_argument("--history", type=Path, default=Path("bench-full.jsonl"), help="Where the history goes.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-o", "--output", type=Path, default=Path("bench/results-full-build.json"))
    args = parser.parse_args(argv)
    figures: dict[str, object] = {}

    seconds, simulated = timed(lambda: write_history(
        FleetSpec(nodes=5000, gpus_per_node=8, hours=args.hours, seed=args.seed), args.history))
    assert isinstance(simulated, SimulationSummary)
    summary = simulated
    figures["simulate"] = {"lines": summary.lines, "devices": summary.devices, "claims": summary.claims,
                           "seconds": round(seconds, 1)}
    print(f"simulated {summary.lines:,} lines, {summary.devices:,} devices, {summary.claims:,} claims", flush=True)

    url = create_database(args.admin_url, args.database)
    db = LedgerDatabase.from_url(url)
    db.upgrade()
    done, start = 0, time.perf_counter()
    last, done_then = start, 0
    by_million: list[float] = []  # lines/s of each million lines: does the rate hold as the ledger grows?
    million_start, million_done = start, 0

    def progress(lines: int) -> None:
        nonlocal done, last, done_then, million_start, million_done
        done += lines
        now = time.perf_counter()
        if done // 1_000_000 > len(by_million):
            by_million.append((done - million_done) / (now - million_start))
            million_start, million_done = now, done
        if now - last >= 60:
            print(f"  ingest: {done:,} / {summary.lines:,} lines, {done / (now - start):,.0f}/s on average, "
                  f"{(done - done_then) / (now - last):,.0f}/s in the last minute", flush=True)
            last, done_then = now, done

    report = services.ingest(db, read_history(args.history), cluster=CLUSTER, batch_size=5000, progress=progress)
    seconds = time.perf_counter() - start
    figures["ingest"] = {"lines": summary.lines, "events": report.events, "rejected": len(report.rejected),
                         "seconds": round(seconds, 1), "linesPerSecond": round(summary.lines / seconds),
                         "linesPerSecondByMillion": [round(rate) for rate in by_million]}
    print(f"ingest: {summary.lines / seconds:,.0f} watch lines/s ({report.events:,} events)", flush=True)

    seconds, rebuilt = timed(lambda: runner.rebuild(db.engine))
    applied = int(str(rebuilt))
    figures["rebuild"] = {"events": applied, "seconds": round(seconds, 1), "eventsPerSecond": round(applied / seconds)}
    print(f"rebuild: {applied / seconds:,.0f} events/s", flush=True)
    seconds, written = timed(lambda: services.refresh_occupancy_counts(db, cluster=CLUSTER))
    figures["occupancyCounts"] = {"rows": written, "seconds": round(seconds, 1)}
    print(f"occupancy counts over the whole history: {written} rows in {seconds:.1f} s", flush=True)
    with db.engine.begin() as conn:
        conn.execute(text("ANALYZE"))

    figures["state"] = state_rss(db.url, CLUSTER)
    print(f"state: {figures['state']}", flush=True)
    db.dispose()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}; database {args.database} kept for bench.run --query-url")
    return 0


if __name__ == "__main__":
    sys.exit(main())
