"""Ingest of one recorded file by two checkouts of the ledger, in alternating runs: wall time and CPU a line.

Run (a PostgreSQL the script may create databases on; default the local one)::

    .venv/bin/python -m bench.ingest_ab --base /path/to/old/checkout --new . --pairs 3 \
        -o bench/results-ingest-binary.json

Why: on the project's 2-core machines the speed of a run moves by a quarter from one minute to the next
(other jobs, the host), as much as the change being measured, so two releases are compared in pairs run
one right after the other, each in a fresh process whose ``PYTHONPATH`` puts that checkout first. Each run
simulates nothing: the history (``ledger.simulate``, written once by this process) is ingested with
``services.ingest`` into a fresh database, and the run reports

- ``seconds`` and ``linesPerSecond``: wall time of ``services.ingest`` (DESIGN §10's ingest figure);
- ``pythonCpuUsPerLine``: the ledger process's user + system CPU during it, µs a watch event;
- ``serverCpuUsPerLine``: CPU of every process of the database server (its backends, WAL writer,
  checkpointer: read from ``/proc``, so only for a server on this machine whose processes this user may
  read; ``null`` otherwise), µs a watch event.

At 20,000 watch events/s on two cores the two CPU figures must add up to at most 100 µs a line, and each
stay under 50 (the translator's GIL-bound Python and the server run beside each other, not more widely).

Nothing here runs in the test suite; tests never assert wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _server_cpu_s(postmaster: int) -> float | None:
    """User + system CPU seconds of ``postmaster``'s children (the server's processes), or ``None`` if unreadable."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended, or is not ours to read
        if int(fields[1]) == postmaster:  # fields[1] is the parent pid; [11], [12] user and system ticks
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def _postmaster_of(url: str) -> int | None:
    """The server's main process, as the parent of a backend serving ``url``, when it runs on this machine."""
    import psycopg

    from ledger.testing.pg import to_libpq_url

    with psycopg.connect(to_libpq_url(url)) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    try:
        with open(f"/proc/{int(row[0])}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def child(admin_url: str, history: Path) -> dict[str, object]:
    """One measured ingest of ``history`` by the code first on ``sys.path``; the figures as a JSON object."""
    from ledger import services
    from ledger.recorded import read_history
    from ledger.store.database import LedgerDatabase
    from ledger.testing.pg import create_database, drop_database

    name = f"bench_ab_{uuid.uuid4().hex[:8]}"
    url = create_database(admin_url, name)
    db = LedgerDatabase.from_url(url)
    try:
        db.upgrade()
        postmaster = _postmaster_of(url)
        server_before = _server_cpu_s(postmaster) if postmaster else None
        usage_before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        report = services.ingest(db, read_history(history), cluster="bench")
        seconds = time.perf_counter() - start
        usage_after = resource.getrusage(resource.RUSAGE_SELF)
        server_after = _server_cpu_s(postmaster) if postmaster else None
    finally:
        db.dispose()
        drop_database(admin_url, name)
    lines = report.lines
    python_s = (usage_after.ru_utime - usage_before.ru_utime) + (usage_after.ru_stime - usage_before.ru_stime)
    server_s = None if server_before is None or server_after is None else server_after - server_before
    return {"lines": lines, "events": report.events, "seconds": round(seconds, 3),
            "linesPerSecond": round(lines / seconds), "pythonCpuUsPerLine": round(python_s / lines * 1e6, 1),
            "serverCpuUsPerLine": None if server_s is None else round(server_s / lines * 1e6, 1)}


def run_side(checkout: Path, admin_url: str, history: Path) -> dict[str, object]:
    """Run :func:`child` in a fresh interpreter whose ``ledger`` is ``checkout``'s.

    The script runs by its path, not as ``-m bench.ingest_ab``: the child's first ``sys.path`` entry is then
    this folder, which holds no ``ledger``, and ``PYTHONPATH`` puts ``checkout`` before the installed one.
    """
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--admin-url", admin_url,
                          "--history", str(history)], env=env, check=True, capture_output=True, text=True,
                         cwd=history.parent)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse the options; run the pairs (or, with ``--child``, one measured ingest); print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--admin-url", default=os.environ.get("LEDGER_BENCH_DATABASE_URL", DEFAULT_ADMIN_URL),
                        help="PostgreSQL URL of a role that may create databases.")
    parser.add_argument("--base", type=Path, help="Checkout of the code to compare against (the previous release).")
    parser.add_argument("--new", type=Path, default=Path("."), help="Checkout of the code measured (default: here).")
    parser.add_argument("--pairs", type=int, default=3, help="Alternating runs of each side.")
    parser.add_argument("--nodes", type=int, default=50, help="Nodes of the simulated history (8 GPUs each).")
    parser.add_argument("--hours", type=float, default=24.0, help="Hours of the simulated history.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--history", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", type=Path, default=None, help="Write the figures as JSON here too.")
    args = parser.parse_args(argv)
    if args.child:
        import ledger

        print(f"ledger from {Path(ledger.__file__).parent}", file=sys.stderr)
        print(json.dumps(child(args.admin_url, args.history)))
        return 0
    if args.base is None:
        parser.error("--base is required")
    from ledger.simulate import FleetSpec, write_history

    with tempfile.TemporaryDirectory(prefix="dra-ledger-ab-") as tmp:
        history = Path(tmp) / "history.jsonl"
        summary = write_history(FleetSpec(nodes=args.nodes, gpus_per_node=8, hours=args.hours, seed=args.seed),
                                history)
        print(f"history: {summary.lines:,} lines ({args.nodes} nodes x {args.hours} h, seed {args.seed})", flush=True)
        pairs: list[dict[str, dict[str, object]]] = []
        for n in range(1, args.pairs + 1):
            pair = {side: run_side(path, args.admin_url, history) for side, path in (("base", args.base),
                                                                                    ("new", args.new))}
            pairs.append(pair)
            print(f"pair {n}: " + "; ".join(
                f"{side} {r['linesPerSecond']:,} lines/s, python {r['pythonCpuUsPerLine']} µs, "
                f"server {r['serverCpuUsPerLine']} µs a line" for side, r in pair.items()), flush=True)
    medians = {side: {key: statistics.median(float(str(p[side][key])) for p in pairs)
                      for key in ("linesPerSecond", "pythonCpuUsPerLine", "serverCpuUsPerLine")
                      if all(p[side][key] is not None for p in pairs)}
               for side in ("base", "new")}
    print("medians: " + json.dumps(medians))
    if args.output is not None:
        body = {"what": "bench.ingest_ab: services.ingest of one simulated history, alternating runs of two "
                        "checkouts in fresh processes",
                "history": {"nodes": args.nodes, "gpusPerNode": 8, "hours": args.hours, "seed": args.seed,
                            "lines": summary.lines},
                "machine": {"cpus": os.cpu_count()}, "pairs": pairs, "medians": medians}
        args.output.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
