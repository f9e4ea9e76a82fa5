"""Count the index pages one ingest batch touches, on a ledger that already holds a history.

Run (starts an embedded PostgreSQL 18 in a temporary data directory, which it removes)::

    .venv/bin/python -m bench.locality --nodes 500 --hours 24 --batches 5

Why pages and not seconds: a batch is fast while every index page it needs is in memory, and the
ledger grows by about 4 million events a day on a 5,000-node fleet, so what decides whether ingest keeps
up after months is how many *distinct* pages a batch needs, against the size of each index. An index
whose keys are hashes (observation digests, event ids) gets each of a batch's 5,000 keys on a page of
its own, anywhere in the index: the batch's working set is the whole index once it outgrows the page
cache, and every probe or insert waits on a disk read. Keys that follow time land on the index's last
few pages.

Method: the simulated history is ingested except its last ``--batches`` batches of ``--batch-size``
lines. Before each of those batches, every index of ``observations``, ``events`` and
``translator_state`` is evicted from PostgreSQL's shared buffers (``pg_buffercache_evict_relation``,
PostgreSQL 18); after the batch, the buffers each index holds are the distinct pages the batch read or
wrote (shared buffers are larger than a batch's pages, so nothing is evicted meanwhile). Prints one row
per index (its size in pages, the mean pages touched per batch, and their ratio) and writes JSON.
The figures depend on the history and the batch size only, not on the machine's speed.

With ``--memory-limit-mib M`` (Linux, root, cgroup v1 memory controller at ``/sys/fs/cgroup/memory``) the
server runs instead with 16 MB of shared buffers in a memory cgroup limited to ``M`` MiB, which also bounds
the page cache its reads fill: a small machine's memory against a ledger larger than it. Nothing is
evicted; the script prints and records the seconds and lines/s of each of the last batches, so two releases
can be timed on the same history under the same limit (``PYTHONPATH=<other checkout> python
bench/locality.py ...``). Those figures are timings, with the machine's spread.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from sqlalchemy import Engine, text

from ledger import services
from ledger.embedded import EmbeddedPostgres
from ledger.recorded import BrokenLine, WatchLine, read_history
from ledger.simulate import FleetSpec, write_history
from ledger.store.database import LedgerDatabase
from ledger.testing.pg import create_database

CLUSTER = "bench"
TABLES = ("observations", "events", "translator_state")


def indexes(engine: Engine) -> list[str]:
    """Names of the indexes of :data:`TABLES`, in a stable order."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT indexrelid::regclass::text FROM pg_index "
                                 "WHERE indrelid = ANY(CAST(:t AS regclass[])) ORDER BY 1"),
                            {"t": list(TABLES)}).all()
    return [str(r[0]) for r in rows]


def evict(engine: Engine, names: Sequence[str]) -> None:
    """Write out and drop every shared buffer of the relations ``names`` (PostgreSQL 18 or later)."""
    with engine.begin() as conn:
        conn.execute(text("CHECKPOINT"))
        for name in names:
            conn.execute(text("SELECT pg_buffercache_evict_relation(CAST(:n AS regclass))"), {"n": name})


def cached_pages(engine: Engine, names: Sequence[str]) -> dict[str, int]:
    """Shared buffers holding a page of each relation of ``names``: ``{name: pages}``."""
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT c.relname, count(b.bufferid) FROM pg_class c LEFT JOIN pg_buffercache b "
            "ON b.relfilenode = pg_relation_filenode(c.oid) AND b.reldatabase = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) "
            "WHERE c.oid = ANY(CAST(:n AS regclass[])) GROUP BY c.relname"), {"n": list(names)}).all()
    return {str(r[0]): int(r[1]) for r in rows}


