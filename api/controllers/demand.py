"""``GET /v1/quotas``, ``GET /v1/shared`` and ``GET /v1/pending``: quota, sharing and demand at an instant."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

from litestar import Controller, Request
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from api import pagination
from api.auth import Access
from api.controllers.occupancy import AT_DOC, LIMIT_DOC, TIME_SCHEMA, TOKEN_DOC
from api.deps import AppState, ClusterParam, asked_instant, client_gone, page_instant, parse_cluster
from api.errors import V1_PROBLEMS
from api.methods import read
from api.schemas import Pending, Quotas, Shared, to_struct
from ledger import services

AtParam = Annotated[str | None, QueryParameter(description=AT_DOC, schema_extra=TIME_SCHEMA)]
LimitParam = Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)]
TokenParam = Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)]


def scope_shared(body: Any, access: Access) -> Any:
    """Keep only what the caller's teams hold; recompute the totals over what is left."""
    if access.teams is None:
        return body
    devices = [{**d, "allocations": mine} for d in body["devices"]
               if (mine := [a for a in d["allocations"] if access.sees(a["team"])])]
    counter_sets = []
    for cs in body["counterSets"]:
        partitions = [{**p, "allocations": [a for a in p["allocations"] if access.sees(a["team"])]}
                      for p in cs["partitions"]]
        if any(p["allocations"] for p in partitions):
            counter_sets.append({**cs, "partitions": partitions})
    claims = [c for c in body["claims"] if access.sees(c["team"])]
    return {**body, "devices": devices, "counterSets": counter_sets, "claims": claims,
            "totals": {"sharedDevices": len(devices), "counterSets": len(counter_sets), "sharedClaims": len(claims)}}


def scope_pending(body: Any, access: Access) -> Any:
    """Keep the caller's teams' claims; recompute claims and requested per (cluster, class) from them (free
    stays)."""
    if access.teams is None:
        return body
    claims = [c for c in body["claims"] if access.sees(c["team"])]
    counted: dict[tuple[str, str], int] = defaultdict(int)
    requested: dict[tuple[str, str], int] = defaultdict(int)
    for claim in claims:
        for cls in {r["deviceClass"] for r in claim["requests"] if r.get("deviceClass")}:
            counted[(claim["cluster"], cls)] += 1
        for r in claim["requests"]:
            if r.get("deviceClass"):
                requested[(claim["cluster"], r["deviceClass"])] += int(r.get("count") or 0)
    classes = [{**c, "claims": counted[key], "requested": requested[key]}
               for c in body["classes"] if counted[key := (c["cluster"], c["deviceClass"])]]
    return {**body, "claims": claims, "classes": classes}


