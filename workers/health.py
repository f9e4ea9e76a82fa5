"""Worker health over HTTP: ``/healthz`` (the event loop answers), ``/readyz`` (the database answers)
and Prometheus ``/metrics`` (prometheus-client, one registry per worker so tests can run several).

Metrics (all labelled by ``kind`` where it applies):
``dra_ledger_watch_events_total{kind,type}`` watch events received and stored,
``dra_ledger_watch_ledger_events_total{kind}`` ledger events they produced,
``dra_ledger_watch_rejected_total{kind}`` watch lines and listed objects stored as rejected observations
(a line that is no watch event, an object the translator refuses; one already stored so counts again),
``dra_ledger_watch_relist_duration_seconds{kind}`` a histogram of the time each complete list took to
read and store, s, ``dra_ledger_watch_restarts_total{kind,reason}`` watches started again (timeout,
http-5xx, http-429, connection, database), ``dra_ledger_watch_expired_total{kind}`` 410 Gone answers,
``dra_ledger_watch_resource_version{kind}`` last stored resourceVersion (when numeric; it is opaque,
for progress graphs only), ``dra_ledger_watch_seconds_since_last_event{kind}``,
``dra_ledger_projection_catch_up_failures_total{reason}`` projection catch-ups that failed (database,
projection), and ``dra_ledger_leader`` (1 leader and writing, 0 standby).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

RELIST_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
"""Upper bounds of the relist duration histogram, s: from a small kind listed in one page to about
100,000 claims or pods, stored page by page."""


class _SinceLastEvent(Collector):
    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily("dra_ledger_watch_seconds_since_last_event",
                                   "Seconds since the last watch event of the kind was stored", labels=["kind"])
        now = time.monotonic()
        for kind, at in sorted(self.last.items()):
            family.add_metric([kind], now - at)
        yield family


class WorkerMetrics:
    """The worker's Prometheus metrics in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("dra_ledger_watch_events", "Watch events stored, per kind and watch event type",
                              ["kind", "type"], registry=r)
        self.ledger_events = Counter("dra_ledger_watch_ledger_events", "Ledger events appended from watches",
                                     ["kind"], registry=r)
        self.rejections = Counter("dra_ledger_watch_rejected",
                                  "Watch lines and listed objects stored as rejected observations (or found "
                                  "already stored so), per kind", ["kind"], registry=r)
        self.relist_duration = Histogram("dra_ledger_watch_relist_duration_seconds",
                                         "Time to read and store one complete list of the kind (every page, "
                                         "then the deletions and the checkpoint), s", ["kind"],
                                         buckets=RELIST_BUCKETS_S, registry=r)
        self.restarts = Counter("dra_ledger_watch_restarts", "Watches started again, per kind and reason",
                                ["kind", "reason"], registry=r)
        self.expirations = Counter("dra_ledger_watch_expired", "410 Gone answers (resourceVersion too old)",
                                   ["kind"], registry=r)
        self.resource_version = Gauge("dra_ledger_watch_resource_version",
                                      "Last stored resourceVersion when numeric (opaque: for progress only)",
                                      ["kind"], registry=r)
        self.catch_up_failures = Counter("dra_ledger_projection_catch_up_failures",
                                         "Projection catch-ups that failed, per reason (database: unreachable; "
                                         "projection: a batch of events the read models cannot apply)",
                                         ["reason"], registry=r)
        self.leader = Gauge("dra_ledger_leader", "1 when this replica holds the Lease and writes, 0 on standby",
                            registry=r)
        self._since = _SinceLastEvent()
        r.register(self._since)
        self.stored_events = 0
        """Watch events this worker stored (for tests: a standby stores none)."""
        self.leading = False
        """Whether this replica currently leads (the value of ``dra_ledger_leader``)."""

    def _version(self, kind: str, resource_version: str | None) -> None:
        try:
            value = float(resource_version) if resource_version else math.nan
        except ValueError:
            value = math.nan
        self.resource_version.labels(kind=kind).set(value)

    def observed_list(self, kind: str, items: int, resource_version: str, *, duration_s: float) -> None:
        """A full list of ``items`` objects was stored at ``resource_version``, ``duration_s`` (s) after
        its first page was asked for."""
        self.events.labels(kind=kind, type="LIST").inc(items)
        self.relist_duration.labels(kind=kind).observe(duration_s)
        self._since.last[kind] = time.monotonic()
        self._version(kind, resource_version)

    def observed_events(self, kind: str, types: Sequence[str], resource_version: str) -> None:
        """A burst of watch events (their types in order) was stored up to ``resource_version``."""
        for t in types:
            self.events.labels(kind=kind, type=t).inc()
        self.stored_events += sum(1 for t in types if t != "BOOKMARK")
        self._since.last[kind] = time.monotonic()
        self._version(kind, resource_version)

    def appended(self, kind: str, events: int) -> None:
        """``events`` ledger events were appended from watch events of ``kind``."""
        self.ledger_events.labels(kind=kind).inc(events)

    def rejected(self, kind: str, lines: int) -> None:
        """``lines`` watch lines or listed objects of ``kind`` were rejected (see ``observations.error``)."""
        self.rejections.labels(kind=kind).inc(lines)

    def restarted(self, kind: str, reason: str) -> None:
        """The watch of ``kind`` starts again (``timeout``, ``http-500``, ``connection``, ``database``...)."""
        self.restarts.labels(kind=kind, reason=reason).inc()

    def expired(self, kind: str) -> None:
        """A 410 Gone was answered for ``kind``."""
        self.expirations.labels(kind=kind).inc()

    def catch_up_failed(self, reason: str) -> None:
        """A projection catch-up failed: ``database`` (unreachable) or ``projection`` (a batch it cannot apply)."""
        self.catch_up_failures.labels(reason=reason).inc()

    def set_leader(self, leader: bool) -> None:
        """Record whether this replica is the leader (1) or a standby (0)."""
        self.leading = leader
        self.leader.set(1 if leader else 0)

    def exposition(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)


Readiness = Callable[[], Awaitable[bool]]


class HealthServer:
    """``/healthz``, ``/readyz`` and ``/metrics`` on one port (aiohttp)."""

    def __init__(self, metrics: WorkerMetrics, ready: Readiness) -> None:
        self._metrics = metrics
        self._ready = ready
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if await self._ready():
            return web.Response(text="ready\n")
        return web.Response(status=503, text="database unreachable\n")

    async def _metrics_page(self, _: web.Request) -> web.Response:
        return web.Response(body=self._metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0 = a free port); returns the bound port."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics_page)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server  # aiohttp keeps the asyncio Server here; the only way to learn port 0's pick
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        log.info("health server on %s:%s", host, self.port)
        return self.port

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