def sizes(engine: Engine, names: Sequence[str]) -> dict[str, int]:
    """Size of each relation of ``names`` in 8 KiB pages."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT relname, pg_relation_size(oid) / current_setting('block_size')::int "
                                 "FROM pg_class WHERE oid = ANY(CAST(:n AS regclass[]))"), {"n": list(names)}).all()
    return {str(r[0]): int(r[1]) for r in rows}


def batches(lines: Iterator[WatchLine | BrokenLine], size: int) -> Iterator[list[WatchLine | BrokenLine]]:
    """``lines`` in lists of ``size`` (the last may be shorter)."""
    while chunk := list(itertools.islice(lines, size)):
        yield chunk


CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def run_then_stop(server: EmbeddedPostgres, statement: str) -> None:
    """Run ``statement`` outside a transaction on ``server`` (started if need be), then stop the server."""
    engine = LedgerDatabase.from_url(server.start()).engine
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(statement))
    engine.dispose()
    server.stop()


def small_buffers(server: EmbeddedPostgres) -> None:
    """Give ``server`` 16 MB of shared buffers (restarting it), so that the page cache holds the rest."""
    run_then_stop(server, "ALTER SYSTEM SET shared_buffers = '16MB'")
    server.start()


def new_group(limit_mib: int) -> Path:
    """Make a memory cgroup limited to ``limit_mib`` MiB (page cache included); return its directory.

    Raises:
        OSError: no writable cgroup v1 memory controller (not root, or not Linux).
    """
    group = CGROUP_ROOT / f"dra-ledger-bench-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit_mib * 1024 * 1024))
    return group


def confine(server: EmbeddedPostgres, group: Path) -> Path:
    """Restart ``server`` with nothing of its files cached, in memory cgroup ``group``; return ``group``.

    The ledger was written with the machine's whole memory; this starts its last batches as on a machine
    whose memory the ledger outgrew: a checkpoint writes every page out, the restart empties the shared
    buffers, and ``posix_fadvise(DONTNEED)`` drops the files' clean pages from the page cache.
    """
    run_then_stop(server, "CHECKPOINT")
    for path in server.data_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    server.start()
    running = server.postmaster()
    assert running is not None
    # The postmaster and the children it forked already; later backends inherit the cgroup.
    pids = [running.pid] + [int(p) for p in Path(f"/proc/{running.pid}/task/{running.pid}/children")
                            .read_text().split()]
    for pid in pids:
        (group / "cgroup.procs").write_text(str(pid))
    return group


def read_bytes(group: Path) -> int:
    """Bytes the processes of cgroup ``group`` have read from storage (``read_bytes`` of ``/proc/PID/io``:
    reads the page cache answered are not counted)."""
    total = 0
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            io = Path(f"/proc/{pid}/io").read_text()
        except OSError:
            continue  # ended meanwhile
        total += next(int(line.split()[1]) for line in io.splitlines() if line.startswith("read_bytes:"))
    return total


def release(group: Path) -> None:
    """Remove the cgroup made by :func:`new_group` (its processes must have ended)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def measure(url: str, history: Path, *, total_lines: int, batch_size: int, tail_batches: int,
            before_tail: Callable[[], Path] | None = None) -> dict[str, object]:
    """Ingest ``history`` into the ledger at ``url`` and count the index pages of its last batches.

    Returns:
        ``{"lines", "events", "batches": [{index: pages}], "indexes": {index: {"pages", "touchedPerBatch"}}}``;
        with ``before_tail`` (called between the two parts; it returns the server's memory cgroup), no page
        counts but each of the last batches' ``seconds``, ``linesPerSecond`` and ``readMiB`` (what the server
        read from storage during the batch).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the server lacks ``pg_buffercache_evict_relation`` (before 18).
    """
    db = LedgerDatabase.from_url(url)
    try:
        db.upgrade()
        with db.engine.begin() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_buffercache"))
        head = max(0, total_lines - tail_batches * batch_size)
        lines = read_history(history)
        services.ingest(db, itertools.islice(lines, head), cluster=CLUSTER, batch_size=batch_size)
        names = indexes(db.engine)
        group: Path | None = None
        if before_tail is not None:
            db.engine.dispose()
            group = before_tail()
        # One translator state for every measured batch, as a watch worker or a long replay keeps it: loading
        # it (every live entry, in key order) is not what a batch reads.
        state = db.load_state(CLUSTER)
        per_batch: list[dict[str, int]] = []
        timings: list[dict[str, float]] = []
        for chunk in batches(lines, batch_size):
            if group is not None:
                db.engine.connect().close()  # the pool's connection: its backend joins the cgroup before counting
                start, read_before = time.perf_counter(), read_bytes(group)
                services.ingest(db, chunk, cluster=CLUSTER, batch_size=batch_size, pipelined=False, state=state)
                seconds = time.perf_counter() - start
                timings.append({"seconds": round(seconds, 2), "linesPerSecond": round(len(chunk) / seconds),
                                "readMiB": round((read_bytes(group) - read_before) / 2**20, 1)})
                print(f"batch {len(timings)}: {timings[-1]}", flush=True)
                continue
            evict(db.engine, names)
            services.ingest(db, chunk, cluster=CLUSTER, batch_size=batch_size, pipelined=False, state=state)
            per_batch.append(cached_pages(db.engine, names))
            print(f"batch {len(per_batch)}: " + ", ".join(f"{k} {v}" for k, v in per_batch[-1].items()), flush=True)
        with db.engine.connect() as conn:  # not bench.run.count: this file also runs as a script (A/B runs)
            events = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
        size = sizes(db.engine, names)
    finally:
        db.dispose()
    if group is not None:
        return {"lines": total_lines, "events": events, "batchSize": batch_size, "timedBatches": timings,
                "sizes": size}
    summary = {name: {"pages": size[name],
                      "touchedPerBatch": round(sum(b[name] for b in per_batch) / max(1, len(per_batch)), 1)}
               for name in names}
    return {"lines": total_lines, "events": events, "batchSize": batch_size, "batches": per_batch,
            "indexes": summary}