class DemandController(Controller):
    """Quota use, shared devices and pending demand."""

    path = "/v1"
    tags = ("quotas",)

    @read("/quotas", responses=V1_PROBLEMS, operation_id="getQuotas",
         summary="Kueue-style counted usage vs quota per cluster, team and resource name")
    async def quotas(self, request: Request[Any, Any, Any], ctx: NamedDependency[AppState],
                     access: NamedDependency[Access], at: AtParam = None,
                     cluster: ClusterParam = None, limit: LimitParam = 100, page_token: TokenParam = None) -> Quotas:
        """Counted usage at T from allocated claims (tables ``claims``, ``device_allocations``), following
        Kueue's ``deviceClassMappings`` in the configuration: ``ExactCount`` requests count ``count``,
        ``adminAccess`` counts 0, a claim shared by many pods counts once; what Kueue would refuse is still
        counted, with Kueue's reason. Each cluster is counted apart, and ``overQuota`` compares with the
        cluster's configured nominal quota (a ``[[quotas]]`` entry naming the cluster, else one naming none).

        A whole-fleet report: at most ``serve --report-slots`` of them run at once in a process, and a
        request that waits 30 s for a slot gets 503 with ``Retry-After`` (:class:`api.deps.ReportSlots`).
        """
        scope = parse_cluster(cluster, ctx)
        asked = asked_instant(at)
        query = pagination.fingerprint(request.url.path, {"cluster": scope})
        page = pagination.decode(page_token, query=query)
        when = page_instant(page.at, asked)
        body: Any = await ctx.reports.run(
            lambda: services.quotas(ctx.db, at=when, config=ctx.config, cluster=scope), gone=client_gone(request))
        rows = [r for r in body["rows"] if access.sees(r["team"])]
        chunk, token = pagination.cut(rows, page=page, limit=limit, at=str(body["at"]), query=query)
        return to_struct({**body, "rows": chunk, "nextPageToken": token}, Quotas)

    @read("/shared", responses=V1_PROBLEMS, operation_id="getShared", tags=["shared"],
         summary="Shared devices, partitioned counter sets and multi-consumer claims")
    async def shared(self, request: Request[Any, Any, Any], ctx: NamedDependency[AppState],
                     access: NamedDependency[Access], at: AtParam = None, cluster: ClusterParam = None,
                     limit: LimitParam = 100, page_token: TokenParam = None) -> Shared:
        """Devices with more than one allocation (``shareID``, ``consumedCapacity``, or a double booking)
        with each holder's chargeback fraction; partitionable devices grouped by the counter set they
        consume (``sharedCounters`` / ``consumesCounters``) with counters in use; claims with more than one
        live consumer.

        Paginated as one list: ``limit`` counts the entries of ``devices``, ``counterSets`` and ``claims``
        together, in that order (a page may end inside any of them and the next one go on from there);
        ``totals`` count every entry, on every page. A fleet with MIG partitions lists every GPU's counter set
        (4,000 for 500 MIG nodes of 8 GPUs), too much for one answer.

        A whole-fleet report: at most ``serve --report-slots`` of them run at once in a process, and a
        request that waits 30 s for a slot gets 503 with ``Retry-After`` (:class:`api.deps.ReportSlots`).
        """
        scope = parse_cluster(cluster, ctx)
        asked = asked_instant(at)
        query = pagination.fingerprint(request.url.path, {"cluster": scope})
        page = pagination.decode(page_token, query=query)
        when = page_instant(page.at, asked)
        body = await ctx.reports.run(
            lambda: scope_shared(services.shared(ctx.db, at=when, cluster=scope, config=ctx.config), access),
            gone=client_gone(request))
        lists = ("devices", "counterSets", "claims")
        entries = [(name, entry) for name in lists for entry in body[name]]
        chunk, token = pagination.cut(entries, page=page, limit=limit, at=str(body["at"]), query=query)
        paged = {name: [entry for of, entry in chunk if of == name] for name in lists}
        return to_struct({**body, **paged, "nextPageToken": token}, Shared)

    @read("/pending", responses=V1_PROBLEMS, operation_id="getPending", tags=["pending"],
         summary="Pending demand vs free devices per DeviceClass")
    async def pending(self, request: Request[Any, Any, Any], ctx: NamedDependency[AppState],
                      access: NamedDependency[Access], at: AtParam = None,
                      cluster: ClusterParam = None, limit: LimitParam = 100, page_token: TokenParam = None) -> Pending:
        """Claims without an allocation at T, with devices requested per request, and per DeviceClass the
        claims waiting, devices requested and devices free at T (selected by the class's CEL selectors,
        unallocated, not tainted NoSchedule/NoExecute), one ``classes`` entry per cluster and DeviceClass.
        ``claims`` is paginated; ``classes`` covers all.

        A whole-fleet report: at most ``serve --report-slots`` of them run at once in a process, and a
        request that waits 30 s for a slot gets 503 with ``Retry-After`` (:class:`api.deps.ReportSlots`).
        """
        scope = parse_cluster(cluster, ctx)
        asked = asked_instant(at)
        query = pagination.fingerprint(request.url.path, {"cluster": scope})
        page = pagination.decode(page_token, query=query)
        when = page_instant(page.at, asked)
        body = await ctx.reports.run(
            lambda: scope_pending(services.pending(ctx.db, at=when, cluster=scope, config=ctx.config), access),
            gone=client_gone(request))
        chunk, token = pagination.cut(body["claims"], page=page, limit=limit, at=str(body["at"]), query=query)
        return to_struct({**body, "claims": chunk, "nextPageToken": token}, Pending)
