"""Time the whole-history rebuild of an existing ledger, leaving the ledger as it was.

Run (against a kept database, e.g. the 10 M-event one of :mod:`bench.full`)::

    .venv/bin/python -m bench.rebuild --url postgresql+psycopg://postgres@127.0.0.1:5432/bench_full --runs 2

Each run empties every read model's tables and builds them again from the events
(:func:`ledger.projections.whole_history.build`, what ``runner.rebuild`` runs) in one transaction, then
rolls it back: the tables and checkpoints stay as they were, and the tables built by the rolled-back
transaction are dropped with it (they live in new files after the ``TRUNCATE``), so runs leave no dead
rows behind. The ``TRUNCATE``, the checkpoint updates and the commit of a real rebuild are not timed
(milliseconds). Prints one JSON line per run (events, seconds, events/s) and writes them to ``--output``.

To compare two releases on one machine, run this file with the other release's ``ledger`` first on
``PYTHONPATH`` (``PYTHONPATH=/path/to/other/checkout python bench/rebuild.py ...``), alternating runs:
a run-to-run spread of 20 % is common on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from sqlalchemy import text

from ledger.projections import whole_history
from ledger.projections.models import ALL
from ledger.store.database import LedgerDatabase
from ledger.types import GlobalPosition


def rebuild_once(db: LedgerDatabase) -> dict[str, float]:
    """One rolled-back whole-history build of every read model: ``{"events", "seconds", "eventsPerSecond"}``.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the build failed (nothing changes: the transaction rolls back anyway).
    """
    names = [p.name for p in ALL]
    with db.engine.connect() as conn:
        transaction = conn.begin()
        try:
            conn.execute(text("TRUNCATE " + ", ".join(t.name for p in ALL for t in p.tables)))
            events, head = conn.execute(text("SELECT count(*), coalesce(max(global_position), 0) FROM events")).one()
            start = time.perf_counter()
            whole_history.build(conn, names=names, head=GlobalPosition(int(head)))
            seconds = time.perf_counter() - start
        finally:
            transaction.rollback()
    return {"events": int(events), "seconds": round(seconds, 2), "eventsPerSecond": round(int(events) / seconds)}


def main(argv: list[str] | None = None) -> int:
    """Time ``--runs`` rebuilds of ``--url``; print and write them; exit status 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="The ledger database (left unchanged).")
    parser.add_argument("--runs", type=int, default=1, help="Rebuilds, one after the other.")
    parser.add_argument("--label", default="", help="A name for these runs in the output (e.g. the release).")
    parser.add_argument("-o", "--output", type=Path, help="Append the runs to this JSON Lines file.")
    args = parser.parse_args(argv)
    db = LedgerDatabase.from_url(args.url)
    try:
        for _ in range(args.runs):
            run: dict[str, object] = {"label": args.label, "database": args.url.rsplit("/", 1)[-1],
                                      **rebuild_once(db)}
            line = json.dumps(run)
            print(line, flush=True)
            if args.output is not None:
                with args.output.open("a", encoding="utf-8") as f:
                    f.write(line + "\n")
    finally:
        db.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