def main(argv: list[str] | None = None) -> int:
    """Simulate, ingest, print the table and write ``--output``; exit status 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=500, help="Simulated nodes (8 GPUs each).")
    parser.add_argument("--hours", type=float, default=24, help="Simulated hours.")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batches", type=int, default=5, help="Batches measured at the end of the history.")
    parser.add_argument("--batch-size", type=int, default=5000, help="Lines a batch (the replay's default).")
    parser.add_argument("--memory-limit-mib", type=int,
                        help="Time the last batches with the server in a memory cgroup of this size (see above).")
    parser.add_argument("--label", default="", help="A name for this run in the output (e.g. the release).")
    parser.add_argument("-o", "--output", type=Path, default=Path("bench/results-locality.json"),
                        help="Append the run to this JSON Lines file.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dra-ledger-locality-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the embedded server may run as another account
        history = work / "history.jsonl"
        summary = write_history(FleetSpec(nodes=args.nodes, gpus_per_node=8, hours=args.hours, seed=args.seed),
                                history)
        print(f"simulated {args.nodes} nodes x {args.hours} h: {summary.lines:,} lines", flush=True)
        server = EmbeddedPostgres(work / "pg")
        admin = server.start()
        group = new_group(args.memory_limit_mib) if args.memory_limit_mib else None
        peak: int | None = None
        try:
            if group is not None:
                small_buffers(server)
            result = measure(create_database(admin, "locality"), history, total_lines=summary.lines,
                             batch_size=args.batch_size, tail_batches=args.batches,
                             before_tail=(lambda: confine(server, group)) if group is not None else None)
        finally:
            if group is not None:
                peak = int((group / "memory.max_usage_in_bytes").read_text()) // 2**20
            server.stop()
            if group is not None:
                release(group)
    run = {"label": args.label, "nodes": args.nodes, "hours": args.hours, "memoryLimitMiB": args.memory_limit_mib,
           **result}
    if group is not None:
        run["serverPeakMiB"] = peak
        print(f"server's peak in its cgroup: {peak} MiB")
    else:
        print(f"{'index':<44} {'pages':>9} {'touched/batch':>14} {'share':>7}")
        for name, figures in result["indexes"].items():  # type: ignore[attr-defined]
            share = figures["touchedPerBatch"] / max(1, figures["pages"])
            print(f"{name:<44} {figures['pages']:>9,} {figures['touchedPerBatch']:>14,.1f} {share:>7.1%}")
    with args.output.open("a", encoding="utf-8") as f:
        f.write(json.dumps(run) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
