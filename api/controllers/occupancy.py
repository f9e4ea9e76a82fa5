"""``GET /v1/occupancy``: every device at an instant with its holders, and totals."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from api import pagination
from api.auth import Access
from api.deps import AppState, ClusterParam, asked_instant, page_instant, parse_cluster
from api.errors import V1_NOT_FOUND
from api.methods import read
from api.schemas import Occupancy, to_struct
from ledger import services

AT_DOC = "Instant T (RFC 3339 with a zone, e.g. 2026-11-02T09:30:00Z); default now."
TIME_SCHEMA: dict[str, Any] = {"type": "string", "format": "date-time", "oneOf": None}
"""The OpenAPI schema of every time parameter: an RFC 3339 ``date-time`` string, so generated clients send times as
times. Given whole (``oneOf`` removed): Litestar wrote an optional one as ``oneOf: [string, null]`` with the format
beside it, where generators do not look. The text is still parsed by the ledger
(:func:`ledger.recorded.parse_query_time`), which refuses what it cannot take with a 422."""
TOKEN_DOC = "Opaque token from the previous page's nextPageToken."
LIMIT_DOC = "Rows per page (1..1000)."
DEVICE_CLASS_DOC = (
    "Only devices in this DeviceClass at T: the class is defined at T and all its spec.selectors[].cel.expression "
    "match the device as recorded at T (an evaluation error, such as a missing attribute, is no match); a device "
    "held off-slice is in it when an allocation at T was made for a request of this class. Totals cover only "
    "these devices. 404 when the class is not defined at T.")


class OccupancyController(Controller):
    """Current and historical occupancy of devices."""

    path = "/v1/occupancy"
    tags = ("occupancy",)

    @read(
        responses=V1_NOT_FOUND,  # 404: a deviceClass not defined at T
        operation_id="getOccupancy",
        sync_to_thread=True,
        summary="Every device at T with its holders, and totals devices / allocated / free / shared",
    )
    def occupancy(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        at: Annotated[str | None, QueryParameter(description=AT_DOC, schema_extra=TIME_SCHEMA)] = None,
        cluster: ClusterParam = None,
        node: Annotated[str | None, QueryParameter(description="Only devices on this node.")] = None,
        driver: Annotated[str | None, QueryParameter(description="Only this DRA driver.")] = None,
        pool: Annotated[str | None, QueryParameter(description="Only this pool.")] = None,
        device_class: Annotated[str | None, QueryParameter(name="deviceClass", description=DEVICE_CLASS_DOC)] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 100,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> Occupancy:
        """Devices at T from ``device_inventory`` (highest pool generation) plus devices still held after
        leaving their ResourceSlice (``offSlice``), each with its allocations from
        ``ResourceClaim.status.allocation.devices.results[]`` and live consumers from ``reservedFor``.
        Totals count hardware that shares a counter set once; ``free`` is never negative; ``adminAccess``
        allocations occupy nothing. Devices are ordered by cluster, driver, pool, device and paginated in
        SQL (the token holds the last device's key); totals cover every page. A team-limited token sees
        only devices its teams hold, only their allocations, and totals over those devices.

        ``deviceClass`` keeps the devices in that DeviceClass at T (table ``device_classes``, the
        ``DeviceClass.spec`` in force at T): a device in the inventory at T is in it when every
        ``spec.selectors[].cel.expression`` selects the device's attributes and capacity as recorded at T
        (a class without selectors takes every device; an expression that fails on a device — a missing
        attribute, a type mismatch — does not select it, as in Kubernetes); a device held off-slice (no
        longer in a ResourceSlice, so nothing to evaluate) is in it when one of its allocations at T was made
        for a request of that class. A listed device shows all its allocations, whatever class they were
        made for. Totals (devices / allocated / free / shared) count only those devices, with the same
        counter-set rule. The other filters and the team limit apply as well; a ``pageToken`` is valid
        only with the same ``deviceClass``.

        Raises:
            NotFound: (404) ``deviceClass`` is not defined at T (misspelt, created after T or deleted
                before it); in any cluster when ``cluster`` is not given.
            Invalid: (422) a bad ``at``, an empty ``deviceClass``, or a ``pageToken`` of another query.
        """
        scope = parse_cluster(cluster, ctx)
        asked = asked_instant(at)
        query = pagination.fingerprint(
            request.url.path,
            {"cluster": scope, "node": node, "driver": driver, "pool": pool, "deviceClass": device_class}
        )
        page = pagination.decode(page_token, query=query)
        after = pagination.sort_key(page)  # the last device served: (cluster, driver, pool, device)
        when = page_instant(page.at, asked)
        # A team-limited token sees the devices its teams hold, only their allocations, and totals over
        # those devices (counted one by one); the filter runs in SQL (ledger.projections.queries.occupancy),
        # on the team after the configuration's [teams] overrides.
        answer = services.occupancy_settled(
            ctx.db, at=when, cluster=scope, node=node, driver=driver, pool=pool, device_class=device_class,
            teams=access.teams,
            after=after,
            limit=limit, config=ctx.config,
        )
        body = answer.body
        token = (
            pagination.encode(offset=0, at=str(body["at"]), query=query, after=answer.next_after)
            if answer.next_after is not None
            else None
        )
        return to_struct({**body, "nextPageToken": token}, Occupancy)
