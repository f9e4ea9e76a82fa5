"""Time every report of an existing ledger (claims, idle claims, pending, shared, quotas, usage, occupancy).

Run (against a kept ledger database, e.g. one replayed from ``dra-ledger simulate --nodes 1000 --hours 24``)::

    .venv/bin/python -m bench.reports --url postgresql+psycopg://postgres@127.0.0.1:5432/bench_reports \\
        --at 2026-11-01T23:00:00Z --from 2026-11-01T00:00:00Z --to 2026-11-02T00:00:00Z -o /tmp/reports.json

Why: the performance targets name occupancy and usage only, but the other answers read the same read models and
can grow with what the ledger ever recorded (every claim, every pending claim, every allocation edge) rather
than with their answer. This script calls each ``ledger.services`` query the REST API and the CLI serve, a
few times each, and prints the median milliseconds and the size of the answer, so that such growth shows up
as a figure. Nothing here asserts a time (tests never do); it only reads the database.

Each figure is the median of ``--runs`` calls after one unmeasured call (which warms the server's caches).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from api.app import freeze_startup_objects
from ledger import services
from ledger.config import DEFAULT
from ledger.recorded import parse_query_time
from ledger.store.database import LedgerDatabase


def _size(body: Any) -> int:
    """How many rows an answer holds: the length of its main list (``claims``, ``rows``, ``devices``...)."""
    for key in ("claims", "rows", "devices", "intervals"):
        if isinstance(body.get(key), list):
            return len(body[key])
    return 0


def _every_page(db: LedgerDatabase, *, at: datetime, state: str) -> dict[str, list[Any]]:
    """Walk every page of 1,000 claims as a client of ``GET /v1/claims`` does; all the claims served."""
    served: list[Any] = []
    after = None
    while True:
        page = services.claims_page(db, at=at, state=state, after=after, limit=1000)
        body: Any = page.body
        served += body["claims"]
        if not page.more:
            return {"claims": served}
        after = page.last


def queries(db: LedgerDatabase, *, at: datetime, start: datetime, end: datetime) -> dict[str, Callable[[], Any]]:
    """Each report, as the API asks for it, by name. "One team" is the middle one by name of the teams billed in the
    window (a team-limited token's listing, or ``?team=``)."""
    billed: Any = services.usage(db, start=start, end=end, group_by="team")
    names = sorted({str(r["team"]) for r in billed["rows"]}) or ["none"]
    team = names[len(names) // 2]
    return {
        "claims (all, first page of 100)": lambda: services.claims_page(db, at=at, limit=100).body,
        "claims (all, every page of 1000)": lambda: _every_page(db, at=at, state="all"),
        "claims (allocated, first page of 100)": lambda: services.claims_page(db, at=at, state="allocated",
                                                                           limit=100).body,
        "claims (one team, first page of 100)": lambda: services.claims_page(db, at=at, team=team, limit=100).body,
        "claims (one team, allocated, first page)": lambda: services.claims_page(db, at=at, state="allocated",
                                                                              team=team, limit=100).body,
        "claims (all, every claim)": lambda: services.claims(db, at=at),
        "idle claims": lambda: services.idle_report(db, at=at, config=DEFAULT),
        "pending": lambda: services.pending(db, at=at),
        "shared": lambda: services.shared(db, at=at),
        "quotas": lambda: services.quotas(db, at=at, config=DEFAULT),
        "usage by team": lambda: services.usage(db, start=start, end=end, group_by="team"),
        "occupancy (first page of 100)": lambda: services.occupancy_settled(db, at=at, limit=100).body,
    }


def main(argv: list[str] | None = None) -> int:
    """Time each report and print a table; write the figures as JSON to ``--output`` when given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of the ledger database (read only).")
    parser.add_argument("--at", required=True, help="The instant asked for (RFC 3339).")
    parser.add_argument("--from", dest="start", required=True, help="Start of the usage window (RFC 3339).")
    parser.add_argument("--to", dest="end", required=True, help="End of the usage window (RFC 3339).")
    parser.add_argument("--runs", type=int, default=3, help="Measured calls of each report (median printed).")
    parser.add_argument("-o", "--output", type=Path, help="JSON file to write the figures to.")
    args = parser.parse_args(argv)
    db = LedgerDatabase.from_url(args.url)
    figures: list[dict[str, object]] = []
    try:
        asked = queries(db, at=parse_query_time(args.at), start=parse_query_time(args.start),
                        end=parse_query_time(args.end))
        freeze_startup_objects()  # as the API does once it has started: answers are timed as it serves them
        for name, call in asked.items():
            body = call()
            times = []
            for _ in range(max(args.runs, 1)):
                started = time.perf_counter()
                call()
                times.append((time.perf_counter() - started) * 1000)
            figure = {"name": name, "medianMs": round(statistics.median(times), 1), "rows": _size(body)}
            figures.append(figure)
            print(f"{name:42} {figure['medianMs']:>10,.1f} ms {figure['rows']:>8,} rows", flush=True)
    finally:
        db.dispose()
    if args.output is not None:
        args.output.write_text(json.dumps({"at": args.at, "from": args.start, "to": args.end, "figures": figures},
                                          indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
