"""``GET /v1/occupancy``: every device at an instant with its holders, and totals."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from api import pagination
from api.auth import Access
from api.deps import AppState, parse_instant
from api.errors import V1_PROBLEMS
from api.schemas import Occupancy, to_struct
from ledger import services

AT_DOC = "Instant T (RFC 3339 with a zone, e.g. 2026-11-02T09:30:00Z); default now."
TOKEN_DOC = "Opaque token from the previous page's nextPageToken."
LIMIT_DOC = "Rows per page (1..1000)."


def scope_occupancy(body: Any, access: NamedDependency[Access]) -> Any:
    """Keep only allocations the caller may see; drop devices left without any; recompute the totals.

    A team-limited token sees the devices its teams hold, and totals over those devices only.
    """
    if access.teams is None:
        return body
    devices: list[Any] = []
    shared = 0
    for dev in body["devices"]:
        mine = [a for a in dev["allocations"] if access.sees(a["team"])]
        if mine:
            devices.append({**dev, "allocations": mine})
            holding = [a for a in mine if not a["adminAccess"]]
            if len(holding) > 1 or sum(len(a["consumers"]) for a in holding) > 1:
                shared += 1
    allocated = sum(1 for d in devices if any(not a["adminAccess"] for a in d["allocations"]))
    return {
        **body,
        "devices": devices,
        "totals": {"devices": len(devices), "allocated": allocated, "free": len(devices) - allocated, "shared": shared},
    }


class OccupancyController(Controller):
    """Current and historical occupancy of devices."""

    path = "/v1/occupancy"
    tags = ("occupancy",)

    @get(
        responses=V1_PROBLEMS,
        operation_id="getOccupancy",
        sync_to_thread=True,
        summary="Every device at T with its holders, and totals devices / allocated / free / shared",
    )
    def occupancy(
        self,
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        at: Annotated[str | None, QueryParameter(description=AT_DOC)] = None,
        cluster: Annotated[str | None, QueryParameter(description="Only this cluster.")] = None,
        node: Annotated[str | None, QueryParameter(description="Only devices on this node.")] = None,
        driver: Annotated[str | None, QueryParameter(description="Only this DRA driver.")] = None,
        pool: Annotated[str | None, QueryParameter(description="Only this pool.")] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 100,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> Occupancy:
        """Devices at T from ``device_inventory`` (highest pool generation) plus devices still held after
        leaving their ResourceSlice (``offSlice``), each with its allocations from
        ``ResourceClaim.status.allocation.devices.results[]`` and live consumers from ``reservedFor``.
        Totals count hardware that shares a counter set once; ``free`` is never negative; ``adminAccess``
        allocations occupy nothing. Devices are ordered by driver, pool, device and paginated; totals
        cover every page.
        """
        query = pagination.fingerprint(
            {"cluster": cluster or ctx.cluster, "node": node, "driver": driver, "pool": pool, "at": at}
        )
        page = pagination.decode(page_token, query=query)
        when = parse_instant(page.at or at, "at")
        body: Any = scope_occupancy(
            services.occupancy_settled(ctx.db, at=when, cluster=cluster or ctx.cluster, node=node, driver=driver,
                                       pool=pool),
            access,
        )
        devices = body["devices"]
        assert isinstance(devices, list)
        rows, token = pagination.cut(devices, page=page, limit=limit, at=str(body["at"]), query=query)
        return to_struct({**body, "devices": rows, "nextPageToken": token}, Occupancy)
