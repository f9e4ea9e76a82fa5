"""Use cases: the only door for the CLI, the API and the workers into the ledger.

``ingest`` is the single write path: a recorded file and a live watch both hand it watch lines, which
are deduplicated by digest, translated, and appended with the translator state in one transaction per
batch. Queries delegate to :mod:`ledger.projections.queries` after the projections caught up.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from ledger.config import DEFAULT, LedgerConfig
from ledger.errors import (
    CheckpointsLocked,
    Conflict,
    Invalid,
    LedgerError,
    StoreUnavailable,
    StreamConflict,
    printable,
)
from ledger.events import NewEvent, RecordedEvent
from ledger.projections import counts, queries, rollups, runner, settled, snapshots
from ledger.projections import pending as pending_demand
from ledger.projections import quotas as quota_counting
from ledger.projections import shared as sharing
from ledger.projections.base import clusters as recorded_clusters
from ledger.projections.queries import DeviceSortKey, IdleThresholds, rfc3339
from ledger.recorded import (
    BrokenLine,
    WatchLine,
    WatchType,
    broken_watch_line,
    not_an_object,
    read_history,
    watch_line,
)
from ledger.settings import Settings
from ledger.store import locks, schema
from ledger.store.cancel import CANCEL_REPEAT, StatementCancel
from ledger.store.database import (
    AppendBatch,
    LedgerDatabase,
    PreparedAppend,
    lock_for_reading,
    unavailable_as_error,
)
from ledger.store.locks import lock_rolled_hours, others_applying
from ledger.store.postgres import (
    EVICTED_PREFIXES,
    Analyzed,
    EntryBehind,
    ObservationKey,
    ObservationRow,
    WatchCheckpointRow,
    count_cluster_observations,
    dirty_rows,
    json_bytes,
)
from ledger.translator import relist
from ledger.translator.fields import opt_str
from ledger.translator.repair import REBUILT_PREFIXES, rebuilt_entry
from ledger.translator.translate import Observation, TranslatorSettings, TranslatorState, translate
from ledger.types import GlobalPosition, JSONObject, JSONValue

log = logging.getLogger(__name__)

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A line that was stored as a rejected observation: where it was and why."""

    origin: str
    """``FILE:LINE`` (1-based line) or ``watch:KIND``."""
    reason: str
    """Why, on one line: the object's own text it quotes (a kind, a name) has its control characters escaped
    (:func:`ledger.errors.printable`: NUL, which text columns refuse, line ends and terminal escapes), so the
    reason is safe to store, print and log as it is."""
    already_recorded: bool = False
    """The line was found stored as rejected by an earlier run (so it also counts in
    ``IngestReport.duplicates``); ``False``: stored as rejected by this ingest."""


@dataclass(slots=True, kw_only=True)
class IngestReport:
    """What an ingest did: counts of lines, new observations, duplicates, events, and rejections."""

    lines: int = 0
    recorded: int = 0
    duplicates: int = 0
    """Lines already stored (an earlier run, or earlier in this one): nothing is written for them."""
    events: int = 0
    rejected: list[Rejection] = field(default_factory=list)
    """Bad lines: stored as rejected now, or found stored as rejected by an earlier run (then they also
    count in ``duplicates``, and the reason ends with "(already recorded as rejected)")."""
    went_back: int = 0
    """Lines received (``observedAt``) before a line read ahead of them: a file out of order, or files given out of
    order. Counted by :func:`replay_files` over all its files in the order given (:class:`_ReceiveOrder`), not by
    :func:`ingest` nor by :meth:`merge`."""
    went_back_most: timedelta = timedelta(0)
    """The longest of those steps back."""

    def merge(self, other: IngestReport) -> None:
        """Add ``other``'s counts to this report."""
        self.lines += other.lines
        self.recorded += other.recorded
        self.duplicates += other.duplicates
        self.events += other.events
        self.rejected.extend(other.rejected)


def _chunks(items: Iterable[WatchLine | BrokenLine], size: int) -> Iterator[list[WatchLine | BrokenLine]]:
    """``items`` in lists of ``size`` (the last one shorter), with a young garbage collection every
    :data:`COLLECT_EVERY_LINES` items: automatic ones are off while ingesting (:func:`_no_automatic_collections`),
    and this bounds the garbage cycles a code path might make until the ingest ends."""
    chunk: list[WatchLine | BrokenLine] = []
    since_collection = 0
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            since_collection += len(chunk)
            if since_collection >= COLLECT_EVERY_LINES:
                gc.collect(0)
                since_collection = 0
            yield chunk
            chunk = []
    if chunk:
        yield chunk


COLLECT_EVERY_LINES = 100_000
"""Lines between two young garbage collections of an ingest (:func:`_chunks`). One costs about one scan of the
objects still alive then (two batches in hand: ~0.1 s), so ~1 µs a line at this spacing."""


def _row_for(line: WatchLine, *, recorded_at: datetime, origin: str, error: str | None) -> ObservationRow:
    obj = line.object
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    kind, api = obj.get("kind"), obj.get("apiVersion")
    namespace, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
    version = meta.get("resourceVersion")
    return ObservationRow(
        digest=line.digest, status="rejected" if error else "recorded",
        kind=kind if isinstance(kind, str) else None, api_version=api if isinstance(api, str) else None,
        namespace=namespace if isinstance(namespace, str) else None, name=name if isinstance(name, str) else None,
        uid=uid if isinstance(uid, str) else None, resource_version=version if isinstance(version, str) else None,
        watch_type=line.type, observed_at=line.observed_at, recorded_at=recorded_at, origin=origin, error=error,
        body=line.object_json)


def ingest(db: LedgerDatabase, lines: Iterable[WatchLine | BrokenLine], *, cluster: str,
           settings: TranslatorSettings = TranslatorSettings(), at: datetime | None = None,
           batch_size: int = 5000, progress: Progress | None = None,
           state: TranslatorState | None = None,
           on_batch: Callable[[AppendBatch], None] | None = None, pipelined: bool = True) -> IngestReport:
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
        state: translator memory to reuse between calls (loaded from the database when ``None``, and
            loaded again when a failed call left it stale). After a failure it is either the database's
            again or stale (emptied, ``TranslatorState.forget``), never ahead of what committed.
        on_batch: called with each batch before it is written, inside its transaction (the watch
            workers add their resourceVersion checkpoint there).
        pipelined: let a writer thread commit each batch while the next one is translated
            (:func:`_ingest_pipelined`); ``False``, or any ``on_batch``, writes batch after batch in this
            thread, so that a failure leaves exactly the earlier batches committed.

    Returns:
        Counts, plus every rejected line with its origin and reason (broken lines, invalid or
        unsupported objects). Rejections never stop the lines after them.

    Raises:
        StreamConflict: another writer kept moving the same streams first, :data:`CONFLICT_RETRIES`
            times in a row (a batch losing a race is retried after re-reading the state).
    """
    report = IngestReport()
    if state is None:
        state = db.load_state(cluster)
    _load_if_stale(db, cluster, state)
    with _no_automatic_collections():
        _ingest_all(db, lines, report, cluster=cluster, settings=settings, at=at, batch_size=batch_size,
                    progress=progress, state=state, on_batch=on_batch, pipelined=pipelined)
    return report


@contextmanager
def _no_automatic_collections() -> Iterator[None]:
    """Turn the cyclic garbage collector's automatic runs off while ingesting; turn them on again after.

    Why: every decoded object, event and row is a container that a collection scans, and a batch keeps
    thousands alive, so each automatic collection rescanned them. Even with the young threshold raised to
    20,000 (the previous setting) it cost about an eighth of an ingest's Python: in four pairs on the 50-node
    history, 68-77 µs a watch event with it and 62-67 without, 12,590 -> 14,095 lines/s at the medians
    (``bench/results-ingest-gc.json``). An ingest makes next to no cyclic garbage (a full collection after a
    38,294-line replay found 8 unreachable objects, and the same 8 after one with 7,464 rejected lines);
    reference counting frees the rest as each batch is dropped.
    :func:`_chunks` still runs a young collection every :data:`COLLECT_EVERY_LINES` lines, so garbage cycles
    stay bounded on a replay of any length. Automatic collections run again when the last ingest in the
    process ends (ingests may overlap in threads), if they were on when the first began.
    """
    global _ingesting, _was_enabled
    with _GC_LOCK:
        if _ingesting == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _ingesting += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _ingesting -= 1
            if _ingesting == 0 and _was_enabled:
                gc.enable()


_GC_LOCK = threading.Lock()
"""Guards :data:`_ingesting` and :data:`_was_enabled`: the collector's switch is one for the whole process."""
_ingesting = 0
_was_enabled = True


def _ingest_all(db: LedgerDatabase, lines: Iterable[WatchLine | BrokenLine], report: IngestReport, *,
                cluster: str, settings: TranslatorSettings, at: datetime | None, batch_size: int,
                progress: Progress | None, state: TranslatorState,
                on_batch: Callable[[AppendBatch], None] | None, pipelined: bool) -> None:
    if pipelined and on_batch is None:
        _ingest_pipelined(db, lines, report, cluster=cluster, settings=settings, at=at, batch_size=batch_size,
                          progress=progress, state=state)
        return
    for chunk in _chunks(lines, batch_size):
        report.merge(_ingest_with_retries(db, chunk, cluster=cluster, settings=settings, at=at, state=state,
                                          on_batch=on_batch))
        if progress is not None:
            progress(len(chunk))


def _ingest_with_retries(db: LedgerDatabase, chunk: Sequence[WatchLine | BrokenLine], *, cluster: str,
                         settings: TranslatorSettings, at: datetime | None, state: TranslatorState,
                         on_batch: Callable[[AppendBatch], None] | None) -> IngestReport:
    for attempt in range(1, CONFLICT_RETRIES + 1):
        _load_if_stale(db, cluster, state)
        try:
            return _ingest_chunk(db, chunk, cluster=cluster, settings=settings, at=at, state=state,
                                 on_batch=on_batch)
        except StreamConflict:
            # Another writer appended to these streams first. db.append left the translator state stale, so
            # the next attempt loads it again: translating again skips what the other writer recorded
            # (digests) and continues its stream positions.
            if attempt == CONFLICT_RETRIES:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _load_if_stale(db: LedgerDatabase, cluster: str, state: TranslatorState) -> None:
    """Load ``state`` again, in place, from table ``translator_state`` if a failed write left it stale.

    The one place where a state in use is loaded again. Its entries were dropped when it went stale
    (``TranslatorState.forget``), so a stale copy and a fresh one are never held at once (each is the
    whole translator memory: hundreds of MiB on a large cluster).

    Raises:
        sqlalchemy.exc.OperationalError: the database cannot be reached; ``state`` stays stale.
    """
    if state.stale:
        state.take(db.load_state(cluster))


