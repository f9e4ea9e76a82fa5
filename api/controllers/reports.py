"""``GET /v1/reports/idle-claims``: claims that hold devices nobody uses."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from api import pagination
from api.auth import Access
from api.controllers.occupancy import AT_DOC, LIMIT_DOC, TIME_SCHEMA, TOKEN_DOC
from api.deps import AppState, ClusterParam, asked_instant, client_gone, page_instant, parse_cluster, parse_duration
from api.errors import V1_PROBLEMS
from api.methods import read
from api.schemas import IdleClaims, to_struct
from ledger import services


class ReportsController(Controller):
    """Operator reports."""

    path = "/v1/reports"
    tags = ("reports",)

    @read(
        "/idle-claims",
        responses=V1_PROBLEMS,
        operation_id="getIdleClaims",
        summary="The idle-claim report",
    )
    async def idle_claims(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        min_idle: Annotated[
            str | None,
            QueryParameter(
                name="minIdle",
                description="List claims idle at least this long (ISO 8601 or seconds); default per category.",
            ),
        ] = None,
        at: Annotated[str | None, QueryParameter(description=AT_DOC, schema_extra=TIME_SCHEMA)] = None,
        cluster: ClusterParam = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 100,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> IdleClaims:
        """One row per claim, first matching category: ``unreserved`` (allocated, ``reservedFor`` empty),
        ``inactive-consumers`` (reserved only by pods not Running), ``unreferenced`` (manual claims no pod
        references). ``idleSince`` is when it became idle; ``wastedDeviceHours`` = the device-hours
        ``/v1/usage`` bills the claim since then (a shared device split among the allocations holding it as
        usage splits it, ``adminAccess`` not counted). Thresholds come from the configuration (30 minutes each
        by default); ``team`` is the team after the configuration's ``[teams] overrides``, and a
        team-limited token sees the rows of that team: the body is the one of
        ``dra-ledger report idle-claims -o json`` (``services.idle_report``).

        A whole-fleet report: at most ``serve --report-slots`` of them run at once in a process, and a
        request that waits 30 s for a slot gets 503 with ``Retry-After`` (:class:`api.deps.ReportSlots`).
        """
        scope = parse_cluster(cluster, ctx)
        asked = asked_instant(at)
        idle = parse_duration(min_idle, "minIdle")
        # The parsed values, not their text, define the query: PT30M and 1800 are one minIdle.
        query = pagination.fingerprint(request.url.path, {"minIdle": idle, "cluster": scope})
        page = pagination.decode(page_token, query=query)
        when = page_instant(page.at, asked)
        body: Any = await ctx.reports.run(
            lambda: services.idle_report(ctx.db, at=when, config=ctx.config, min_idle=idle, cluster=scope),
            gone=client_gone(request))
        rows = [c for c in body["claims"] if access.sees(c["team"])]
        chunk, token = pagination.cut(rows, page=page, limit=limit, at=str(body["at"]), query=query)
        return to_struct({**body, "claims": chunk, "nextPageToken": token}, IdleClaims)
