"""The generic list-then-watch loop of one kind (kopf's shape: list, watch from the list's
resourceVersion, 410 means list again, transient faults back off).

The loop never writes anything itself: it hands bursts to a :class:`Sink` (the ledger, or a file
for ``dra-ledger record``) and only moves its resourceVersion after the sink returned, so the
resourceVersion it resumes from is always one whose events are stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import NoReturn, Protocol

from ledger.errors import Unavailable
from workers.health import WorkerMetrics
from workers.k8s.client import KubeSource, Listed, ListPage, Received, TransientApiError, WatchEvent, WatchExpired
from workers.settings import WatchSettings, backoff_delay_s

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where a followed kind's objects go. Calls for one cluster are made one at a time per kind."""

    def reset(self) -> None:
        """Forget anything cached: this replica (re)starts writing and another may have written meanwhile."""
        ...

    async def resume_from(self, source: KubeSource) -> str | None:
        """The stored resourceVersion to watch ``source`` from, or ``None`` to list first."""
        ...

    async def relisted(self, source: KubeSource, pages: AsyncIterator[ListPage]) -> Listed:
        """Store a list as its pages arrive, then (after the last page) the deletions of objects missing
        from it and its resourceVersion. Holds one page at a time; errors of ``pages`` propagate."""
        ...

    async def observed(self, source: KubeSource, events: Sequence[Received], resource_version: str) -> None:
        """Store one burst of watch events (BOOKMARKs included, and lines that are no event: as rejected)
        and the resourceVersion after it."""
        ...


async def follow(source: KubeSource, sink: Sink, settings: WatchSettings,
                 metrics: WorkerMetrics | None = None) -> NoReturn:
    """List then watch ``source`` forever, resuming from the sink's stored resourceVersion.

    - 410 Gone (status or in-stream ERROR) on a watch: list again at once and let the sink reconcile
      (410 on a list page: list again after a backoff; the pages stored before are real states, and
      storing them again changes nothing).
    - transient API faults and a database outage: back off (``settings.error_backoffs_s`` with
      jitter, ``Retry-After`` winning), then watch again from the last stored resourceVersion.
    - the server ending a watch after ``timeoutSeconds``: watch again at once.
    - a whole line of the stream that is no watch event (not UTF-8, not JSON, JSON but no event, an ERROR
      without a Status): handed to the sink with the events around it (stored as rejected) and the watch
      reads on; it moves no resourceVersion. A stream that ends inside a line was cut: transient, as above.
    - every complete list, the first one included, is timed into ``metrics`` (s); a list cut by a fault
      is not.

    Raises:
        ApiError: a refusal that retrying will not fix (403, 404, ...); the caller restarts the task.
        LedgerError: other than Unavailable (e.g. StreamConflict from a second writer).
    """
    kind = source.info.kind
    since = await _resume(source, sink, settings, metrics)
    failures = 0
    while True:
        try:
            if since is None:
                # Page by page: holding whole lists (106,019 claims, 120,038 pods) as decoded objects
                # took a restarted worker to 1,320 MiB; see services.record_relist_page.
                started = time.perf_counter()
                listed = await sink.relisted(source, source.pages())
                since = listed.resource_version
                if metrics is not None:
                    metrics.observed_list(kind, listed.count, since, duration_s=time.perf_counter() - started)
            async for burst in source.watch(since=since, timeout_s=settings.server_timeout_s,
                                            batch_size=settings.batch_size):
                last = next((e.resource_version for e in reversed(burst)
                             if isinstance(e, WatchEvent) and e.resource_version), since)
                await sink.observed(source, burst, last)
                since = last
                failures = 0
                if metrics is not None:
                    metrics.observed_events(kind, [e.type for e in burst if isinstance(e, WatchEvent)], since)
            if metrics is not None:
                metrics.restarted(kind, "timeout")
            log.debug("watch ended; watching again", extra={"resource": source.info.plural, "resourceVersion": since})
        except WatchExpired as e:
            log.warning("resourceVersion expired (410); listing again: %s", e,
                        extra={"resource": source.info.plural, "resourceVersion": since})
            if metrics is not None:
                metrics.expired(kind)
            if since is None:
                # The list itself expired (a continue token outlived its snapshot): list again, but
                # after a backoff, so that a server answering 410 to every list is not hammered.
                await asyncio.sleep(backoff_delay_s(settings, failures))
                failures += 1
            since = None
        except (TransientApiError, Unavailable) as e:
            retry_after = e.retry_after_s if isinstance(e, TransientApiError) else None
            delay = backoff_delay_s(settings, failures, retry_after_s=retry_after)
            failures += 1
            reason = "database" if isinstance(e, Unavailable) else f"http-{e.status}" if e.status else "connection"
            log.warning("transient failure (%s), retrying in %.2fs: %s", reason, delay, e,
                        extra={"resource": source.info.plural, "resourceVersion": since})
            if metrics is not None:
                metrics.restarted(kind, reason)
            await asyncio.sleep(delay)


async def _resume(source: KubeSource, sink: Sink, settings: WatchSettings, metrics: WorkerMetrics | None) -> str | None:
    failures = 0
    while True:
        try:
            return await sink.resume_from(source)
        except Unavailable as e:
            delay = backoff_delay_s(settings, failures)
            failures += 1
            log.warning("cannot read the watch checkpoint, retrying in %.2fs: %s", delay, e,
                        extra={"resource": source.info.plural, "resourceVersion": None})
            if metrics is not None:
                metrics.restarted(source.info.kind, "database")
            await asyncio.sleep(delay)