@dataclass(frozen=True, slots=True)
class StateRepair:
    """What :func:`repair_state` found in one cluster's translator state (table ``translator_state``)."""

    cluster: str
    repaired: list[EntryBehind]
    """Entries that were behind their streams, now rebuilt from their events (claims, pods, namespaces,
    DeviceClasses, DeviceTaintRules; key order)."""
    left: list[EntryBehind]
    """Pool entries behind their streams, left as they are: nothing here rebuilds them (key order)."""


def repair_state(db: LedgerDatabase, *, cluster: str | None = None) -> list[StateRepair]:
    """Rebuild, from their events, the translator state entries that are behind their streams.

    For ledgers written by release 0.3.0, which could save an object's entry behind its stream; every event
    translated for such an object was then refused as a ``StreamConflict`` (see :mod:`ledger.translator.repair`).
    Entries of ResourceClaims, Pods, Namespaces, DeviceClasses and DeviceTaintRules are rebuilt
    (:data:`ledger.translator.repair.REBUILT_PREFIXES`); a pool's are named and left.
    Each cluster is repaired in one append transaction under the append lock (no writer moves a stream
    meanwhile), which counts itself in ``cluster_appends``, so a running writer loads the repaired state before its
    next batch. Idempotent: a second run finds nothing.

    Args:
        db: the ledger.
        cluster: only this cluster; ``None``: every cluster the ledger holds events of.

    Returns:
        One :class:`StateRepair` per cluster, in cluster order (clusters with nothing behind included).

    Raises:
        StoreUnavailable: the database cannot be reached; nothing of the cluster being repaired was written.
        ValueError: a stream does not run from position 1 in order, or a claim's does not begin with ``ClaimCreated``
            (no ledger writes one).
    """
    with unavailable_as_error():
        if cluster is None:
            with db.reading(autocommit=True) as conn:
                names = recorded_clusters(conn)
        else:
            names = [cluster]
        out: list[StateRepair] = []
        for name in names:
            state = db.load_state(name)
            with db.append(name, state) as batch:
                behind = batch.entries_behind_streams()
                repaired = [b for b in behind if b.key.startswith(REBUILT_PREFIXES)]
                for entry in repaired:
                    state.put(entry.key, rebuilt_entry(batch.read_stream(entry.key)))
            out.append(StateRepair(cluster=name, repaired=repaired,
                                   left=[b for b in behind if not b.key.startswith(REBUILT_PREFIXES)]))
        return out


CONFLICT_RETRIES = 5
"""Attempts per batch when another writer moves a stream first (each retry re-reads the state)."""


@dataclass(slots=True)
class _InFlight:
    """A translated batch handed to the writer thread, and what to do once it committed."""

    chunk: Sequence[WatchLine | BrokenLine]
    report: IngestReport
    written: Future[None]
    touched: set[str]
    """State keys the batch changed or loaded: tombstones among them leave memory once it committed."""
    known: dict[str, str | None]
    """Digests of the batch's observations with their rejection reasons: the next batch's duplicates."""


def _ingest_pipelined(db: LedgerDatabase, lines: Iterable[WatchLine | BrokenLine], report: IngestReport, *,
                      cluster: str, settings: TranslatorSettings, at: datetime | None, batch_size: int,
                      progress: Progress | None, state: TranslatorState) -> None:
    """Ingest with batch N written by a writer thread while batch N + 1 is read and translated.

    Why: a sequential ingest left the server idle while Python translated and Python idle while the
    server parsed and indexed the rows (a tenth of the samples were waits on the server); on two cores the
    two now overlap. At most one batch is in flight; each still commits its observations, events and
    translator state in one transaction, in order, so a crash loses no more than sequential batches would.

    The duplicate check and the tombstone fetch of batch N + 1 run before batch N commits, outside the
    append lock: batch N's digests count as known, and a tombstone batch N wrote stays in memory until
    no later translated batch touched it. Should another writer record a batch's observations or move its
    streams first (one writer per cluster is assumed, but concurrent replays of one file happen), the
    state is reloaded and the two batches in hand are ingested again the sequential way, under the lock.
    Any other failure lets the writes handed over end, then reads the state back and raises; Ctrl-C cancels
    them first (as it cancels a sequential ingest's write), so a write stuck on the lock cannot hold it up.
    """
    in_flight: _InFlight | None = None
    cancel: StatementCancel | None = None  # stops the latest write handed over (made before its submit)

    def again(chunks: Sequence[Sequence[WatchLine | BrokenLine]]) -> None:
        # Lost a race: forget the translation of the batches in hand and ingest them again under the lock.
        state.forget()
        for lost in chunks:
            report.merge(_ingest_with_retries(db, lost, cluster=cluster, settings=settings, at=at, state=state,
                                              on_batch=None))
            if progress is not None:
                progress(len(lost))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-append") as writer:
        try:
            for chunk in _chunks(lines, batch_size):
                recorded_at = datetime.now(UTC)
                known = db.known_digests(cluster, _keys(chunk))
                pending = in_flight.touched if in_flight is not None else set()
                if in_flight is not None:
                    known = {**in_flight.known, **known}
                # Keys the batch in flight changed are current in memory only: never fetch them.
                fetched = db.load_entries(cluster, [k for k in _absent_keys(chunk, set(known), state)
                                                    if k not in pending])
                for key, body in fetched.items():
                    state.entries.load_json(key, body)
                observations: list[ObservationRow] = []
                events: list[NewEvent] = []
                chunk_report = _translate_lines(chunk, known, cluster=cluster, settings=settings, at=at,
                                                recorded_at=recorded_at, state=state, observations=observations,
                                                events=events)
                touched = set(state.dirty) | set(fetched)
                rows = PreparedAppend(observations=observations, events=events, state=dirty_rows(state),
                                      appends=state.appends)
                state.appends = rows.appends_after  # the next batch is translated against this one committed
                if in_flight is not None:
                    try:
                        _settle(in_flight, state, report, progress, later=touched)
                    except Conflict:
                        lost, in_flight = in_flight, None
                        again([lost.chunk, chunk])
                        continue
                cancel = StatementCancel()
                in_flight = _InFlight(chunk=chunk, report=chunk_report, touched=touched,
                                      written=writer.submit(db.write, cluster, rows, cancel),
                                      known={o.digest: o.error for o in observations})
            if in_flight is not None:
                try:
                    _settle(in_flight, state, report, progress, later=set())
                except Conflict:
                    lost, in_flight = in_flight, None
                    again([lost.chunk])
                in_flight = None
        except BaseException as error:
            # Whatever failed (a write, the file, the caller's interrupt), memory may hold changes that did not
            # commit: wait for the writes handed over and match the state to the database again. Every write
            # submitted, not only ``in_flight``: a failure right after a submit (before ``in_flight`` names it)
            # left that write running while the state was read back, and it committed after.
            if cancel is not None and not isinstance(error, Exception):
                # Ctrl-C (or SystemExit) stops the write too, as it stops a sequential ingest's: waited for, a
                # write stuck on the append lock or in a stalled statement kept the process from ever stopping.
                _stop_writes(writer, cancel)
            writer.shutdown(wait=True)
            state.forget()
            _load_if_stale(db, cluster, state)  # the caller gets the database's state back (stale if this fails)
            raise


def _stop_writes(writer: ThreadPoolExecutor, cancel: StatementCancel) -> None:
    """Cancel the latest write handed to ``writer`` (``cancel``'s) and return once every write handed over ended.

    ``writer`` has one worker, which runs writes in the order submitted: a no-op submitted now runs once they
    all ended. Until then the cancel request goes again every :data:`CANCEL_REPEAT` seconds: PostgreSQL
    ignores one that reaches the write between two statements, and the next may be the one that waits.
    """
    ended = writer.submit(lambda: None)
    while True:
        cancel.request()
        if wait([ended], timeout=CANCEL_REPEAT).done:
            return


def _settle(done: _InFlight, state: TranslatorState, report: IngestReport, progress: Progress | None, *,
            later: set[str]) -> None:
    """Wait for ``done``'s write; once committed, count it and drop its tombstones that no later batch
    touched (``later``) from memory.

    Raises:
        whatever the write raised (a ``Conflict`` for a lost race).
    """
    done.written.result()
    report.merge(done.report)
    _evict_tombstones(state, done.touched - later)
    if progress is not None:
        progress(len(done.chunk))


def _ingest_chunk(db: LedgerDatabase, chunk: Sequence[WatchLine | BrokenLine], *, cluster: str,
                  settings: TranslatorSettings, at: datetime | None, state: TranslatorState,
                  on_batch: Callable[[AppendBatch], None] | None) -> IngestReport:
    """One append transaction for ``chunk`` (see :func:`ingest`)."""
    recorded_at = datetime.now(UTC)
    with db.append(cluster, state) as batch:
        known = batch.known(_keys(chunk))
        # Tombstones of claims and pods live in the database only: fetch those this chunk's lines touch.
        fetched = batch.load_entries(_absent_keys(chunk, set(known), state))
        for key, body in fetched.items():
            state.entries.load_json(key, body)
        chunk_report = _translate_lines(chunk, known, cluster=cluster, settings=settings, at=at,
                                        recorded_at=recorded_at, state=state, observations=batch.observations,
                                        events=batch.events)
        if on_batch is not None:
            on_batch(batch)
        touched = set(state.dirty) | set(fetched)
    _evict_tombstones(state, touched)
    return chunk_report


def _evict_tombstones(state: TranslatorState, keys: Iterable[str]) -> None:
    """Drop the tombstones among ``keys`` from memory (call once they are committed: they are in the
    database). The prefix first: entries are kept packed, and reading a pool decompresses it."""
    for key in keys:
        if not key.startswith(EVICTED_PREFIXES):
            continue
        entry = state.entries.get(key)
        if entry is not None and entry.get("deleted"):
            del state.entries[key]


