"""``GET /v1/claims`` and ``GET /v1/claims/{namespace}/{name}/history``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from litestar import Controller, Request
from litestar.di import NamedDependency
from litestar.params import FromPath, QueryParameter

from api import pagination
from api.auth import Access
from api.controllers.occupancy import AT_DOC, LIMIT_DOC, TIME_SCHEMA, TOKEN_DOC
from api.deps import AppState, ClusterParam, asked_instant, page_instant, parse_cluster
from api.errors import V1_NOT_FOUND, V1_PROBLEMS
from api.methods import read
from api.schemas import ClaimHistory, Claims, to_struct
from ledger import services
from ledger.errors import UnknownClaim, shorten


class ClaimsController(Controller):
    """ResourceClaims with their state, devices and consumers, and their recorded history."""

    path = "/v1/claims"
    tags = ("claims",)

    @read(
        responses=V1_PROBLEMS,
        operation_id="listClaims",
        sync_to_thread=True,
        summary="Claims at T with state, devices, consumers",
    )
    def list_claims(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        claim_state: Annotated[
            Literal["pending", "allocated", "deleted", "all"], QueryParameter(name="state", description="Which claims.")
        ] = "all",
        namespace: Annotated[str | None, QueryParameter(description="Only this namespace.")] = None,
        team: Annotated[
            str | None, QueryParameter(description="Only claims billed to this team (after [teams] overrides).")
        ] = None,
        origin: Annotated[
            Literal["manual", "template", "extended"] | None,
            # Without null: the parameter is left out for every origin, and `origin=null` is a 422.
            QueryParameter(description="Only claims of this origin.",
                           schema_extra={"type": "string", "enum": ["manual", "template", "extended"]}),
        ] = None,
        at: Annotated[str | None, QueryParameter(description=AT_DOC, schema_extra=TIME_SCHEMA)] = None,
        cluster: ClusterParam = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 100,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> Claims:
        """Claims known at T (tables ``claims``, ``claim_states``, ``device_allocations``,
        ``claim_consumers``), ordered by cluster, namespace, name and uid: ``requested`` per DeviceClass from
        ``spec.devices.requests[]``, ``devices`` from ``status.allocation.devices.results[]``, ``consumers``
        the live ``reservedFor`` entries. A claim deleted before T has state ``deleted``. ``team``, the
        ``team`` filter and a team-limited token all use the team after the configuration's
        ``[teams] overrides``.
        """
        scope = parse_cluster(cluster, ctx)
        asked = asked_instant(at)
        query = pagination.fingerprint(
            request.url.path,
            {
                "state": claim_state,
                "namespace": namespace,
                "team": team,
                "origin": origin,
                "cluster": scope,
            }
        )
        page = pagination.decode(page_token, query=query)
        after = pagination.sort_key(page)  # the last claim served: (cluster, namespace, name, uid)
        when = page_instant(page.at, asked)
        listed = services.claims_page(
            ctx.db, at=when, state=claim_state, cluster=scope, namespace=namespace, origin=origin, team=team,
            visible_teams=access.teams, config=ctx.config, after=after, limit=limit,
        )
        body: Any = listed.body
        token = (pagination.encode(offset=0, at=str(body["at"]), query=query, after=listed.last)
                 if listed.more and listed.last is not None else None)
        return to_struct({**body, "nextPageToken": token}, Claims)

    @read(
        "/{namespace:str}/{name:str}/history",
        responses=V1_NOT_FOUND,
        operation_id="getClaimHistory",
        sync_to_thread=True,
        summary="The claim's events in order",
    )
    def history(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        namespace: FromPath[str],
        name: FromPath[str],
        cluster: ClusterParam = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 100,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> ClaimHistory:
        """Every event of every ResourceClaim recorded as ``namespace/name`` (table ``events``, streams
        ``claim:<uid>``) in stream order, claim by claim (a name can be reused by a newer claim), ``limit``
        events a page; ``uids`` lists every claim of the name on every page.

        Raises 404 when no such claim was recorded, or when the caller's token may not see its team.
        """
        scope = parse_cluster(cluster, ctx)
        query = pagination.fingerprint(request.url.path, {"cluster": scope})
        page = pagination.decode(page_token, query=query)
        body: Any = services.claim_history(ctx.db, namespace=namespace, name=name, cluster=scope)
        if access.teams is not None:
            # Each claim by the team it is billed to (a deleted one: its team when deleted), never by the
            # namespace's team now: a relabel must not hand an older claim's history to the new team.
            listed: Any = services.claims(
                ctx.db, at=datetime.now(UTC), cluster=scope, namespace=namespace, name=name, config=ctx.config
            )
            mine = {c["uid"] for c in listed["claims"] if access.sees(c["team"])}
            if not mine:
                raise UnknownClaim(f"no ResourceClaim {shorten(namespace)}/{shorten(name)} was ever recorded")
            streams = {f"claim:{uid}" for uid in mine}
            body = {**body, "uids": [u for u in body["uids"] if u in mine],
                    "events": [e for e in body["events"] if e["stream"] in streams]}
        # Offsets stay valid as the ledger grows: events are only ever appended to a stream, claims are listed by
        # creation, and of one cluster's claims of one name only the newest can still be alive, so new events land
        # after every page already served. (Without ``cluster``, two clusters' live claims of one name can both
        # grow: later pages may then repeat events the earlier claim added.)
        chunk, token = pagination.cut(body["events"], page=page, limit=limit, at=None, query=query)
        return to_struct({**body, "events": chunk, "nextPageToken": token}, ClaimHistory)
