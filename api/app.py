"""``create_app``: the only place the REST API is wired together.

Reads come from the read models through :mod:`ledger.services`; the API never writes to the ledger.
OpenAPI 3.1 is served at ``/schema`` (``/schema/openapi.json``); every error is RFC 9457 problem details.
Every read answers ``HEAD`` as it answers ``GET``, without the body (:mod:`api.methods`), the ``/schema``
pages too.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any, Final
from urllib.parse import unquote

import msgspec
from litestar import Litestar, Router
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.handlers.base import BaseRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import (
    RapidocRenderPlugin,
    RedocRenderPlugin,
    StoplightRenderPlugin,
    SwaggerRenderPlugin,
    YamlRenderPlugin,
)
from litestar.openapi.spec import Components, SecurityScheme
from pydantic import ValidationError

import ledger
from api.auth import TokenTable, provide_access, require_token
from api.catch_up import DEFAULT_CATCH_UP_INTERVAL_S, keep_read_models_current
from api.controllers.claims import ClaimsController
from api.controllers.demand import DemandController
from api.controllers.events import DevicesController, EventsController
from api.controllers.health import HealthController
from api.controllers.occupancy import OccupancyController
from api.controllers.reports import ReportsController
from api.controllers.usage import UsageController
from api.deps import AppState, ReportSlots, provide_state, wall_clock
from api.errors import EXCEPTION_HANDLERS, html_error_as_problem, problem_details_plugin
from api.limits import DEFAULT_REPORT_SLOTS, REBUILD_WAIT_S
from api.methods import JsonRenderPluginWithHead
from api.parameters import known_query_parameters, no_nul_characters
from ledger.config import LedgerConfig
from ledger.errors import Invalid
from ledger.store.database import LedgerDatabase

WORKER_SPEC_ENV: Final = "DRA_LEDGER_API_WORKER"
"""Environment variable through which ``dra-ledger serve --workers N`` hands each worker process what it checked:
a :class:`WorkerSpec` as JSON. Set by ``serve`` only; holds the database URL with its password, as
``LEDGER_DATABASE_URL`` may (readable by the same user only, like any process's environment)."""


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What a worker process of ``dra-ledger serve --workers N`` builds its app from (:data:`WORKER_SPEC_ENV`)."""

    database_url: str
    """The ledger database, schema at head (``LedgerDatabase.url``: with its password)."""
    cluster: str | None
    """Answer for this cluster only; ``None``: every cluster."""
    report_slots: int = DEFAULT_REPORT_SLOTS
    """Whole-fleet reports each worker computes at once (``serve --report-slots``, :class:`api.deps.ReportSlots`)."""
    config: str
    """The configuration ``serve`` read and checked, as JSON (``LedgerConfig.model_dump_json(by_alias=True)``):
    every worker, one started after the file changed too, answers with the same tokens, teams and prices."""
    session_name: str = "dra-ledger serve"
    """The ``application_name`` of the worker's database sessions (:data:`ledger.store.postgres.SESSION_NAME`):
    the command that started it, as that command's own sessions are named."""

    catch_up_interval_s: float = DEFAULT_CATCH_UP_INTERVAL_S
    """Seconds between the worker's catch-ups of the read models (``serve --catch-up-interval``; 0: none)."""

    def to_json(self) -> str:
        """The spec as the JSON text :func:`create_app_for_worker` reads."""
        return msgspec.json.encode(self).decode()


def create_app_for_worker() -> Litestar:
    """The app factory uvicorn calls in each worker process of ``dra-ledger serve --workers N``.

    Source: :data:`WORKER_SPEC_ENV` (a :class:`WorkerSpec`), which ``serve`` sets after checking the database
    (schema at head), the configuration and the tokens in its own process.

    Raises:
        Invalid: :data:`WORKER_SPEC_ENV` is unset (not started by ``serve``) or not a :class:`WorkerSpec`, or
            what :func:`create_app` raises (a ``tokenEnv`` variable unset in this process).
    """
    raw = os.environ.get(WORKER_SPEC_ENV)
    if raw is None:
        raise Invalid(f"{WORKER_SPEC_ENV} is not set: this factory serves the workers `dra-ledger serve --workers N` "
                      "starts; run that command")
    try:
        spec = msgspec.json.decode(raw, type=WorkerSpec)
    except msgspec.DecodeError as e:  # ValidationError is a DecodeError
        raise Invalid(f"{WORKER_SPEC_ENV}: not a worker spec: {e}") from e
    try:
        config = LedgerConfig.model_validate_json(spec.config)
    except ValidationError as e:
        raise Invalid(f"{WORKER_SPEC_ENV}: not a configuration: {e}") from e
    return create_app(db=LedgerDatabase.from_url(spec.database_url, session_name=spec.session_name), config=config,
                      cluster=spec.cluster, reports=ReportSlots(spec.report_slots),
                      catch_up_interval_s=spec.catch_up_interval_s)


_KEPT_ESCAPES_RE: Final = re.compile(r"(%2[fF]|%25)")
"""The escapes :class:`LedgerApp` leaves encoded in the path it routes on: a slash, and a percent sign (so that a
``%2F`` in a parameter always stands for a slash the client encoded, never for ``%252F`` decoded once)."""


class LedgerApp(Litestar):
    """The Litestar application, routing on paths where an encoded slash (``%2F``) stays inside its segment.

    Why: a ResourceSlice pool name may hold ``/`` (DNS subdomains joined by slashes), so the device timeline's
    path ``/v1/devices/{driver}/{pool}/{device}/timeline`` needs the pool's slashes percent-encoded. ASGI servers
    hand Litestar the path already decoded, where ``rack-1%2Flab-node`` is two segments, and the route never
    matched (404 ``Not Found`` for such a device whatever the spelling). Here the path the router sees is decoded
    from the raw one (``scope["raw_path"]``, the bytes the client sent) except for ``%2F``, which stays ``%2F`` in
    its parameter, and ``%25`` (a ``%``), so that ``%252F`` stays the text ``%2F`` it encodes; the one parameter
    that may hold a slash (the pool) turns both back (:func:`api.parameters.path_name`). Driver, device, namespace
    and claim names never hold ``/`` or ``%``, so elsewhere such a segment names nothing and answers 404, never
    another route (``/v1/claims/ns/a%2Fhistory`` was ``/v1/claims/ns/a/history``).
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Route ``scope`` as the class docstring says, then handle it as Litestar does.

        Args:
            scope: the ASGI connection scope; a copy with another ``path`` is routed when ``raw_path`` holds
                ``%2F`` or ``%25`` (case-insensitive), kept as ``%2F`` and ``%25``; ``scope`` itself otherwise.
            receive: the ASGI receive channel.
            send: the ASGI send channel.
        """
        raw = scope.get("raw_path") if scope.get("type") in ("http", "websocket") else None
        if isinstance(raw, bytes) and b"%2" in raw:
            text = raw.decode("latin-1").split("?", 1)[0]  # ASGI leaves the query out; some servers did not
            parts = _KEPT_ESCAPES_RE.split(text)
            if len(parts) > 1:  # odd items are the kept escapes, written in capitals; the rest decoded as usual
                scope = {**scope, "path": "".join(part.upper() if n % 2 else unquote(part)
                                                  for n, part in enumerate(parts))}
        await super().__call__(scope, receive, send)


def _check_v1_request(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """The ``/v1`` guard: the token (:func:`api.auth.require_token`, 401), then the query parameters
    (:func:`api.parameters.known_query_parameters`, 400/422), then NUL characters
    (:func:`api.parameters.no_nul_characters`, 422), in that order; each raises as its own docstring says.

    One guard, not three: Litestar copies the route handler for every guard of every request (~20 µs a copy).
    """
    require_token(connection, handler)
    known_query_parameters(connection, handler)
    no_nul_characters(connection, handler)


def freeze_startup_objects() -> None:
    """Move every object alive once the app has started into the garbage collector's permanent generation.

    Why: CPython's full collections scan every tracked object, and an API process starts with ~110,000 of them
    (modules, classes, the app and its OpenAPI schema) that live as long as the process. A report that decodes a
    large answer (``/v1/pending`` reads every device published at T) made enough containers to run several full
    collections, each rescanning those: on a 1,000-node day, ``/v1/pending`` took 0.99 s with them and 0.84 s
    once they were frozen (``services.pending``, median of eight instants). Objects made later are collected as
    before. No collection runs first: any garbage cycle the startup left is kept, once, for the life of the
    process (a full collection here cost the test suite, which starts an app per test, ~0.6 s a start).
    Runs at startup, in each worker process of ``serve``.
    """
    gc.freeze()


def create_app(*, db: LedgerDatabase, config: LedgerConfig, cluster: str | None = None,
               clock: Callable[[], datetime] = wall_clock, reports: ReportSlots | None = None,
               rebuild_wait_s: float = REBUILD_WAIT_S, catch_up_interval_s: float = 0.0) -> Litestar:
    """Build the Litestar application.

    Args:
        db: the ledger database (schema at head); the API only reads it.
        config: the configuration file (API tokens, prices, idle thresholds, quotas).
        cluster: answer for this cluster only (``None``: every cluster, selectable per request).
        clock: returns "now" (aware UTC) for the usage window's present (see ``GET /v1/usage``); the
            wall clock unless a test moves time.
        reports: how many whole-fleet reports the process computes at once (:class:`api.deps.ReportSlots`);
            ``None``: :data:`api.limits.DEFAULT_REPORT_SLOTS`, waiting up to :data:`api.limits.REPORT_WAIT_S`.
        rebuild_wait_s: seconds a request waits for read models a rebuild holds before it answers 503 with
            ``Retry-After`` (:data:`api.limits.REBUILD_WAIT_S`). Set on a copy of ``db`` sharing its engine: the
            caller's ``db`` keeps waiting as it did.
        catch_up_interval_s: seconds between two catch-ups of the read models while the app runs
            (:func:`api.catch_up.keep_read_models_current`, started and stopped with the app's lifespan); 0 (the
            default, for tests and embedders that catch up themselves): none.

    Raises:
        Invalid: a token's ``tokenEnv`` variable is unset or too short, two tokens have the same value, or
            ``cluster`` is empty (which would filter on a cluster named ``""`` and answer nothing).
    """
    if cluster == "":
        raise Invalid("cluster: empty; leave it out to answer for every cluster")
    tokens = TokenTable.from_config(config)

    @asynccontextmanager
    async def catching_up(_: Litestar) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(
            keep_read_models_current(db, interval_s=catch_up_interval_s), name="read-models-catch-up")
        try:
            yield
        finally:
            # Cancelled, the catch-up cancels the statement its thread runs and returns once that thread is done.
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    v1 = Router(
        path="/",
        guards=[_check_v1_request],
        route_handlers=[
            OccupancyController,
            ClaimsController,
            UsageController,
            ReportsController,
            EventsController,
            DevicesController,
            DemandController,
        ],
        security=[{"bearer": []}] if tokens.enabled else None,
    )
    app = LedgerApp(
        route_handlers=[v1, HealthController],
        dependencies={
            "ctx": Provide(provide_state, sync_to_thread=False),
            "access": Provide(provide_access, sync_to_thread=False),
        },
        exception_handlers=dict(EXCEPTION_HANDLERS),
        after_request=html_error_as_problem,
        plugins=[problem_details_plugin()],
        openapi_config=OpenAPIConfig(
            title="dra-ledger",
            version=ledger.version(),
            path="/schema",
            description="History of Kubernetes DRA device allocations: occupancy at any instant, device-hours "
            "for chargeback, claims, idle-claim reports and the audit log. Times are RFC 3339; "
            "errors are RFC 9457 problem details.",
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
            # Litestar's default pages, Redoc also at /schema itself; the JSON plugin last, as it adds the
            # HEAD twin of every page (api.methods.JsonRenderPluginWithHead).
            render_plugins=[RedocRenderPlugin(), YamlRenderPlugin(), RapidocRenderPlugin(), StoplightRenderPlugin(),
                            SwaggerRenderPlugin(), JsonRenderPluginWithHead()],
        ),
        debug=False,
        # Frozen objects go back to the oldest generation at shutdown, so that a process that builds and stops
        # many apps (the test suite) can still collect them.
        on_startup=[freeze_startup_objects],
        on_shutdown=[gc.unfreeze],
        lifespan=[catching_up],
    )
    app.state.ledger = AppState(db=replace(db, read_models_wait_s=rebuild_wait_s), config=config, cluster=cluster,
                                clock=clock, reports=reports if reports is not None else ReportSlots())
    app.state.tokens = tokens
    return app