def _translate_lines(chunk: Sequence[WatchLine | BrokenLine], known: dict[str, str | None], *, cluster: str,
                     settings: TranslatorSettings, at: datetime | None, recorded_at: datetime,
                     state: TranslatorState, observations: list[ObservationRow],
                     events: list[NewEvent]) -> IngestReport:
    """Translate ``chunk`` against ``state``: append an observation per new line to ``observations`` and
    the events produced to ``events``; lines whose digest is in ``known`` count as duplicates.

    Returns:
        The chunk's counts; broken, invalid and unsupported lines are recorded as rejected observations
        and reported, never raised.
    """
    chunk_report = IngestReport(lines=len(chunk))
    seen = set(known)
    # A line rejected by an earlier replay is still a bad line: report it again (a re-run of a bad file
    # must not look clean), with the reason stored then.
    rejected_before = {digest: reason for digest, reason in known.items() if reason is not None}
    for item in chunk:
        origin = f"{item.source}:{item.line}"
        if item.digest in seen:
            chunk_report.duplicates += 1
            if (reason := rejected_before.pop(item.digest, None)) is not None:
                # printable again: an earlier release stored the object's own text in the reason as it came.
                chunk_report.rejected.append(Rejection(origin=origin, reason=f"{printable(reason)} (already "
                                                       "recorded as rejected)", already_recorded=True))
            continue
        seen.add(item.digest)
        if isinstance(item, BrokenLine):
            observations.append(ObservationRow(
                digest=item.digest, status="rejected", kind=None, api_version=None, namespace=None,
                name=None, uid=None, resource_version=None, watch_type=None, observed_at=item.observed_at,
                recorded_at=recorded_at, origin=origin, error=printable(item.reason),
                body=json_bytes(_no_nul(item.text))))
            chunk_report.rejected.append(Rejection(origin=origin, reason=printable(item.reason)))
            continue
        if item.holds_nul:
            reason = printable(f"{_describe(item)}: holds a NUL character (\\u0000), which PostgreSQL "
                               "cannot store")
            observations.append(ObservationRow(
                digest=item.digest, status="rejected", kind=None, api_version=None, namespace=None,
                name=None, uid=None, resource_version=None, watch_type=item.type,
                observed_at=item.observed_at, recorded_at=recorded_at, origin=origin, error=reason,
                body=json_bytes(item.object_json.decode())))  # as a JSON string: the escape stays six characters
            chunk_report.rejected.append(Rejection(origin=origin, reason=reason))
            continue
        observed = item.observed_at or at or recorded_at
        # Event ids derive from this digest: prefix the cluster so the same history replayed into
        # two clusters gives two sets of events (ids are unique store-wide).
        obs = Observation(type=item.type, object=item.object, observed_at=observed,
                          recorded_at=recorded_at, digest=f"{cluster}/{item.digest}")
        try:
            produced = translate(state, obs, settings)
        except (LedgerError, ValueError, TypeError, KeyError, AttributeError, IndexError, ArithmeticError,
                RecursionError) as e:
            # A bad object is recorded and reported, never allowed to stop the batch.
            reason = printable(f"{_describe(item)}: {e}")
            observations.append(_row_for(item, recorded_at=recorded_at, origin=origin, error=reason))
            chunk_report.rejected.append(Rejection(origin=origin, reason=reason))
            continue
        observations.append(_row_for(item, recorded_at=recorded_at, origin=origin, error=None))
        events.extend(produced)
        chunk_report.recorded += 1
    chunk_report.events = len(events)
    return chunk_report


def _keys(chunk: Sequence[WatchLine | BrokenLine]) -> list[ObservationKey]:
    """The observation keys of ``chunk``: (receive time, digest), the time ``None`` for a line without one (a
    broken line of a file, a line of kubectl output), as ``observations.observed_at`` stores them."""
    return [(x.observed_at, x.digest) for x in chunk]


def _absent_keys(chunk: Sequence[WatchLine | BrokenLine], seen: set[str], state: TranslatorState) -> list[str]:
    """State keys of the claims and pods in ``chunk`` that the in-memory state does not hold."""
    keys: set[str] = set()
    for item in chunk:
        if isinstance(item, WatchLine) and item.digest not in seen and not item.holds_nul:
            try:
                key = relist.state_key(item.object)
            except (LedgerError, ValueError, TypeError, AttributeError):
                continue  # a malformed object: the translator rejects it with the reason
            if key is not None and key.startswith(EVICTED_PREFIXES) and key not in state.entries:
                keys.add(key)
    return sorted(keys)


def _no_nul(text: str) -> str:
    """``text`` with NUL characters written as ``\\u0000`` (text columns refuse U+0000)."""
    return text.replace("\x00", "\\u0000")


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
                 settings: TranslatorSettings = TranslatorSettings(), batch_size: int = 5000,
                 progress: Progress | None = None, catch_up: bool = True) -> IngestReport:
    """Replay recorded histories (DESIGN §9), kubectl watch output or kubectl Lists, then catch up.

    Files are read in the order given. Replaying the same file again adds no rows.

    Args:
        paths: files to read (JSON Lines, ``kubectl get -o json --watch --output-watch-events``, or
            ``kubectl get -o yaml|json`` Lists / single objects treated as ADDED).
        at: receive time for lines without one (Lists); ``None`` = the objects' own timestamps where
            they have them, else now.
        catch_up: bring the read models up to the new events afterwards (:func:`catch_up`, which analyzes the
            tables after a bulk load); ``False``: the caller does, to report on it.

    Raises:
        OSError: a file cannot be read.
        ProjectionFailed: the catch-up met an event it cannot apply (the events stay recorded).
    """
    report = IngestReport()
    state = db.load_state(cluster)
    order = _ReceiveOrder(report)
    for path in paths:
        report.merge(ingest(db, order.watch(read_history(path, at=at)), cluster=cluster, settings=settings, at=at,
                            batch_size=batch_size, progress=progress, state=state))
    if catch_up:
        _catch_up(db)
    return report


@dataclass(slots=True)
class _ReceiveOrder:
    """Counts, into ``report`` (``went_back``, ``went_back_most``), the lines received before a line read ahead of
    them.

    Why: the translator takes lines in the order read and dates a release when it was received, so a release read
    after its allocation but received before it closes an interval that never opened (the allocation bills nothing),
    without any line being wrong on its own. Such a file is worth a word, not a refusal: its lines are recorded as
    they are.
    """

    report: IngestReport
    latest: datetime | None = None

    def watch(self, lines: Iterable[WatchLine | BrokenLine]) -> Iterator[WatchLine | BrokenLine]:
        """``lines`` unchanged, each watch line's receive time compared with the latest before it."""
        for line in lines:
            received = line.observed_at if isinstance(line, WatchLine) else None
            if received is not None:
                if self.latest is None or received >= self.latest:
                    self.latest = received
                else:
                    self.report.went_back += 1
                    self.report.went_back_most = max(self.report.went_back_most, self.latest - received)
            yield line


def dumps(body: object) -> str:
    """Encode a query body as the JSON the CLI prints and the API returns (UTF-8, 2-space indent)."""
    return json.dumps(body, indent=2, ensure_ascii=False)


# --- opening the ledger ---------------------------------------------------------------------------

EMBEDDED_DATABASE = "dra_ledger"
"""Database name the ledger uses on its embedded server."""


def translator_settings(settings: Settings, config: LedgerConfig, *,
                        config_path: Path | str | None) -> TranslatorSettings:
    """The translator's settings for recording: the namespace label that names a team.

    The label comes from the configuration file's ``teams.label`` where the file sets it, else from
    ``LEDGER_TEAM_LABEL`` (``Settings.team_label``), else ``team``. It is read when a namespace is recorded
    (``Namespace.metadata.labels[label]`` becomes a TeamAssigned event), so it decides attribution from then on;
    recorded events are never rewritten (``teams.overrides`` is the retroactive knob, applied at query time).

    Raises:
        Invalid: the file and ``LEDGER_TEAM_LABEL`` both name a label and they differ (which one should bill
            is not guessed); the message names both and ``config_path``.
    """
    label = settings.team_label
    if "label" in config.teams.model_fields_set:
        if "team_label" in settings.model_fields_set and settings.team_label != config.teams.label:
            raise Invalid(f"LEDGER_TEAM_LABEL is {settings.team_label!r} but teams.label in {config_path} is "
                          f"{config.teams.label!r}: set the namespace label in one place")
        label = config.teams.label
    return TranslatorSettings(team_label=label)


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


def catch_up(db: LedgerDatabase, *, progress: Progress | None = None, statistics: Statistics | None = None,
             wait: bool = True, until: int | None = None, built: runner.Built | None = None,
             analyzing: Callable[[], None] | None = None) -> int:
    """Bring every read model up to the newest event (table ``events``); returns how many events were applied.

    Once the catch-ups through ``db`` have applied :data:`ANALYZE_AFTER_EVENTS` or more since it last analyzed
    (:attr:`LedgerDatabase.unanalyzed_events`: a replay, ``serve`` or a watch worker after an outage, the jobs),
    :func:`refresh_statistics` follows, which ``analyzing`` is told of before it starts (every event is applied
    by then) and ``statistics`` of once it is done. Every catch-up of the services goes through here.

    ``wait=False`` (the CLI's queries) does not wait for another process that is applying events itself, and
    ``until`` (a global position) stops there rather than follow events appended meanwhile (see
    :func:`ledger.projections.runner.catch_up`). ``built`` is told each read-model table's name as a build from
    the whole history (read models that applied nothing yet, a large first replay) writes it.

    Raises:
        CheckpointsLocked: ``wait`` is ``False`` and another process is applying events; the read models are
            as it last committed them (plus ``applied`` events this call applied first).
        StoreUnavailable: the database cannot be reached (transient: projections resume from their
            checkpoints on the next call).
        ProjectionFailed: a batch of events could not be applied (a statement the database refused, an
            event a projection cannot take); the read models stay at their checkpoint, named in the error,
            and the next call retries from there.
    """
    try:
        with unavailable_as_error():
            applied = runner.catch_up(db.engine, progress=progress, built=built, wait=wait, until=until)
    except CheckpointsLocked as e:
        db.unanalyzed_events += e.applied  # the other process analyzes after its own catch-up
        raise
    # Counted over calls: a watch worker catches up a backlog in many small passes, one a second.
    db.unanalyzed_events += applied
    if db.unanalyzed_events >= ANALYZE_AFTER_EVENTS:
        db.unanalyzed_events = 0
        if analyzing is not None:
            analyzing()
        refresh_statistics(db, told=statistics)
    return applied


