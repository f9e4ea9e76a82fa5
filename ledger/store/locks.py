"""Advisory locks of the report jobs: their keys, in one place, and the calls that take them.

The report jobs replace rows by delete + insert (an hour of ``usage_rollups``, an instant of the report
snapshots). Under READ COMMITTED two such transactions running at once each delete only the rows committed before
them, neither sees the other's uncommitted inserts, and both commit theirs: two copies of every row. That happened
when two ``dra-ledger jobs`` ran at once, or ``watch`` (which runs the jobs unless ``--no-jobs``) beside a ``jobs``
process. The tables have no natural unique key to refuse the second copy (an hour's key columns are nullable, and
a snapshot is a set of rows per instant), and the runs should wait for each other rather than fail, so each job
takes a transaction-level advisory lock before its first read: a second run waits until the first commits, then
reads what it committed and replaces it with the same rows.

Keys are "LEDGER" (0x4C4544474552) followed by a 16-bit number, one number per lock of the ledger:
1 ``ledger.store.schema.MIGRATION_LOCK_KEY``, 2 ``ledger.store.postgres.APPEND_LOCK_KEY``, 3 to 5 below. Every
lock but 5 is ``pg_advisory_xact_lock``: released at commit or rollback, never left behind by a crashed process, and
taken again harmlessly by a transaction that already holds it. Lock 5, the applying marker, is a session lock held
across transactions (:func:`applying`); it too ends with the session of a crashed process. No privilege is needed
(the runtime role of SECURITY.md takes them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

ROLLUP_LOCK_KEY = 0x4C45444745520003
"""Advisory lock key of the rolled hours ("LEDGER" + 3): tables ``usage_rollups`` and ``usage_rollups_by_team``."""
SNAPSHOT_LOCK_KEY = 0x4C45444745520004
"""Advisory lock key of the report snapshots ("LEDGER" + 4): tables ``idle_claim_snapshots``,
``quota_usage_snapshots`` and ``pending_demand_snapshots``."""


def lock_rolled_hours(conn: Connection) -> None:
    """Hold the rolled-hours lock (:data:`ROLLUP_LOCK_KEY`) until the caller's transaction ends; waits, never fails,
    while another transaction holds it.

    Invariant protected: at most one open transaction writes or deletes rows of ``usage_rollups`` and
    ``usage_rollups_by_team``, so an hour is held once, by the sums of the ``device_allocations`` rows committed
    before its rollup. Taken by each rollup chunk (before it reads ``device_allocations``, so the rows it sums are
    those committed when it got the lock) and by every transaction that forgets rolled hours (a projection batch
    that changed allocations, a rebuild): a batch that commits while a chunk is summing the hours it changes waits
    for the chunk, and then forgets the rows the chunk wrote instead of leaving them stale.

    Lock order: a transaction that also truncates ``device_allocations`` (a rebuild) takes this lock first, since a
    chunk holding it goes on to read that table.
    """
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ROLLUP_LOCK_KEY})


def lock_report_snapshots(conn: Connection) -> None:
    """Hold the report-snapshot lock (:data:`SNAPSHOT_LOCK_KEY`) until the caller's transaction ends; waits, never
    fails, while another transaction holds it.

    Invariant protected: the snapshot tables hold one snapshot per (cluster, ``taken_at``): two runs storing the
    same instant at once would each delete nothing and both insert (two copies in ``reporting.idle_claims``,
    ``reporting.quota_usage`` and ``reporting.pending_demand``); in turn, the second replaces the first.
    """
    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SNAPSHOT_LOCK_KEY})


APPLYING_LOCK_KEY = 0x4C45444745520005
"""Advisory lock key of the applying marker ("LEDGER" + 5), held shared by every process while it applies events to
the read models, or records events it will apply once recorded (a ``replay``)."""


@contextmanager
def applying(engine: Engine) -> Iterator[None]:
    """Hold the applying marker (:data:`APPLYING_LOCK_KEY`, shared) while the block runs, on a pooled connection of
    its own; waits only while :func:`others_applying` of another process probes it (an instant).

    Invariant protected: a CLI query that finds the marker free knows no other process is applying events at that
    moment, so it may apply the missing ones itself; one that finds it held answers from the read models as they
    stand rather than waiting for a catch-up of unknown length (or joining it, batch by batch). Shared, so appliers
    never wait for each other here (their batches still take turns on the checkpoint rows).

    The lock is session-level: taken and committed at once, so no transaction stays open for the block's length,
    and released at the end (the connection is discarded instead if that fails, which ends its session and so the
    lock). Nested use in one process takes it again on another connection: shared locks do not conflict.
    """
    conn = engine.connect()
    try:
        conn.execute(text("SELECT pg_advisory_lock_shared(:key)"), {"key": APPLYING_LOCK_KEY})
        conn.commit()
        yield
    finally:
        try:
            conn.execute(text("SELECT pg_advisory_unlock_shared(:key)"), {"key": APPLYING_LOCK_KEY})
            conn.commit()
        except DBAPIError:
            conn.invalidate()  # its session ends, and the lock with it: never back to the pool holding it
        conn.close()


def others_applying(engine: Engine) -> bool:
    """Whether another session holds the applying marker (:func:`applying`) now; never waits.

    Probed by taking the marker exclusively with ``pg_try_advisory_lock`` and, when that succeeds (nobody holds
    it), letting it go at once. Call it only while this process does not hold the marker itself (it would see
    its own).
    """
    with engine.connect() as conn:
        free = bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": APPLYING_LOCK_KEY}).scalar_one())
        if free:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": APPLYING_LOCK_KEY})
        conn.commit()
    return not free
