"""Use cases: the only door for the CLI, the API and the workers into the ledger.

``ingest`` is the single write path: a recorded file and a live watch both hand it watch lines, which
are deduplicated by digest, translated, and appended with the translator state in one transaction per
batch. Queries delegate to :mod:`ledger.projections.queries` after the projections caught up.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ledger.errors import LedgerError
from ledger.projections import queries, runner
from ledger.projections.queries import IdleThresholds
from ledger.recorded import BrokenLine, WatchLine, read_history
from ledger.settings import Settings
from ledger.store import schema
from ledger.store.database import LedgerDatabase
from ledger.store.postgres import ObservationRow
from ledger.translator.fields import opt_str
from ledger.translator.translate import Observation, TranslatorSettings, TranslatorState, translate
from ledger.types import JSONObject

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A line that was stored as a rejected observation: where it was and why."""

    origin: str
    """``FILE:LINE`` (1-based line) or ``watch:KIND``."""
    reason: str


@dataclass(slots=True, kw_only=True)
class IngestReport:
    """What an ingest did: counts of lines, new observations, duplicates, events, and rejections."""

    lines: int = 0
    recorded: int = 0
    duplicates: int = 0
    events: int = 0
    rejected: list[Rejection] = field(default_factory=list)

    def merge(self, other: IngestReport) -> None:
        """Add ``other``'s counts to this report."""
        self.lines += other.lines
        self.recorded += other.recorded
        self.duplicates += other.duplicates
        self.events += other.events
        self.rejected.extend(other.rejected)


def _chunks(items: Iterable[WatchLine | BrokenLine], size: int) -> Iterator[list[WatchLine | BrokenLine]]:
    chunk: list[WatchLine | BrokenLine] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _row_for(line: WatchLine, *, recorded_at: datetime, origin: str, error: str | None) -> ObservationRow:
    obj = line.object
    meta = obj.get("metadata")

    def meta_str(key: str) -> str | None:
        value = meta.get(key) if isinstance(meta, dict) else None
        return value if isinstance(value, str) else None

    kind, api = obj.get("kind"), obj.get("apiVersion")
    return ObservationRow(
        digest=line.digest, status="rejected" if error else "recorded",
        kind=kind if isinstance(kind, str) else None, api_version=api if isinstance(api, str) else None,
        namespace=meta_str("namespace"), name=meta_str("name"), uid=meta_str("uid"),
        resource_version=meta_str("resourceVersion"), watch_type=line.type, observed_at=line.observed_at,
        recorded_at=recorded_at, origin=origin, error=error, body=obj)


def ingest(db: LedgerDatabase, lines: Iterable[WatchLine | BrokenLine], *, cluster: str,
           settings: TranslatorSettings = TranslatorSettings(), at: datetime | None = None,
           batch_size: int = 1000, progress: Progress | None = None,
           state: TranslatorState | None = None) -> IngestReport:
    """Record watch lines as observations and translate them into events, idempotently.

    Each batch commits its observations, events and translator state together under the append
    lock, so a crash loses nothing half-written and a re-run skips what was committed (observation
    digests are unique). One writer per cluster is assumed (the watch worker holds a Lease).

    Args:
        db: the ledger database (schema at head).
        lines: parsed lines from :func:`ledger.recorded.read_history` or a watch.
        cluster: the cluster the objects come from.
        at: receive time for lines that carry none (``None``: the time of recording).
        batch_size: lines per transaction.
        progress: called with the number of lines handled after each batch.
        state: translator memory to reuse between calls (loaded from the database when ``None``).

    Returns:
        Counts, plus every rejected line with its origin and reason (broken lines, invalid or
        unsupported objects). Rejections never stop the lines after them.

    Raises:
        StreamConflict: another writer appended to the same streams concurrently.
    """
    report = IngestReport()
    if state is None:
        state = db.load_state(cluster)
    for chunk in _chunks(lines, batch_size):
        recorded_at = datetime.now(UTC)
        chunk_report = IngestReport(lines=len(chunk))
        with db.append(cluster, state) as batch:
            seen = batch.known([x.digest for x in chunk])
            for item in chunk:
                origin = f"{item.source}:{item.line}"
                if item.digest in seen:
                    chunk_report.duplicates += 1
                    continue
                seen.add(item.digest)
                if isinstance(item, BrokenLine):
                    batch.observations.append(ObservationRow(
                        digest=item.digest, status="rejected", kind=None, api_version=None, namespace=None,
                        name=None, uid=None, resource_version=None, watch_type=None, observed_at=None,
                        recorded_at=recorded_at, origin=origin, error=item.reason, body=item.text))
                    chunk_report.rejected.append(Rejection(origin=origin, reason=item.reason))
                    continue
                observed = item.observed_at or at or recorded_at
                obs = Observation(type=item.type, object=item.object, observed_at=observed,
                                  recorded_at=recorded_at, digest=item.digest)
                try:
                    produced = translate(state, obs, settings)
                except (LedgerError, ValueError, TypeError, KeyError) as e:
                    # A bad object is recorded and reported, never allowed to stop the batch.
                    reason = f"{_describe(item)}: {e}"
                    batch.observations.append(_row_for(item, recorded_at=recorded_at, origin=origin, error=reason))
                    chunk_report.rejected.append(Rejection(origin=origin, reason=reason))
                    continue
                batch.observations.append(_row_for(item, recorded_at=recorded_at, origin=origin, error=None))
                batch.events.extend(produced)
            chunk_report.recorded = len(batch.observations)
            chunk_report.events = len(batch.events)
        report.merge(chunk_report)
        if progress is not None:
            progress(len(chunk))
    return report