_catch_up = catch_up
""":func:`catch_up` under a second name, for :func:`replay_files`, whose ``catch_up`` flag hides the function."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadModelsBehind:
    """Why a query answers from read models that lack events: another process is applying them (or recording
    events it will apply, as a ``replay`` does), and the query did not wait for it.

    ``events``: how many events the read models lack (the newest global position minus the lowest checkpoint).
    ``rebuilding``: that process holds the read models' tables for a rebuild or a first whole-history build, so
    reading them waits until it commits.
    """

    events: int
    rebuilding: bool


def catch_up_for_query(db: LedgerDatabase, *, applying_from: Callable[[int], None] | None = None,
                       progress: Progress | None = None,
                       statistics: Statistics | None = None) -> ReadModelsBehind | None:
    """Bring the read models up to the newest event as of this call before a query reads them, unless another
    process is applying events: then leave them as they stand and say how far behind they are.

    The CLI's queries call it. Another process applying events (a ``replay`` from its first line to its last, a
    catch-up of ``serve``, ``watch`` or ``jobs``, a ``rebuild``) holds the applying marker
    (:func:`ledger.store.locks.applying`); with the marker free, this call applies what is missing itself, up to
    the newest global position it read first (never the events appended after), holding the marker so that a
    second query does not join in. Should another runner take the checkpoint rows meanwhile, it stops there too.

    Args:
        applying_from: called with the number of events missing before this call applies them (a progress note):
            counted, not the lag, which gaps in the global positions overstate.
        progress: called with the number of events applied after each batch this call applies (as
            :func:`catch_up`); they add up to the number ``applying_from`` was told, or more when a whole-history
            build takes in events appended since.
        statistics: as :func:`catch_up`.

    Returns:
        ``None``: the read models are at the newest event as of the call. Else what they lack and why.

    Raises:
        StoreUnavailable, ProjectionFailed: as :func:`catch_up`.
    """
    with unavailable_as_error(), db.reading(read_models=False) as conn:
        head, lags = runner.head_and_lag_on(conn)
        missing = max(lags.values(), default=0)
        # Counted only for a caller that says it; unused should another process turn out to be applying them.
        counted = runner.unapplied_events(conn, head=head, lags=lags) if missing and applying_from else 0
    # The marker is asked even with nothing missing: a rebuild of read models that were up to date shows no lag
    # (its checkpoints' reset is not committed), yet its tables are held until it commits.
    busy = others_applying_events(db)
    if not busy:
        if not missing:
            return None
        if applying_from is not None:
            applying_from(counted)
        try:
            catch_up(db, progress=progress, statistics=statistics, wait=False, until=head)
            return None
        except CheckpointsLocked:
            pass
    with unavailable_as_error(), db.reading(read_models=False) as conn:
        if not busy:
            missing = max(runner.head_and_lag_on(conn)[1].values(), default=0)  # this call applied some first
        rebuilding = runner.tables_locked(conn)
    if not missing and not rebuilding:
        return None
    return ReadModelsBehind(events=missing, rebuilding=rebuilding)


def others_applying_events(db: LedgerDatabase) -> bool:
    """Whether another process holds the applying marker now (:func:`ledger.store.locks.others_applying`).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error():
        return others_applying(db.engine)


@contextmanager
def applying(db: LedgerDatabase) -> Iterator[None]:
    """Hold the applying marker while the block runs (:func:`ledger.store.locks.applying`): a ``replay`` holds it
    from its first line to the end of its catch-up, so that CLI queries meanwhile answer at once from the read
    models as they stand (:func:`catch_up_for_query`) instead of applying its events beside it.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error(), locks.applying(db.engine):
        yield


ANALYZE_AFTER_EVENTS = 20_000
"""Events the catch-ups through one :class:`LedgerDatabase` apply from which :func:`refresh_statistics` follows
(:func:`catch_up`); a watch worker following a busy cluster so analyzes every 20,000 events (about every seven
minutes at 4 million events a day), each ANALYZE sampling at most 30,000 rows a table whatever the ledger's size.

Why: the planner picks its plans from table statistics, and after a bulk load there are none until autovacuum
analyzes the tables (up to a minute later, or never where autovacuum is off). Without them a replayed
1,000-node day listed the devices of a DeviceClass in 23 s instead of 2.4 s: a row estimate of 1 made the
planner scan every device once for each allocation. ANALYZE of that ledger (a million events) takes ~2.5 s;
below this many events a replay is small and autovacuum's pass comes soon enough."""


Statistics = Callable[[Analyzed, float], None]
"""Told what :func:`refresh_statistics` did and how long it took (seconds), e.g. to say so on a terminal."""


def refresh_statistics(db: LedgerDatabase, *, told: Statistics | None = None) -> Analyzed | None:
    """``ANALYZE`` the ledger's tables (:meth:`LedgerDatabase.analyze`) after a bulk load, never failing it; ``told``
    hears what was done, failed tables included, and why nothing was when the connection failed
    (``Analyzed.unavailable``), so that a command says it in its place among its own lines; without it, what was
    done is logged (info) and each failure as a warning.

    Returns:
        What was analyzed, skipped (tables the role may not analyze: neither their owner nor, from PostgreSQL 17,
        granted MAINTAIN) and failed (a lock not granted in time, a statement timeout),
        or ``None`` when the connection failed. The load is committed either way; what was not
        analyzed is left to autovacuum.
    """
    started = time.monotonic()
    try:
        done = db.analyze()
    except LedgerError as e:
        if told is not None:
            told(Analyzed(analyzed=(), skipped=(), unavailable=str(e)), time.monotonic() - started)
        else:
            log.warning("statistics left to autovacuum: %s", e)
        return None
    if told is not None:
        told(done, time.monotonic() - started)
    else:  # a worker or `serve`: its log says what was done
        log.info("statistics: %d tables analyzed in %.1f s, %d left to autovacuum (not this role's to analyze)",
                 len(done.analyzed), time.monotonic() - started, len(done.skipped))
        for table, reason in done.failed:
            log.warning("statistics of table %s left to autovacuum: ANALYZE failed: %s", table, reason)
    return done


def rebuild(db: LedgerDatabase, *, progress: Progress | None = None, built: runner.Built | None = None,
            waiting: runner.Waiting | None = None, occupancy_counts: bool = True) -> int:
    """Rebuild every read model from global position 0, swapped in at commit; returns events applied.

    ``progress`` hears of the events applied (all at once at the end of the usual whole-history build), ``built``
    of each read-model table's name as that build writes it (its steps, for a long rebuild), ``waiting`` of the
    seconds waited so far when other sessions keep the read models from it for more than 2 s
    (:func:`ledger.projections.runner.rebuild`).

    Then, unless ``occupancy_counts`` is false (the caller does both, e.g. to report progress between),
    computes the occupancy counts again (:func:`refresh_occupancy_counts`, one transaction per cluster; until
    that commits, occupancy totals are aggregated from the intervals) and refreshes the tables' statistics
    (:func:`refresh_statistics`).
    """
    applied = runner.rebuild(db.engine, progress=progress, built=built, waiting=waiting)
    if occupancy_counts:
        refresh_occupancy_counts(db)
        refresh_statistics(db)  # they described the tables before the rebuild; last, so the counts' are current
    return applied


def refresh_occupancy_counts(db: LedgerDatabase, *, cluster: str | None = None) -> dict[str, int]:
    """Catch the projections up, then recompute the occupancy counts each cluster has not covered.

    One transaction per cluster (:func:`ledger.projections.counts.refresh`): table ``occupancy_counts``
    from the cluster's ``occupancy_count_coverage.valid_before`` on, computed from the
    ``device_inventory``, ``device_allocations``, ``claim_consumers`` and ``pod_phases`` intervals.

    Returns:
        Rows written per cluster refreshed (a cluster already covered, or one the ledger holds nothing of, is left
        out).

    Raises:
        StoreUnavailable: the database cannot be reached.
        ProjectionFailed: the catch-up failed (see :func:`catch_up`); no count was refreshed.
        sqlalchemy.exc.SQLAlchemyError: a statement failed; that cluster's transaction rolls back and its
            counts stay uncovered (the aggregate answers) until the next refresh.
    """
    with unavailable_as_error():
        catch_up(db)
        with db.engine.connect() as conn:
            # Every cluster with rows in the four tables has a coverage row (the runner and migration 0004
            # make them), so the uncovered ones are listed there, without reading the events. A named cluster
            # without one has nothing to count: no coverage row is made for it (a mistyped name left one).
            uncovered = counts.uncovered_clusters(conn)
            names = uncovered if cluster is None else [cluster] if cluster in uncovered else []
        written: dict[str, int] = {}
        for name in names:
            with db.engine.begin() as conn:
                written[name] = counts.refresh(conn, name)
        return written


def has_events(db: LedgerDatabase, cluster: str) -> bool:
    """Whether the ledger holds any event of ``cluster`` (table ``events``, through
    :func:`ledger.projections.base.clusters`). Commands that take ``--cluster`` use it to warn about a name nothing
    was recorded under, which answers like an empty cluster.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error(), db.reading(autocommit=True) as conn:
        return cluster in recorded_clusters(conn)


def quota_cluster_warnings(db: LedgerDatabase, config: LedgerConfig) -> list[str]:
    """Warnings, one line each, for the clusters ``[[quotas]]`` entries name that the ledger holds no event of
    (table ``events``), sorted by cluster: such a quota shows no row, and a misspelt name (``lab-2`` for ``lab2``)
    would otherwise leave its cluster on the quota for every cluster, or none, without a word. Empty when every
    named cluster is recorded, or no quota names one.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    named = {quota.cluster for quota in config.quotas if quota.cluster is not None}
    if not named:
        return []
    with unavailable_as_error(), db.reading(autocommit=True) as conn:
        missing = sorted(named - set(recorded_clusters(conn)))
    return [f"warning: [[quotas]] names cluster {name!r}, which the ledger holds no event of: its quotas show no row "
            "until something is recorded under that name" for name in missing]


def count_observations(db: LedgerDatabase, cluster: str) -> int:
    """How many observations (recorded or rejected lines, table ``observations``) the ledger holds for ``cluster``.

    The demo compares it with the lines of its bundled history: more means an earlier replay added other lines
    under the demo's cluster, and the demo's answers include them.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error(), db.reading(autocommit=True) as conn:
        return count_cluster_observations(conn, cluster)


def count_events(db: LedgerDatabase) -> int:
    """How many events the ledger holds, every cluster's (table ``events``): what a :func:`rebuild` applies, for its
    progress bar. Does not wait for a rebuild (reads no read model).

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error(), db.reading(read_models=False) as conn:
        return runner.count_events(conn)


