"""The ledger as a watch sink: every burst and every relist goes through ``ledger.services``.

One :class:`LedgerSink` serves every kind of one cluster. The translator state is shared by the
kinds, so writes are serialised by an asyncio lock and run one at a time in a thread (SQLAlchemy is
synchronous; the event loop keeps renewing the Lease meanwhile). A write that fails leaves the state
emptied and marked stale (``TranslatorState.forget``), and ``ledger.services`` loads it again once,
before the next write: what is in memory never runs ahead of what committed.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from typing import TypeVar

from ledger import services
from ledger.errors import ProjectionFailed, Unavailable
from ledger.recorded import BrokenLine, WatchLine, broken_watch_line, watch_line
from ledger.store.database import LedgerDatabase
from ledger.threads import in_thread, in_thread_with_grace
from ledger.translator.translate import TranslatorSettings, TranslatorState
from workers.health import WorkerMetrics
from workers.k8s.client import KubeSource, Listed, ListPage, MalformedEvent, Received
from workers.settings import STOP_GRACE_S, WatchSettings, backoff_delay_s

log = logging.getLogger(__name__)
T = TypeVar("T")


async def keep_projections_current(sink: LedgerSink, *, settings: WatchSettings,
                                   metrics: WorkerMetrics | None = None) -> None:
    """While leader: every ``settings.catch_up_interval_s`` (s), if ``sink`` appended events since, catch the
    read models up (``services.catch_up``: table ``events`` into the projections' tables).

    Runs ``services.catch_up`` in a thread (each projection commits its rows with its checkpoint, so
    a catch-up cut short is resumed by the next). A failure never ends the loop: it runs beside the
    watches (``run_worker``'s TaskGroup), so ending it stopped the recording too, and the restarted worker
    met the same bad event again. A database outage is logged as a warning; a batch the projections cannot
    apply (``ProjectionFailed``: they stay at their checkpoint) as an error with its traceback. Either is
    counted (``WorkerMetrics.catch_up_failed``) and retried after ``settings.error_backoffs_s`` (the next
    delay after each failure in a row, jittered; never sooner than the interval). Returns at once when the
    interval is 0.
    """
    interval_s = settings.catch_up_interval_s
    if interval_s <= 0:
        return
    seen = -1
    failures = 0
    delay_s = interval_s
    while True:
        await asyncio.sleep(delay_s)
        delay_s = interval_s
        if sink.appended == seen:
            continue
        now = sink.appended
        try:
            applied = await in_thread(services.catch_up, sink.db)  # a stop cancels a catch-up waiting on a lock
        except (Unavailable, ProjectionFailed) as e:
            delay_s = max(interval_s, backoff_delay_s(settings, failures))
            failures += 1
            _report_catch_up_failure(e, delay_s=delay_s, metrics=metrics)
            continue
        seen, failures = now, 0
        if applied:
            log.debug("projections caught up: %d events applied", applied)


def _report_catch_up_failure(error: Unavailable | ProjectionFailed, *, delay_s: float,
                             metrics: WorkerMetrics | None) -> None:
    if isinstance(error, Unavailable):
        log.warning("projection catch-up failed, retrying in %.1fs: %s", delay_s, error)
        reason = "database"
    else:
        log.error("projection catch-up failed, retrying in %.1fs: %s", delay_s, error, exc_info=error,
                  extra={"position": error.after})
        reason = "projection"
    if metrics is not None:
        metrics.catch_up_failed(reason)


class LedgerSink:
    """Stores watch bursts and relists with their resourceVersion checkpoint (one transaction each).

    ``stop_grace_s`` (s, >= 0): how long a write in flight when its coroutine is cancelled may go on to commit
    before its statements are cancelled (``LEDGER_WATCH_STOP_GRACE_S``).
    """

    def __init__(self, db: LedgerDatabase, *, cluster: str, translator: TranslatorSettings = TranslatorSettings(),
                 batch_size: int = 1000, metrics: WorkerMetrics | None = None,
                 stop_grace_s: float = STOP_GRACE_S) -> None:
        self.db = db
        self._stop_grace_s = stop_grace_s
        self._hurry = asyncio.Event()
        self._stopping = False
        self.cluster = cluster
        self._translator = translator
        self._batch_size = batch_size
        self._metrics = metrics
        self._state: TranslatorState | None = None
        self._lock = asyncio.Lock()
        self._seq = itertools.count(1)
        self.appended = 0
        """Ledger events appended by this sink so far (the projection catch-up loop watches it)."""
        self.transactions = 0
        """Append transactions committed so far (a burst of watch events takes one per batch)."""

    def reset(self) -> None:
        """Drop the cached translator state; the next write loads it from the database.

        Called whenever this replica becomes the leader: a former leader may have written since.
        """
        self._state = None

    async def _write(self, call: Callable[[TranslatorState], T]) -> T:
        # Invariant: one write at a time (shared translator state; one append transaction per cluster). Cancelled
        # (a stop, or the Lease lost), the write gets stop_grace_s to commit, then its statements are cancelled and
        # it rolls back with its resourceVersion checkpoint (its events are delivered again after the next list or
        # watch); either way in_thread_with_grace returns only once the thread is done, so no write overlaps and
        # none outlives the leadership by more than the grace.
        async with self._lock:
            return await in_thread_with_grace(functools.partial(self._in_thread, call), grace_s=self._stop_grace_s,
                                              grace_over=self._cancelling, hurry=self._hurry)

    def stopping(self, cause: str) -> None:
        """Say that the process stops (``cause``: what stops it, e.g. ``SIGTERM``) and what a write in flight gets."""
        self._stopping = True
        log.info("stopping (%s): an append transaction in flight gets up to %gs to commit (LEDGER_WATCH_STOP_GRACE_S); "
                 "a second signal cancels it at once", cause, self._stop_grace_s)

    def hurry(self) -> None:
        """Give a write in flight at a stop no more grace (a second SIGTERM or Ctrl-C): its statements are cancelled
        now, and a write cancelled later gets none either."""
        self._hurry.set()

    def _cancelling(self) -> None:
        if self._hurry.is_set():
            why = "a second signal came"
        else:
            after = "the stop" if self._stopping else "the loss of the Lease"
            why = f"it has not committed within {self._stop_grace_s:g}s of {after} (LEDGER_WATCH_STOP_GRACE_S)"
        log.warning("the append transaction in flight is cancelled, as %s; it rolls back, and its watch events are "
                    "recorded when they are delivered again", why)

    def _in_thread(self, call: Callable[[TranslatorState], T]) -> T:
        if self._state is None:
            self._state = services.load_state(self.db, self.cluster)
        # A failed call leaves the state stale (emptied), never dropped here: the services load it again before
        # its next use, once (dropping it too made the next write load it a second time).
        return call(self._state)

    async def resume_from(self, source: KubeSource) -> str | None:
        """The stored resourceVersion of ``source``'s kind, if stored for the same apiVersion.

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        stored = (await asyncio.to_thread(services.load_watch_checkpoints, self.db, self.cluster)).get(source.info.kind)
        if stored is None or stored.api_version != source.api_version:
            return None
        return stored.resource_version

    async def relisted(self, source: KubeSource, pages: AsyncIterator[ListPage]) -> Listed:
        """Reconcile a list page by page (``services.record_relist_page``), then record the objects the
        whole list lacks as deleted and store its resourceVersion (``services.finish_relist``).

        One page (the list's ``limit``) and the state keys of the pages before are held at a time:
        whole lists held as objects took a restarted worker to 1,320 MiB (106,019 claims, 120,038
        pods). Each page is its own write, so other kinds' bursts may be stored between two pages.

        Args:
            pages: from ``source.pages()``, in order.

        Returns:
            The list's object count and resourceVersion.

        Raises:
            WatchExpired / TransientApiError / ApiError: from ``pages``; the pages before stay stored,
                the checkpoint does not move (the next list records them again, which changes nothing).
            StoreUnavailable: the database cannot be reached (the checkpoint does not move).
        """
        kind = source.info.kind
        origin = f"relist:{kind}"
        keys: list[str] = []
        first: tuple[str, datetime] | None = None  # the first page's resourceVersion and receive time, not its items
        count = 0
        async for page in pages:
            first = first or (page.resource_version, page.received_at)
            recorded = await self._write(self._page_writer(page, origin))
            keys.extend(recorded.keys)
            count = page.offset + len(page.items)
            self._report(source, recorded.report)
            del page, recorded  # hold no page while the next one is fetched
        if first is None:
            raise RuntimeError(f"{origin}: the list yielded no page")  # KubeSource.pages yields at least one
        version, observed_at = first
        checkpoint = services.WatchCheckpoint(kind=kind, api_version=source.api_version, resource_version=version)
        finished = await self._write(lambda state: services.finish_relist(
            self.db, keys, cluster=self.cluster, state=state, checkpoint=checkpoint, observed_at=observed_at,
            source=origin, first_line=count + 1, settings=self._translator, batch_size=self._batch_size))
        self._report(source, finished)
        return Listed(count=count, resource_version=version)

    def _page_writer(self, page: ListPage, origin: str) -> Callable[[TranslatorState], services.RelistPage]:
        return lambda state: services.record_relist_page(
            self.db, page.items, cluster=self.cluster, state=state, observed_at=page.received_at, source=origin,
            first_line=page.offset + 1, settings=self._translator, batch_size=self._batch_size)

    async def observed(self, source: KubeSource, events: Sequence[Received], resource_version: str) -> None:
        """Store one burst and its resourceVersion (``services.record_watch_batch``); BOOKMARKs only move it.

        A line that is no watch event (:class:`MalformedEvent`) is stored in its place as a rejected
        observation (table ``observations``, ``status`` rejected, ``error`` the reason, ``body`` the line's
        text), logged and counted like an object the translator rejects.

        Raises:
            StoreUnavailable: the database cannot be reached (the burst will be delivered again).
        """
        origin = f"watch:{source.info.kind}"
        lines: list[WatchLine | BrokenLine] = []
        for e in events:
            if isinstance(e, MalformedEvent):
                lines.append(broken_watch_line(source=origin, line=next(self._seq), reason=e.reason,
                                               observed_at=e.received_at, text=e.text))
            elif e.type != "BOOKMARK":
                lines.append(watch_line(source=origin, line=next(self._seq), event_type=e.type,
                                        observed_at=e.received_at, obj=e.object))
        checkpoint = services.WatchCheckpoint(kind=source.info.kind, api_version=source.api_version,
                                              resource_version=resource_version)
        report = await self._write(lambda state: services.record_watch_batch(
            self.db, lines, cluster=self.cluster, state=state, checkpoint=checkpoint, settings=self._translator))
        self._report(source, report)

    def _report(self, source: KubeSource, report: services.IngestReport) -> None:
        self.appended += report.events
        self.transactions += 1
        if self._metrics is not None:
            self._metrics.appended(source.info.kind, report.events)
            self._metrics.rejected(source.info.kind, len(report.rejected))
        for rejection in report.rejected:
            log.warning("rejected %s: %s", rejection.origin, rejection.reason,  # reasons come escaped (Rejection)
                        extra={"resource": source.info.plural, "resourceVersion": None})
