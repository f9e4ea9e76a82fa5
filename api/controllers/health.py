"""``/healthz`` (liveness), ``/readyz`` (database reachable, projections caught up) and ``/metrics``."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from api.auth import TokenTable
from api.deps import AppState
from api.methods import read
from api.schemas import Health
from ledger import services
from ledger.errors import Unavailable

METRICS_MEDIA_TYPE = "text/plain; version=0.0.4"
"""Prometheus text exposition format (Litestar appends ``charset=utf-8``)."""
MAX_READY_LAG = 10_000
"""Events a projection may trail the head by and still be ready (a replay burst catches up in seconds)."""


class HealthController(Controller):
    """Probes and metrics; never require a token (``/metrics`` unless configured otherwise)."""

    path = ""
    tags = ("health",)

    @read("/healthz", operation_id="getHealthz", summary="Liveness: the process answers")
    async def healthz(self) -> Health:
        """Always ``{"status": "ok"}`` while the process serves requests."""
        return Health(status="ok")

    @read(
        "/readyz",
        operation_id="getReadyz",
        sync_to_thread=True,
        summary="Readiness: database reachable and projections caught up",
        responses={
            503: ResponseSpec(
                data_container=Health,
                description="Database unreachable or projections lagging",
                generate_examples=False,
            )
        },
    )
    def readyz(self, ctx: NamedDependency[AppState]) -> Response[Health]:
        """``ready`` when the database answers and every projection trails the newest event by at most
        10,000 events; otherwise 503 with the reason (``database: unreachable`` or the lag per projection).

        ``rebuilding`` says whether a rebuild holds the read models now (``pg_locks``): the process stays ready
        (its 503 answers with ``Retry-After`` tell clients more than a pod taken out of its Service would), and the
        field explains them.
        """
        try:
            read_models = services.health(ctx.db)
        except Unavailable:
            return Response(Health(status="unavailable", database="unreachable"), status_code=503)
        ready = max(read_models.lag.values(), default=0) <= MAX_READY_LAG
        return Response(
            Health(status="ready" if ready else "lagging", database="ok", projectionLag=dict(read_models.lag),
                   rebuilding=read_models.rebuilding),
            status_code=200 if ready else 503,
        )

    @read(
        "/metrics",
        operation_id="getMetrics",
        sync_to_thread=True,
        summary="Prometheus metrics",
        media_type=METRICS_MEDIA_TYPE,
    )
    def metrics(self, request: Request[Any, Any, Any], ctx: NamedDependency[AppState]) -> Response[Any]:
        """Prometheus text format: ``dra_ledger_projection_lag_events{projection}``, ``dra_ledger_database_up`` and
        ``dra_ledger_read_models_rebuilding`` (1 while a rebuild holds the read models), read over one connection
        (:func:`ledger.services.health`).

        Open unless the configuration sets ``[api] metricsPublic = false`` while tokens are configured; then
        any configured token may read it (the figures are cluster-wide, no team's rows).

        Raises:
            NotAuthorizedException: (401) ``metricsPublic`` is false and the request has no valid bearer token.
        """
        if not ctx.config.api.metrics_public:
            tokens: TokenTable = request.app.state.tokens
            tokens.check(request.headers.getall("authorization", []))
        registry = CollectorRegistry()
        up = Gauge("dra_ledger_database_up", "1 when the ledger database answers", registry=registry)
        lag_gauge = Gauge(
            "dra_ledger_projection_lag_events",
            "Events a projection has not applied yet",
            ["projection"],
            registry=registry,
        )
        rebuilding = Gauge("dra_ledger_read_models_rebuilding",
                           "1 while a rebuild holds the read models (their reads wait, the API answers 503)",
                           registry=registry)
        try:
            read_models = services.health(ctx.db)
            rebuilding.set(int(read_models.rebuilding))
            up.set(1)
            for name, value in read_models.lag.items():
                lag_gauge.labels(projection=name).set(value)
        except Unavailable:
            up.set(0)
        return Response(generate_latest(registry), media_type=METRICS_MEDIA_TYPE)