def events_to_apply(db: LedgerDatabase) -> int:
    """How many events the read model furthest behind lacks, counted (table ``events`` after its checkpoint): the
    :func:`projection_lag` of that read model less the gaps in the global positions (an append rolled back has used
    its positions up). For a progress bar that should reach its total.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error(), db.reading(read_models=False) as conn:
        head, lags = runner.head_and_lag_on(conn)
        return runner.unapplied_events(conn, head=head, lags=lags)


def projection_lag(db: LedgerDatabase) -> dict[str, int]:
    """Events not yet applied, per projection (head global position - checkpoint).

    Raises:
        Unavailable: the database cannot be reached.
    """
    with db.reading(read_models=False) as conn:
        return runner.lag_on(conn)


# --- queries (read models only; the bodies the CLI prints and the API returns) --------------------
# Each reads through LedgerDatabase.reading() or .snapshot(), which first take the read models' locks in the order a
# rebuild's TRUNCATE takes them (no deadlock with it) and wait for a rebuild to commit. Besides what its docstring
# names, each may raise ReadModelsRebuilding when ``db`` bounds that wait (``read_models_wait_s``: the API's copy).

def occupancy_all(db: LedgerDatabase, *, at: datetime, cluster: str | None = None, node: str | None = None,
                  driver: str | None = None, pool: str | None = None, device_class: str | None = None,
                  config: LedgerConfig = DEFAULT) -> JSONObject:
    """Every device at ``at`` with its holders, and totals: all pages in one body (CLI, demo).

    One REPEATABLE READ snapshot; see :func:`ledger.projections.queries.occupancy_all`. Allocations name
    the team after ``config.teams.overrides``. ``device_class``: only the devices in that DeviceClass at
    ``at`` (:func:`ledger.projections.queries.device_class_members`), totals over them.

    Raises:
        Invalid: an empty ``device_class``.
        UnknownDeviceClass: ``device_class`` is not defined at ``at``.
        StoreUnavailable: the database cannot be reached.
    """
    with db.snapshot() as conn:
        return queries.occupancy_all(conn, at=at, cluster=cluster, node=node, driver=driver, pool=pool,
                                     device_class=device_class, overrides=config.teams.overrides)


@dataclass(slots=True)
class _SettledOccupancy:
    checkpoints: tuple[tuple[str, int], ...]
    settled_at: datetime | None
    page: queries.OccupancyPage


_OccupancyKey = tuple[str, str | None, str | None, str | None, str | None, str | None, tuple[str, ...] | None,
                      tuple[tuple[str, str], ...], DeviceSortKey | None, int]
_OCCUPANCY_CACHE: dict[_OccupancyKey, _SettledOccupancy] = {}
_OCCUPANCY_LOCK = threading.Lock()
OCCUPANCY_CACHE_ENTRIES = 64
"""Settled occupancy pages kept (per filters, teams, page start and limit): ~100 KB each at the
default limit of 100 devices, so a few MB at most."""


_MembersKey = tuple[str, tuple[tuple[str, int], ...], datetime, str | None, str | None, str | None, str | None, str]
_MEMBERS_CACHE: dict[_MembersKey, frozenset[DeviceSortKey]] = {}
OCCUPANCY_MEMBERS_ENTRIES = 4
"""DeviceClass member sets kept (per checkpoints, instant, filters and class) so that the pages of one class
query, which share their first page's instant, evaluate the class's CEL selectors once, not once a page
(~40 µs a device measured for a two-selector class: ~2.5 s at 61,000 devices). A set holds one key tuple per
member device, ~0.3 KB each: up to ~20 MB a set at 61,000 devices, hence only a few sets."""


def occupancy_settled(db: LedgerDatabase, *, at: datetime, cluster: str | None = None, node: str | None = None,
                      driver: str | None = None, pool: str | None = None, device_class: str | None = None,
                      teams: Collection[str] | None = None, after: DeviceSortKey | None = None,
                      limit: int = queries.OCCUPANCY_DEFAULT_LIMIT,
                      config: LedgerConfig = DEFAULT) -> queries.OccupancyPage:
    """One page of devices at ``at`` with their holders, and totals over all pages, read in one snapshot
    (see :func:`ledger.projections.queries.occupancy` for the body, ``device_class``, ``teams``, ``after``
    and ``limit``); answered from memory while the read models have not moved (the API's "now").

    Exact, not approximate: see :mod:`ledger.projections.settled`. A cached page is used only when
    every checkpoint is where it was when the page was computed and ``at`` is at or after every finite
    interval bound; otherwise the page is computed (and kept when ``at`` qualifies). One checkpoint
    read per hit. Pages are cached one by one (key: filters, teams, team overrides, ``after``, ``limit``),
    oldest out first. Allocations name, and ``teams`` limits by, the team after ``config.teams.overrides``.
    The members of ``device_class`` are kept apart (:data:`OCCUPANCY_MEMBERS_ENTRIES`), keyed by the
    checkpoints read in the page's snapshot and ``at``, so a later page of the same query (same pinned
    instant) does not evaluate the class's selectors again.

    Raises:
        Invalid: ``limit`` outside 1..1000, or an empty ``device_class``.
        UnknownDeviceClass: ``device_class`` is not defined at ``at``.
        StoreUnavailable: the database cannot be reached.
    """
    overrides = config.teams.overrides
    key: _OccupancyKey = (db.url, cluster, node, driver, pool, device_class,
                          tuple(sorted(teams)) if teams is not None else None,
                          tuple(sorted(overrides.items())), after, limit)
    with db.reading(autocommit=True) as conn:  # one statement: no transaction needed
        checkpoints = settled.read_checkpoints(conn)
    hit = _OCCUPANCY_CACHE.get(key)
    if hit is not None and hit.checkpoints == checkpoints and (hit.settled_at is None or at >= hit.settled_at):
        return queries.OccupancyPage(body={**hit.page.body, "at": rfc3339(at)}, next_after=hit.page.next_after)
    with _OCCUPANCY_LOCK, db.snapshot() as conn:
        # One snapshot for the version and the page, so the page is exactly the one of those checkpoints.
        version = settled.read_version(conn)
        members: frozenset[DeviceSortKey] | None = None
        if device_class is not None:
            # The members at ``at`` depend only on the read models' rows (their checkpoints) and ``at``:
            # exact for every page of the query, whatever its ``after``, ``limit`` or team limit.
            members_key: _MembersKey = (db.url, version.checkpoints, at, cluster, node, driver, pool, device_class)
            members = _MEMBERS_CACHE.get(members_key)
            if members is None:
                members = queries.device_class_members(
                    conn, at=at, device_class=device_class,
                    scope=queries.OccupancyScope(cluster=cluster, node=node, driver=driver, pool=pool))
                if len(_MEMBERS_CACHE) >= OCCUPANCY_MEMBERS_ENTRIES:
                    _MEMBERS_CACHE.pop(next(iter(_MEMBERS_CACHE)))
                _MEMBERS_CACHE[members_key] = members
        page = queries.occupancy(conn, at=at, cluster=cluster, node=node, driver=driver, pool=pool,
                                 device_class=device_class, class_members=members, teams=teams, after=after,
                                 limit=limit, overrides=overrides)
    if version.settled_at is None or at >= version.settled_at:
        if len(_OCCUPANCY_CACHE) >= OCCUPANCY_CACHE_ENTRIES and key not in _OCCUPANCY_CACHE:
            _OCCUPANCY_CACHE.pop(next(iter(_OCCUPANCY_CACHE)))
        _OCCUPANCY_CACHE[key] = _SettledOccupancy(checkpoints=version.checkpoints, settled_at=version.settled_at,
                                                  page=page)
    return page


def usage(db: LedgerDatabase, *, start: datetime, end: datetime, group_by: str, cluster: str | None = None,
          teams: Sequence[str] | None = None, step: timedelta | None = None,
          config: LedgerConfig | None = None, now: datetime | None = None) -> JSONObject:
    """Device-hours over ``[start, end)``; see :func:`ledger.projections.queries.usage`.

    ``now`` (aware) is the instant the answer is for: nothing after it counts, so the same ``now`` gives
    the same rows later (the API pins the first page's instant in its page tokens). ``None``: the
    database's ``now()``.

    ``config.teams.overrides`` (when given) rebill the hours of an overridden namespace to the override's
    team, for the ``team`` grouping and the ``teams`` limit alike, over the whole window (retroactively).
    ``config.prices`` (when given and not empty) adds a ``cost`` to priced rows. Without prices, ``teams``
    or ``step`` the whole hours come from the hourly rollups (:func:`usage_from_rollups`: table
    ``usage_rollups_by_team``, or ``usage_rollups`` for ``group_by="node"``); rolled hours that a late
    event may have changed are forgotten by the projection runner, so both paths agree.

    Raises:
        Invalid: unknown ``group_by``, an empty window, or a bad ``step``.
    """
    prices = None
    overrides = config.teams.overrides if config is not None else queries.NO_OVERRIDES
    if config is not None and config.prices:
        prices = queries.PriceTable(
            by_class={p.device_class: p.per_device_hour for p in config.prices if p.device_class},
            by_model={p.model: p.per_device_hour for p in config.prices if p.model},
            currency=config.prices[0].currency)
    with db.reading() as conn:
        if step is None and teams is None and prices is None:
            # Whole hours from the hourly rollups, the rest from the live intervals: the same body (tested),
            # in time that grows with the hours in the window instead of the allocations in it.
            return rollups.usage_from_rollups(conn, start=start, end=end, group_by=group_by, cluster=cluster,
                                              overrides=overrides, now=now)
        return queries.usage(conn, start=start, end=end, group_by=group_by, cluster=cluster, teams=teams,
                             step=step, prices=prices, overrides=overrides, now=now)


def claims(db: LedgerDatabase, *, at: datetime, state: str = "all", cluster: str | None = None,
           namespace: str | None = None, name: str | None = None, config: LedgerConfig = DEFAULT) -> JSONObject:
    """Claims at ``at``; see :func:`ledger.projections.queries.claims`. ``team`` follows
    ``config.teams.overrides``.

    Raises:
        Invalid: unknown ``state``.
    """
    with db.reading() as conn:
        return queries.claims(conn, at=at, state=state, cluster=cluster, namespace=namespace, name=name,
                              overrides=config.teams.overrides)


def claims_page(db: LedgerDatabase, *, at: datetime, limit: int, after: queries.ClaimKey | None = None,
                state: str = "all", cluster: str | None = None, namespace: str | None = None,
                name: str | None = None, origin: str | None = None, team: str | None = None,
                visible_teams: Collection[str] | None = None,
                config: LedgerConfig = DEFAULT) -> queries.ClaimsPage:
    """``limit`` claims at ``at`` after the claim keyed ``after`` (``GET /v1/claims``); see
    :func:`ledger.projections.queries.claims_page`. ``team`` and ``visible_teams`` (a team-limited token's teams)
    take the team after ``config.teams.overrides``.

    Raises:
        Invalid: unknown ``state``.
    """
    with db.reading() as conn:
        return queries.claims_page(conn, at=at, state=state, cluster=cluster, namespace=namespace, name=name,
                                   origin=origin, team=team, visible_teams=visible_teams,
                                   overrides=config.teams.overrides, after=after,
                                   limit=limit)


# --- audit log, histories, timelines --------------------------------------------------------------


def event_body(event: RecordedEvent) -> JSONObject:
    """One stored event as the API and CLI show it (camelCase envelope, Kubernetes-spelled payload)."""
    return {"globalPosition": int(event.global_position), "cluster": event.cluster, "stream": str(event.stream),
            "streamPosition": int(event.stream_position), "type": event.type,
            "occurredAt": rfc3339(event.occurred_at), "recordedAt": rfc3339(event.recorded_at),
            "payload": event.payload}


def events(db: LedgerDatabase, *, after: int = 0, limit: int = 100, types: Sequence[str] | None = None,
           stream: str | None = None, cluster: str | None = None) -> list[JSONObject]:
    """The audit log: events with ``global position > after`` in position order (table ``events``).

    Args:
        after: exclusive lower bound (0 = from the first event).
        limit: at most this many (1..10000).
        types: only these event types; ``stream``: only this stream (e.g. ``claim:<uid>``); ``cluster``: only
            this cluster's events (``None``: every cluster's).

    Raises:
        Invalid: ``after`` negative or ``limit`` out of range.
    """
    if after < 0:
        raise Invalid(f"afterPosition must be >= 0, got {after}")
    if not 1 <= limit <= 10_000:
        raise Invalid(f"limit must be between 1 and 10000, got {limit}")
    return [event_body(e) for e in db.read_all(after=GlobalPosition(after), limit=limit, types=types, stream=stream,
                                               cluster=cluster)]


def claim_history(db: LedgerDatabase, *, namespace: str, name: str, cluster: str | None = None) -> JSONObject:
    """Every event of every claim named ``namespace/name`` (a name can be reused by a new claim), in order.

    Returns:
        ``{"namespace", "name", "uids": [...], "events": [event bodies in stream order, claim by claim]}``;
        ``uids`` in creation order, each once (a claim recorded in two clusters is listed once, its events twice,
        each naming its cluster).

    Raises:
        UnknownClaim: no claim of that name was recorded.
    """
    with db.reading() as conn:
        found = queries.claim_uids(conn, namespace=namespace, name=name, cluster=cluster)
    history: list[JSONValue] = []
    for claim_cluster, uid in found:
        history.extend(event_body(e) for e in db.read_stream(cluster=claim_cluster, stream=f"claim:{uid}"))
    # A uid once however many clusters recorded it (one history replayed into two clusters): each event names its
    # cluster.
    return {"namespace": namespace, "name": name, "uids": list(dict.fromkeys(uid for _, uid in found)),
            "events": history}


def device_timeline(db: LedgerDatabase, *, driver: str, pool: str, device: str, start: datetime, end: datetime,
                    cluster: str | None = None, config: LedgerConfig = DEFAULT) -> JSONObject:
    """Inventory and allocation intervals of one device; see :func:`ledger.projections.queries.device_timeline`.
    An allocation's ``team`` follows ``config.teams.overrides``.

    Raises:
        Invalid: ``start`` is not before ``end``.
        UnknownDevice: the device was never recorded.
    """
    if not start < end:
        raise Invalid(f"from ({rfc3339(start)}) must be before to ({rfc3339(end)})")
    with db.reading() as conn:
        return queries.device_timeline(conn, driver=driver, pool=pool, device=device, start=start, end=end,
                                       cluster=cluster, overrides=config.teams.overrides)


def ping(db: LedgerDatabase) -> None:
    """Run a trivial query.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    db.ping()

# --- watch workers: live batches with their resourceVersion checkpoint ----------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchCheckpoint:
    """Where the watch of one kind resumes: table ``watch_checkpoints`` (one row per cluster and kind)."""

    kind: str
    """Kubernetes kind, e.g. ``ResourceClaim``."""
    api_version: str
    """The version the resourceVersion was read from, e.g. ``resource.k8s.io/v1``."""
    resource_version: str
    """Opaque; compared only for equality (DESIGN: never ordered)."""


def load_state(db: LedgerDatabase, cluster: str) -> TranslatorState:
    """Load the translator's memory for ``cluster`` (table ``translator_state``).

    Raises:
        StoreUnavailable: the database cannot be reached (transient).
    """
    with unavailable_as_error():
        return db.load_state(cluster)


def load_watch_checkpoints(db: LedgerDatabase, cluster: str) -> dict[str, WatchCheckpoint]:
    """Stored watch checkpoints of ``cluster``, by kind (table ``watch_checkpoints``).

    Raises:
        StoreUnavailable: the database cannot be reached (transient).
    """
    with unavailable_as_error():
        rows = db.load_watch_checkpoints(cluster)
    return {r.kind: WatchCheckpoint(kind=r.kind, api_version=r.api_version, resource_version=r.resource_version)
            for r in rows}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadModelsHealth:
    """What ``/readyz`` and ``/metrics`` report of the read models, read over one connection (:func:`health`)."""

    lag: dict[str, int]
    """Events not yet applied, per projection (:func:`projection_lag`)."""
    rebuilding: bool
    """Whether another transaction holds the read models now, as a rebuild (or a first build from a whole history,
    or a migration) does until it commits: reads of them wait meanwhile, and the API's answer 503 after 5 s. Read
    from ``pg_locks`` (:func:`ledger.projections.runner.tables_locked`)."""


def health(db: LedgerDatabase) -> ReadModelsHealth:
    """The projections' lag and whether a rebuild holds the read models, from one pooled connection: a probe asked
    every few seconds borrowed three (a ping, the lag, ``pg_locks``). Reading them shows the database answers.
    Sources: tables ``checkpoints`` and ``events`` (the head global position), view ``pg_locks``; never waits for a
    rebuild.

    Raises:
        StoreUnavailable: the database cannot be reached.
    """
    with unavailable_as_error(), db.reading(read_models=False) as conn:
        return ReadModelsHealth(lag=runner.lag_on(conn), rebuilding=runner.tables_locked(conn))


def database_ready(db: LedgerDatabase) -> bool:
    """True when the database answers ``SELECT 1`` (for readiness probes); never raises for an outage."""
    try:
        with unavailable_as_error():
            db.ping()
    except StoreUnavailable:
        return False
    return True


def _checkpoint_row(checkpoint: WatchCheckpoint) -> WatchCheckpointRow:
    return WatchCheckpointRow(kind=checkpoint.kind, api_version=checkpoint.api_version,
                              resource_version=checkpoint.resource_version)


def record_watch_batch(db: LedgerDatabase, lines: Sequence[WatchLine | BrokenLine], *, cluster: str,
                       state: TranslatorState, checkpoint: WatchCheckpoint,
                       settings: TranslatorSettings = TranslatorSettings()) -> IngestReport:
    """Ingest one burst of watch events and move the kind's checkpoint, in ONE transaction.

    The checkpoint commits with the observations and events it covers (DESIGN §8), so a crash at any
    point either keeps both or neither: the watch resumes from the checkpoint and the events after it
    are delivered again. An empty ``lines`` (a BOOKMARK) moves only the checkpoint. Idempotent as
    :func:`ingest` is: a re-delivered line or a repeated object adds nothing.

    Args:
        lines: the watch events of the burst in stream order (all of one kind); no size limit, but the
            caller keeps bursts near ``Settings.batch_size``.
        state: translator memory, shared by every call for ``cluster`` (one writer at a time).
        checkpoint: the resourceVersion of the last event (or BOOKMARK) of the burst.

    Returns:
        Counts as :func:`ingest` returns them.

    Raises:
        StoreUnavailable: the database cannot be reached; nothing was committed and ``state`` may be
            left stale: the next call with it loads it again.
        StreamConflict: another writer appended to the same streams (a second leader).
    """
    rows = [_checkpoint_row(checkpoint)]
    with unavailable_as_error():
        if not lines:
            with db.append(cluster, state) as batch:
                batch.save_watch_checkpoints(rows)
            return IngestReport()
        return ingest(db, lines, cluster=cluster, settings=settings, batch_size=len(lines), state=state,
                      on_batch=lambda batch: batch.save_watch_checkpoints(rows))


@dataclass(frozen=True, slots=True, kw_only=True)
class RelistPage:
    """What :func:`record_relist_page` did with one page of a list."""

    report: IngestReport
    """Counts as :func:`ingest` returns them."""
    keys: list[str]
    """Translator state keys (:func:`ledger.translator.relist.state_key`) of the page's objects, in
    list order; objects whose key cannot be read (rejected by the translator) have none."""


# Why a relist is recorded page by page: a worker restarted on a cluster with 106,019 live claims
# and 120,038 pods peaked at 1,320 MiB RSS (target <= 500 MB, bench/results-worker-100k.json) when
# every kind's whole list was held as decoded objects at once (claims 617 MiB, pods 457 MiB, slices
# 154 MiB), the kinds being listed concurrently. Only the deletions need the whole list, and for
# them its state keys (short strings) suffice: so each page is recorded as it arrives and dropped,
# and the keys are kept until :func:`finish_relist`.


def record_relist_page(db: LedgerDatabase, objects: Sequence[JSONValue], *, cluster: str,
                       state: TranslatorState, observed_at: datetime, source: str, first_line: int = 1,
                       settings: TranslatorSettings = TranslatorSettings(),
                       batch_size: int = 1000) -> RelistPage:
    """Record one page of a list of one kind, without moving any checkpoint.

    Listed objects the translator knows go in as MODIFIED, unknown ones as ADDED, so an unchanged
    object emits nothing and recording a page again (a list restarted after a 410 on its
    ``continue`` token) changes nothing. The objects are real observed states, so committing them
    before the whole list was seen is correct; only the deletions (:func:`finish_relist`) and the
    checkpoint must wait for the last page.

    Args:
        objects: the page's ``items`` in list order, each with ``kind`` and ``apiVersion`` set (a
            List response omits them on items; the caller copies them from the List); at most the
            list's ``limit`` (500 by default), though nothing here depends on it. An item that is no JSON object
            (a server or proxy fault) is stored as a rejected observation in its place
            (:func:`ledger.recorded.not_an_object`), and the items around it as usual.
        observed_at: when the list's first page was received (tz-aware); the receive time of every line.
        source: origin prefix of the lines, e.g. ``relist:ResourceClaim``.
        first_line: 1-based number of the page's first object within the whole list (origins read
            ``<source>:<n>`` and keep counting across pages).
        batch_size: lines per transaction.

    Returns:
        The page's counts and the state keys of its objects.

    Raises:
        StoreUnavailable: the database cannot be reached; nothing of the current batch committed and
            ``state`` may be left stale: the next call with it loads it again.
        StreamConflict: another writer appended to the same streams (a second leader).
    """
    with unavailable_as_error():
        _load_if_stale(db, cluster, state)  # read below (known objects) before ingest would load it
    lines: list[WatchLine | BrokenLine] = []
    keys: list[str] = []
    for number, obj in enumerate(objects, first_line):
        if not isinstance(obj, dict):
            # Stored as rejected in its place (origin ``<source>:<n>``, the item's JSON as the line's text).
            lines.append(broken_watch_line(source=source, line=number, reason=not_an_object(obj),
                                           observed_at=observed_at, text=json.dumps(obj)))
            continue
        try:
            key = relist.state_key(obj)
        except LedgerError:
            key = None  # ingest rejects the object with the reason
        if key is not None:
            keys.append(key)
        kind: WatchType = "MODIFIED" if key is not None and relist.known(state, key) else "ADDED"
        lines.append(watch_line(source=source, line=number, event_type=kind, observed_at=observed_at, obj=obj))
    if not lines:
        return RelistPage(report=IngestReport(), keys=keys)
    with unavailable_as_error():
        # One transaction per batch, in order (not the pipelined path of replays), so that a failure leaves
        # exactly the earlier batches committed.
        report = ingest(db, lines, cluster=cluster, settings=settings, batch_size=max(1, batch_size),
                        state=state, pipelined=False)
    return RelistPage(report=report, keys=keys)


def finish_relist(db: LedgerDatabase, listed: Iterable[str], *, cluster: str, state: TranslatorState,
                  checkpoint: WatchCheckpoint, observed_at: datetime, source: str, first_line: int,
                  settings: TranslatorSettings = TranslatorSettings(), batch_size: int = 1000) -> IngestReport:
    """Close a list whose every page was recorded: record the deletions, then commit the checkpoint.

    Objects of ``checkpoint.kind`` that the translator holds but the list lacks were deleted while
    nobody watched (after ``410 Gone``, or a worker down for long) and go in as DELETED objects
    rebuilt from the translator state (:func:`ledger.translator.relist.vanished`), dated
    ``observed_at``. The checkpoint (the list's resourceVersion) commits with the last batch (alone
    when nothing vanished): if anything fails before, the old checkpoint stays and the next start
    lists again. Call it only after the last page: a key missing from ``listed`` means deleted.

    Args:
        listed: the state keys of every object of the whole list (the ``keys`` of each
            :func:`record_relist_page`); order and repeats do not matter.
        checkpoint: kind, served apiVersion and the List's ``metadata.resourceVersion`` (first page).
        observed_at: when the list's first page was received (tz-aware).
        source: origin prefix of the lines, e.g. ``relist:ResourceClaim``.
        first_line: 1-based line number of the first deletion (objects listed + 1).
        batch_size: lines per transaction.

    Returns:
        Counts of the deletions, as :func:`ingest` returns them.

    Raises:
        StoreUnavailable: as for :func:`record_watch_batch`.
        StreamConflict: another writer appended to the same streams.
    """
    with unavailable_as_error():
        _load_if_stale(db, cluster, state)  # a stale (emptied) state would find nothing vanished
    lines = [watch_line(source=source, line=number, event_type="DELETED", observed_at=observed_at, obj=obj)
             for number, obj in enumerate(relist.vanished(state, checkpoint.kind, listed), first_line)]
    if not lines:
        return record_watch_batch(db, [], cluster=cluster, state=state, checkpoint=checkpoint, settings=settings)
    size = max(1, batch_size)
    rows = [_checkpoint_row(checkpoint)]

    def save_checkpoint(batch: AppendBatch) -> None:
        batch.save_watch_checkpoints(rows)

    report = IngestReport()
    with unavailable_as_error():
        for start in range(0, len(lines), size):
            # Invariant: the checkpoint commits with the batch of the last deletion, never before (a failure
            # in between leaves the old checkpoint, so the next start lists again and deletes the rest). The
            # batch is picked by its place in ``lines``, not by counting callbacks: a batch that lost a race
            # is translated again and runs its callback once more.
            last = start + size >= len(lines)
            report.merge(ingest(db, lines[start:start + size], cluster=cluster, settings=settings, batch_size=size,
                                state=state, on_batch=save_checkpoint if last else None, pipelined=False))
    return report


def reconcile_relist(db: LedgerDatabase, objects: Sequence[JSONObject], *, cluster: str, state: TranslatorState,
                     checkpoint: WatchCheckpoint, observed_at: datetime, source: str,
                     settings: TranslatorSettings = TranslatorSettings(), batch_size: int = 1000) -> IngestReport:
    """Record a full list of one kind held in memory: :func:`record_relist_page` for all of it, then
    :func:`finish_relist` (deletions of what the list lacks, and the checkpoint).

    For callers that already hold the whole list (tests, tools); the watch workers record page by
    page instead (see the comment above :func:`record_relist_page`).

    Args:
        objects: the list's ``items``, each with ``kind`` and ``apiVersion`` set.
        checkpoint: kind, served apiVersion and the List's ``metadata.resourceVersion``.
        observed_at: when the list was received (tz-aware); the receive time of every line.
        source: origin prefix of the lines, e.g. ``relist:ResourceClaim``.
        batch_size: lines per transaction.

    Returns:
        Counts as :func:`ingest` returns them (deletions included).

    Raises:
        StoreUnavailable: as for :func:`record_watch_batch`.
        StreamConflict: another writer appended to the same streams.
    """
    page = record_relist_page(db, objects, cluster=cluster, state=state, observed_at=observed_at, source=source,
                              settings=settings, batch_size=batch_size)
    report = page.report
    report.merge(finish_relist(db, page.keys, cluster=cluster, state=state, checkpoint=checkpoint,
                               observed_at=observed_at, source=source, first_line=len(objects) + 1,
                               settings=settings, batch_size=batch_size))
    return report


# --- quotas, sharing, pending demand, rollups and report snapshots (issue 5) ----------------------


def quotas(db: LedgerDatabase, *, at: datetime, config: LedgerConfig, cluster: str | None = None) -> JSONObject:
    """Kueue-style counted usage per (cluster, team, resource name) versus that cluster's quota at ``at``.

    The body (the REST API's ``GET /v1/quotas``) is ``{"at", "rows": [{"cluster", "team", "resourceName", "used",
    "nominalQuota", "overQuota", "reasons", "claims"}]}``; see :func:`ledger.projections.quotas.quotas`
    for the counting rules and units. Reads read models only (call :func:`catch_up` first for fresh data).
    """
    with db.reading() as conn:
        return quota_counting.quotas(conn, at=at, config=config, cluster=cluster)


def quota_history(db: LedgerDatabase, *, start: datetime, end: datetime, config: LedgerConfig,
                  cluster: str | None = None) -> JSONObject:
    """Counted usage over ``[start, end)`` as intervals of constant usage per (cluster, team, resource name).

    Body: ``{"from", "to", "intervals": [{"cluster", "team", "resourceName", "from", "to", "used", "nominalQuota",
    "overQuota"}]}``; see :func:`ledger.projections.quotas.quota_history`.

    Raises:
        Invalid: ``start`` is not before ``end``.
    """
    with db.reading() as conn:
        return quota_counting.quota_history(conn, start=start, end=end, config=config, cluster=cluster)


def shared(db: LedgerDatabase, *, at: datetime, cluster: str | None = None,
           config: LedgerConfig = DEFAULT) -> JSONObject:
    """Shared devices, partitionable counter sets and multi-consumer claims at ``at``.

    Body (``GET /v1/shared``): ``{"at", "totals": {"sharedDevices", "counterSets", "sharedClaims"},
    "devices": [...], "counterSets": [...], "claims": [...]}``; see
    :func:`ledger.projections.shared.shared` for every field and the chargeback split. Every ``team``
    follows ``config.teams.overrides``.
    """
    with db.reading() as conn:
        return sharing.shared(conn, at=at, cluster=cluster, overrides=config.teams.overrides)


def shared_usage(db: LedgerDatabase, *, start: datetime, end: datetime, cluster: str | None = None,
                 config: LedgerConfig = DEFAULT, now: datetime | None = None) -> JSONObject:
    """Chargeback of shared device-hours over ``[start, end)``, split by consumed capacity else equally; as in
    :func:`usage`, nothing after ``now`` (aware; ``None``: the database's ``now()``) counts.

    Body: ``{"from", "to", "rows": [{"team", "deviceClass", "driver", "deviceHours"}], "devices":
    [{"driver", "pool", "device", "sharedHours", "billedDeviceHours"}]}``; see
    :func:`ledger.projections.shared.shared_usage`. Rows are billed to the team after
    ``config.teams.overrides``.

    Raises:
        Invalid: ``start`` is not before ``end``.
    """
    with db.reading() as conn:
        return sharing.shared_usage(conn, start=start, end=end, cluster=cluster, overrides=config.teams.overrides,
                                    now=now)


def pending(db: LedgerDatabase, *, at: datetime, cluster: str | None = None,
            config: LedgerConfig = DEFAULT) -> JSONObject:
    """Pending demand at ``at``: per cluster and DeviceClass claims waiting, devices requested, devices free.

    Body (``GET /v1/pending``): ``{"at", "classes": [{"cluster", "deviceClass", "claims", "requested", "free"}],
    "claims": [{"cluster", "namespace", "name", "team", "origin", "pendingSince", "ageSeconds", "requests":
    [{"request", "deviceClass", "allocationMode", "count", "free"}]}]}``; see
    :func:`ledger.projections.pending.pending`. ``team`` follows ``config.teams.overrides``.
    """
    with db.reading() as conn:
        return pending_demand.pending(conn, at=at, cluster=cluster, overrides=config.teams.overrides)


def idle_thresholds(config: LedgerConfig) -> IdleThresholds:
    """The idle thresholds of the configuration file (``[idle]``, seconds per category)."""
    return IdleThresholds(unreserved_s=config.idle.unreserved_seconds,
                          inactive_consumers_s=config.idle.inactive_consumers_seconds,
                          unreferenced_s=config.idle.unreferenced_seconds)


def idle_report(db: LedgerDatabase, *, at: datetime, config: LedgerConfig, min_idle: timedelta | None = None,
                cluster: str | None = None) -> JSONObject:
    """The idle-claim report at ``at`` with the configured thresholds and team overrides.

    Body (``GET /v1/reports/idle-claims``): ``{"at", "claims": [{"cluster", "namespace", "name", "team",
    "category", "idleSince", "devices", "wastedDeviceHours"}]}`` (see :func:`ledger.projections.queries.idle_claims`);
    ``min_idle`` overrides every category's threshold.
    """
    with db.reading() as conn:
        return queries.idle_claims(conn, at=at, min_idle=min_idle, thresholds=idle_thresholds(config),
                                   cluster=cluster, overrides=config.teams.overrides)


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
"""First characters that make a spreadsheet read a text cell as a formula (OWASP, "CSV Injection")."""


def spreadsheet_text(cell: object) -> object:
    """``cell`` as a spreadsheet will show it and never evaluate it.

    A string starting with one of :data:`FORMULA_PREFIXES` gets a leading ``'``, which spreadsheets take as
    "this is text" (the OWASP advice); other strings, and numbers (``int`` / ``float``, negative ones too),
    pass unchanged, so numbers stay numbers. The ``defusedcsv`` package does the same for ``= + - @`` but
    not for tab and CR, and it also rewrites ``|`` inside the text, so it was not used. A ``float`` is written as
    the API's JSON writes it (msgspec: ``0.000056``, where Python's ``str`` gives ``5.6e-05``).
    """
    if isinstance(cell, str) and cell.startswith(FORMULA_PREFIXES):
        return "'" + cell
    if isinstance(cell, float):
        return msgspec.json.encode(cell).decode()
    return cell


def csv_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Render a header row and ``rows`` as CSV (RFC 4180: CRLF line ends, fields quoted when needed).

    Every cell goes through :func:`spreadsheet_text`: team labels, namespace, node and device names come
    from the cluster, and a name such as ``=HYPERLINK(...)`` must open as text in a spreadsheet. CRLF line
    ends make the writer quote a field holding a lone CR, so such a field cannot split its row.
    """
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(header)
    writer.writerows([spreadsheet_text(cell) for cell in row] for row in rows)
    return buffer.getvalue()


IDLE_CSV_COLUMNS = ("cluster", "namespace", "name", "team", "category", "idleSince", "devices", "wastedDeviceHours")
"""Columns of :func:`idle_report_csv`, in order (the JSON field names)."""


def idle_report_csv(body: JSONObject) -> str:
    """Render an idle-claim report body as CSV through :func:`csv_table` (devices joined by spaces)."""
    rows = body["claims"]
    assert isinstance(rows, list)
    cells: list[list[object]] = []
    for row in rows:
        assert isinstance(row, dict)
        devices = row["devices"]
        cells.append([(" ".join(str(d) for d in devices) if isinstance(devices, list) else devices)
                      if col == "devices" else row[col] for col in IDLE_CSV_COLUMNS])
    return csv_table(IDLE_CSV_COLUMNS, cells)


@dataclass(frozen=True, slots=True, kw_only=True)
class RollupChunk:
    """One committed chunk of an hourly rollup run (:func:`rollup_chunks`)."""

    start: datetime
    """First hour of the chunk (UTC hour boundary)."""
    end: datetime
    """End of the chunk, exclusive (UTC hour boundary)."""
    hours: int
    """Hours in the chunk (>= 1)."""
    done_hours: int
    """Hours of the run committed so far, this chunk included."""
    total_hours: int
    """Hours the run covers in all (``done_hours == total_hours`` after its last chunk)."""


FIRST_CHUNK_HOURS = 24
"""Hours a rollup run tries in its first chunk, h; later chunks follow the pieces an hour of the previous one
(the hourly job's usual run, the last rolled hour and the new one, is a single chunk)."""


def rollup_chunks(db: LedgerDatabase, *, end: datetime, start: datetime | None = None, cluster: str | None = None,
                  max_pieces: int = rollups.ROLLUP_MAX_PIECES) -> Generator[RollupChunk, None, None]:
    """Catch the projections up, then recompute the hourly usage rollups of whole hours before ``end``, one
    bounded chunk at a time, oldest first.

    Each chunk is its own transaction and is committed before it is yielded: stopping between chunks (not
    asking for the next, Ctrl-C, a cancelled job) keeps every committed chunk and half-writes none, and the
    next run without ``start`` resumes from the last rolled hour. Each chunk holds the rolled-hours lock
    (:func:`ledger.store.locks.lock_rolled_hours`): runs at once (two ``dra-ledger jobs``, ``watch`` beside
    ``jobs``) take turns chunk by chunk, a run waiting for another's chunk then rolling the same hours up again
    to the same rows, so together they leave exactly the rows one run leaves. A chunk reads at most ``max_pieces``
    (interval, hour) pieces, or one whole hour (:func:`ledger.projections.rollups.next_chunk`), so memory does
    not grow with how far back the oldest interval starts. No transaction is open while the generator is
    suspended.

    Args:
        end: hours ending at or before ``end`` are rolled up (the current hour is left to the live
            intervals).
        start: first hour to recompute; ``None`` = the last hour already rolled up (recomputed, so
            late events are absorbed), or the first allocation when nothing was rolled up yet.
        cluster: only this cluster.
        max_pieces: the bound of one chunk, in pieces (a test makes it small).

    Yields:
        Each committed chunk, in hour order; nothing when there is nothing to roll up (tables
        ``usage_rollups`` and ``usage_rollups_by_team``; idempotent).

    Raises:
        ProjectionFailed: the catch-up failed (see :func:`catch_up`); nothing was rolled up.
    """
    catch_up(db)
    if start is None:
        with db.engine.begin() as conn:
            start = rollups.last_rolled_hour(conn, cluster=cluster) or rollups.first_allocation(conn, cluster=cluster)
    if start is None:
        return
    h0, h1 = rollups.floor_hour(start), rollups.floor_hour(end)
    total = max(0, (h1 - h0) // rollups.HOUR)
    hour, hours = h0, FIRST_CHUNK_HOURS
    while hour < h1:
        with db.engine.begin() as conn:
            # First in the chunk's transaction, before next_chunk reads device_allocations: a rebuild takes this
            # lock and then truncates that table, so reading it first could deadlock with one. Another run rolling
            # up (a second `dra-ledger jobs`, or `watch` beside it) waits here until this chunk commits.
            lock_rolled_hours(conn)
            stop, pieces = rollups.next_chunk(conn, start=hour, end=h1, hours=hours, cluster=cluster,
                                              max_pieces=max_pieces)
            rollups.rollup_usage(conn, start=hour, end=stop, cluster=cluster)
        length = (stop - hour) // rollups.HOUR
        # Next guess: as many hours as the bound allows at this chunk's pieces an hour, at most twice as many
        # (an uncounted hour: two); next_chunk shortens it if the intervals get denser.
        hours = 2 if pieces is None else max(1, min(2 * length, length * max_pieces // max(pieces, 1)))
        yield RollupChunk(start=hour, end=stop, hours=length, done_hours=(stop - h0) // rollups.HOUR,
                          total_hours=total)
        hour = stop


def rollup_usage(db: LedgerDatabase, *, end: datetime, start: datetime | None = None,
                 cluster: str | None = None, max_pieces: int = rollups.ROLLUP_MAX_PIECES,
                 progress: Callable[[RollupChunk], None] | None = None) -> int:
    """Catch the projections up, then recompute the hourly usage rollups of whole hours before ``end``.

    The chunks of :func:`rollup_chunks`, each committed on its own, all of them.

    Args:
        end, start, cluster, max_pieces: as for :func:`rollup_chunks`.
        progress: called after each committed chunk.

    Returns:
        How many hours were recomputed (tables ``usage_rollups`` and ``usage_rollups_by_team``; idempotent).

    Raises:
        ProjectionFailed: the catch-up failed (see :func:`catch_up`); nothing was rolled up.
    """
    done = 0
    for chunk in rollup_chunks(db, end=end, start=start, cluster=cluster, max_pieces=max_pieces):
        done = chunk.done_hours
        if progress is not None:
            progress(chunk)
    return done


def usage_from_rollups(db: LedgerDatabase, *, start: datetime, end: datetime, group_by: str,
                       cluster: str | None = None) -> JSONObject:
    """Device-hours over ``[start, end)`` from the hourly rollups plus the live intervals at the edges.

    Same body as :func:`usage`; see :func:`ledger.projections.rollups.usage_from_rollups`.

    Raises:
        Invalid: unknown ``group_by`` or an empty window.
    """
    with db.reading() as conn:
        return rollups.usage_from_rollups(conn, start=start, end=end, group_by=group_by, cluster=cluster)


def take_report_snapshots(db: LedgerDatabase, *, at: datetime, config: LedgerConfig,
                          cluster: str | None = None) -> dict[str, int]:
    """Catch up, then store the idle-claim report, quota usage and pending demand at ``at``.

    These snapshots feed the ``reporting.idle_claims``, ``reporting.quota_usage`` and
    ``reporting.pending_demand`` views. Idempotent per (cluster, ``at``).

    Returns:
        ``{"idleClaims", "quotaRows", "pendingClasses"}``: rows written.

    Raises:
        ProjectionFailed: the catch-up failed (see :func:`catch_up`); no snapshot was stored.
    """
    catch_up(db)
    with db.engine.begin() as conn:
        lock_for_reading(conn)  # first: no deadlock with a rebuild (LedgerDatabase.reading)
        counts = snapshots.take_snapshots(conn, at=at, config=config, cluster=cluster)
    return {"idleClaims": counts.idle_claims, "quotaRows": counts.quota_rows, "pendingClasses": counts.pending_classes}
