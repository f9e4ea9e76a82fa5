"""``GET /v1/events``: the audit log, and ``GET /v1/devices/{driver}/{pool}/{device}/timeline``."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request
from litestar.di import NamedDependency
from litestar.params import FromPath, QueryParameter

from api import pagination
from api.auth import Access
from api.controllers.occupancy import LIMIT_DOC, TIME_SCHEMA, TOKEN_DOC
from api.deps import AppState, ClusterParam, page_instant, parse_cluster, parse_instant
from api.errors import V1_FORBIDDEN, V1_NOT_FOUND
from api.methods import read
from api.parameters import path_name
from api.schemas import Events, Timeline, to_struct
from ledger import services
from ledger.errors import Invalid, shorten_repr
from ledger.events import EVENT_TYPES
from ledger.projections.queries import rfc3339
from ledger.types import MAX_GLOBAL_POSITION


class EventsController(Controller):
    """The append-only event log by global position."""

    path = "/v1/events"
    tags = ("events",)

    @read(
        responses=V1_FORBIDDEN,
        operation_id="listEvents",
        sync_to_thread=True,
        summary="The audit log by global position",
    )
    def events(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        after_position: Annotated[
            int,
            QueryParameter(name="afterPosition", ge=0, le=MAX_GLOBAL_POSITION,
                           description="Only events after this global position (0 to 9223372036854775807, the "
                           "largest PostgreSQL bigint).",
                           # Litestar writes bounds as floats, and 2**63 - 1 as a float is 2**63: the document
                           # would allow one position past the bigint range. The exact integers instead.
                           schema_extra={"minimum": 0, "maximum": MAX_GLOBAL_POSITION}),
        ] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description="Events per page.")] = 100,
        event_type: Annotated[str | None, QueryParameter(name="type", description="Only this event type.")] = None,
        stream: Annotated[str | None, QueryParameter(description="Only this stream, e.g. claim:<uid>.")] = None,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
        cluster: ClusterParam = None,
    ) -> Events:
        """Events of table ``events`` in global position order (envelope: ``globalPosition``, ``stream``,
        ``streamPosition``, ``type``, ``occurredAt``, ``recordedAt``; ``payload`` with Kubernetes field
        names). The next page starts after the last position returned. Team-limited tokens may not read the
        audit log (403): events are not billed to teams. ``cluster`` keeps one cluster's events (an API served
        for one cluster shows only its own).

        Raises:
            Invalid: (422, from the ``/v1`` guard) ``afterPosition`` outside 0 to
                :data:`ledger.types.MAX_GLOBAL_POSITION` or ``limit`` outside 1 to 1000, naming the bounds;
                an unknown ``type``; ``afterPosition`` together with ``pageToken``; a foreign ``pageToken``.
        """
        if access.teams is not None:
            from litestar.exceptions import PermissionDeniedException

            raise PermissionDeniedException("a team-limited token cannot read the audit log")
        if event_type is not None and event_type not in EVENT_TYPES:
            known = ", ".join(sorted(EVENT_TYPES))
            raise Invalid(f"type: no event type {shorten_repr(event_type)}; the types are {known}")
        if page_token is not None and after_position:
            raise Invalid("give afterPosition or pageToken, not both (the token already says where to go on)")
        scope = parse_cluster(cluster, ctx)
        query = pagination.fingerprint(request.url.path, {"type": event_type, "stream": stream, "cluster": scope})
        page = pagination.decode(page_token, query=query)
        after = page.offset if page_token is not None else after_position
        rows = services.events(
            ctx.db, after=after, limit=limit + 1, types=[event_type] if event_type else None, stream=stream,
            cluster=scope,
        )
        chunk = rows[:limit]
        token = None
        if len(rows) > limit:
            last = chunk[-1]["globalPosition"]
            assert isinstance(last, int)
            token = pagination.encode(offset=last, at=None, query=query)
        return to_struct({"events": chunk, "nextPageToken": token}, Events)


class DevicesController(Controller):
    """One device's history."""

    path = "/v1/devices"
    tags = ("devices",)

    @read(
        "/{driver:str}/{pool:str}/{device:str}/timeline",
        responses=V1_NOT_FOUND,
        operation_id="getDeviceTimeline",
        sync_to_thread=True,
        summary="Allocations and inventory changes of one device",
    )
    def timeline(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        driver: FromPath[str],
        pool: FromPath[str],
        device: FromPath[str],
        start: Annotated[
            str | None,
            QueryParameter(name="from", description="Window start (RFC 3339); default the beginning of the ledger.",
                           schema_extra=TIME_SCHEMA),
        ] = None,
        end: Annotated[str | None, QueryParameter(name="to", description="Window end (RFC 3339); default now.",
                                                    schema_extra=TIME_SCHEMA)] = None,
        cluster: ClusterParam = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 100,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> Timeline:
        """Inventory intervals (``device_inventory``: which slice published it, on which node) and allocation
        intervals (``device_allocations``: which claim held it, for which team) overlapping the window, in
        start order, ``limit`` entries a page. A ``/`` in the pool name is sent percent-encoded (``%2F``).
        Team-limited tokens see only their teams' allocations. 404 when the device was never recorded.
        Without ``to`` the window ends at the first page's instant on every later page (the token carries it),
        so the entries of a device still in use do not move between pages.
        """
        from datetime import UTC, datetime

        scope = parse_cluster(cluster, ctx)
        pool = path_name(pool)
        t0 = parse_instant(start, "from", default=datetime(1970, 1, 1, tzinfo=UTC))
        asked = parse_instant(end, "to") if end is not None else None
        # The parsed window, not its text, is the query (the path names the device).
        query = pagination.fingerprint(request.url.path, {"from": t0, "cluster": scope})
        page = pagination.decode(page_token, query=query)
        t1 = page_instant(page.at, asked, name="to")
        if not t0 < t1:
            given = "from" if start is not None else "from (by default 1970-01-01T00:00:00Z)"
            until = "to" if end is not None else f"to (by default now, {rfc3339(t1)})"
            raise Invalid(f"{given} must be before {until}")
        body: Any = services.device_timeline(
            ctx.db, driver=driver, pool=pool, device=device, start=t0, end=t1, cluster=scope, config=ctx.config
        )
        if access.teams is not None:
            body["entries"] = [e for e in body["entries"] if e["kind"] == "inventory" or access.sees(e["team"])]
        chunk, token = pagination.cut(body["entries"], page=page, limit=limit, at=rfc3339(t1), query=query)
        return to_struct({**body, "entries": chunk, "nextPageToken": token}, Timeline)