def _describe(item: WatchLine) -> str:
    obj = item.object
    kind = obj.get("kind") if isinstance(obj.get("kind"), str) else "object"
    try:
        name = opt_str(obj, "metadata.name") or "?"
        ns = opt_str(obj, "metadata.namespace")
    except LedgerError:
        name, ns = "?", None
    return f"{item.type} {kind} {ns + '/' if ns else ''}{name}"


def replay_files(db: LedgerDatabase, paths: Sequence[Path], *, cluster: str, at: datetime | None = None,
                 settings: TranslatorSettings = TranslatorSettings(), batch_size: int = 1000,
                 progress: Progress | None = None) -> IngestReport:
    """Replay recorded histories (DESIGN §9), kubectl watch output or kubectl Lists, then catch up.

    Files are read in the order given. Replaying the same file again adds no rows.

    Args:
        paths: files to read (JSON Lines, ``kubectl get -o json --watch --output-watch-events``, or
            ``kubectl get -o yaml|json`` Lists / single objects treated as ADDED).
        at: receive time for lines without one (Lists); ``None`` = the objects' own timestamps where
            they have them, else now.

    Raises:
        OSError: a file cannot be read.
    """
    report = IngestReport()
    state = db.load_state(cluster)
    for path in paths:
        report.merge(ingest(db, read_history(path, at=at), cluster=cluster, settings=settings, at=at,
                            batch_size=batch_size, progress=progress, state=state))
    runner.catch_up(db.engine)
    return report


def dumps(body: object) -> str:
    """Encode a query body as the JSON the CLI prints and the API returns (UTF-8, 2-space indent)."""
    return json.dumps(body, indent=2, ensure_ascii=False)


# --- opening the ledger ---------------------------------------------------------------------------

EMBEDDED_DATABASE = "dra_ledger"
"""Database name the ledger uses on its embedded server."""


def open_ledger(settings: Settings) -> LedgerDatabase:
    """Open the ledger database named by ``settings``, its schema current.

    With ``settings.database_url``: the schema is checked, never changed. Without it: an embedded
    PostgreSQL in ``settings.data_dir`` is started or reused, database ``dra_ledger`` is created if
    missing and migrated to head (the ledger owns that server).

    Raises:
        SchemaNotReady: an external database is not at this code's schema revision; the message says
            to run ``dra-ledger db upgrade``.
        EmbeddedPostgresError: the embedded server cannot start (the message carries its log).
    """
    if settings.database_url:
        db = LedgerDatabase.from_url(settings.database_url)
        db.require_current()
        return db
    from ledger.embedded import EmbeddedPostgres, default_data_dir

    server = EmbeddedPostgres(settings.data_dir or default_data_dir())
    db = LedgerDatabase.from_url(schema.ensure_database(server.start(), EMBEDDED_DATABASE))
    db.upgrade()
    return db


# --- projections ----------------------------------------------------------------------------------


def catch_up(db: LedgerDatabase, *, progress: Progress | None = None) -> int:
    """Bring every read model up to the newest event; returns how many events were applied."""
    return runner.catch_up(db.engine, progress=progress)


def rebuild(db: LedgerDatabase, *, progress: Progress | None = None) -> int:
    """Rebuild every read model from global position 0, swapped in at commit; returns events applied."""
    return runner.rebuild(db.engine, progress=progress)


def projection_lag(db: LedgerDatabase) -> dict[str, int]:
    """Events not yet applied, per projection (head global position - checkpoint)."""
    return runner.lag(db.engine)


# --- queries (read models only; the bodies the CLI prints and the API returns) --------------------


def occupancy(db: LedgerDatabase, *, at: datetime, cluster: str | None = None, node: str | None = None,
              driver: str | None = None, pool: str | None = None) -> JSONObject:
    """Every device at ``at`` with its holders, and totals; see :func:`ledger.projections.queries.occupancy`."""
    with db.reading() as conn:
        return queries.occupancy(conn, at=at, cluster=cluster, node=node, driver=driver, pool=pool)


def usage(db: LedgerDatabase, *, start: datetime, end: datetime, group_by: str,
          cluster: str | None = None) -> JSONObject:
    """Device-hours over ``[start, end)``; see :func:`ledger.projections.queries.usage`.

    Raises:
        Invalid: unknown ``group_by`` or an empty window.
    """
    with db.reading() as conn:
        return queries.usage(conn, start=start, end=end, group_by=group_by, cluster=cluster)


def claims(db: LedgerDatabase, *, at: datetime, state: str = "all", cluster: str | None = None,
           namespace: str | None = None) -> JSONObject:
    """Claims at ``at``; see :func:`ledger.projections.queries.claims`.

    Raises:
        Invalid: unknown ``state``.
    """
    with db.reading() as conn:
        return queries.claims(conn, at=at, state=state, cluster=cluster, namespace=namespace)


def idle_claims(db: LedgerDatabase, *, at: datetime, min_idle: timedelta | None = None,
                thresholds: IdleThresholds = IdleThresholds(), cluster: str | None = None) -> JSONObject:
    """The idle-claim report at ``at``; see :func:`ledger.projections.queries.idle_claims`."""
    with db.reading() as conn:
        return queries.idle_claims(conn, at=at, min_idle=min_idle, thresholds=thresholds, cluster=cluster)
