"""``GET /v1/usage``: device-hours for chargeback, as JSON or CSV."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from litestar import Controller, Request, Response
from litestar.datastructures.headers import MediaTypeHeader  # the parser Accept itself uses for each range
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from api import pagination
from api.auth import Access
from api.controllers.occupancy import LIMIT_DOC, TIME_SCHEMA, TOKEN_DOC
from api.deps import AppState, ClusterParam, parse_cluster, parse_duration, parse_instant
from api.errors import V1_PROBLEMS
from api.methods import read
from api.schemas import Usage, to_struct
from ledger import services
from ledger.errors import Invalid
from ledger.projections.queries import rfc3339
from ledger.recorded import SHORTEST_STEP

CSV_COLUMNS = ("group", "deviceClass", "driver", "start", "end", "deviceHours", "cost", "currency")
"""Columns of the CSV export: ``group`` holds the value of the ``groupBy`` key."""


VARY_ACCEPT = {"Vary": "Accept"}
"""On every ``/v1/usage`` answer, JSON or CSV: the representation follows the request's ``Accept`` (RFC 9110 §12.5.5),
so a cache must not hand a CSV answer to a client that asked for JSON, or the other way round."""


def usage_csv(body: dict[str, Any]) -> str:
    """Render a usage body as CSV with a header row of :data:`CSV_COLUMNS`, one line per row of the body.

    Written by :func:`ledger.services.csv_table`: CRLF line ends, and text cells that a spreadsheet would
    evaluate (a team label ``=HYPERLINK(...)``) prefixed with ``'``; ``deviceHours`` and ``cost`` stay numbers.
    """
    key = body["groupBy"]
    return services.csv_table(
        CSV_COLUMNS,
        (
            [
                row.get(key) or "",
                row.get("deviceClass") or "",
                row.get("driver") or "",
                row.get("start") or body["from"],
                row.get("end") or body["to"],
                row["deviceHours"],
                "" if row.get("cost") is None else row["cost"],
                row.get("currency") or "",
            ]
            for row in body["rows"]
        ),
    )


QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")
"""RFC 9110 §12.4.2 ``qvalue``: 0 to 1 with at most three decimals (``0``, ``0.5``, ``1.000``)."""


def _q(media_range: str) -> str | None:
    """The text of one media range's ``q`` parameter: ``None`` when absent, ``""`` when given without a value."""
    for param in media_range.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            return value.strip()
    return None


def valid_ranges(accept: str | None) -> list[MediaTypeHeader]:
    """The media ranges of an ``Accept`` header whose ``q`` is a valid RFC 9110 qvalue (:data:`QVALUE`; absent
    means 1), in header order.

    A range with ``q=-1``, ``q=2``, ``q=inf``, ``q=``, a bare ``q``, full-width digits or ``q=0.5000`` is not
    one the grammar allows, so it is ignored as if the client had not sent it. Read from the raw header, not
    from Litestar's :class:`~litestar.datastructures.Accept`: that ranks the ranges as it parses them, and
    ``q=inf`` raised OverflowError there (a 500), while ``q=`` or ``q=abc`` were read as ``q=1``.
    """
    ranges = [r.strip() for r in (accept or "").split(",") if r.strip()]
    return [MediaTypeHeader(r) for r in ranges if (q := _q(r)) is None or QVALUE.fullmatch(q)]


def quality(ranges: Sequence[MediaTypeHeader], media_type: str) -> float:
    """The ``q`` the client gave ``media_type``: that of the most specific range of ``ranges`` matching it
    (RFC 9110 §12.5.1: ``text/*;q=0.5, text/csv`` gives CSV 1), 0 when none matches. ``ranges`` are valid
    ones (:func:`valid_ranges`), so every ``q`` is a number from 0 to 1."""
    offered = MediaTypeHeader(media_type)
    matching = [r for r in ranges if offered.match(r)]
    if not matching:
        return 0.0
    return float(max(matching, key=lambda r: r.priority[1]).params.get("q", "1"))  # priority = (q, specificity)


def negotiate(accept: str | None, offered: Sequence[str]) -> str:
    """The media type to answer with, from the raw ``Accept`` header: the ``offered`` type with the highest
    :func:`quality`; on a tie the one offered first (the client does not prefer the other), and
    ``offered[0]`` when every offered type has quality 0 or the header has no valid range.

    Nothing acceptable (``Accept: text/csv;q=0``, ``Accept: image/png``, or only invalid ranges such as
    ``text/csv;q=-1``) is answered with ``offered[0]`` rather than 406, as RFC 9110 §12.5.1 allows: the API's
    default representation is always sent.
    """
    ranges = valid_ranges(accept)
    scored = [(quality(ranges, t), -i, t) for i, t in enumerate(offered)]
    best_q, _, best = max(scored)
    return best if best_q > 0 else offered[0]


class UsageController(Controller):
    """Device-hours per team, namespace, DeviceClass, model or node."""

    path = "/v1/usage"
    tags = ("usage",)

    @read(
        responses=V1_PROBLEMS,
        operation_id="getUsage",
        sync_to_thread=True,
        summary="Device-hours over [from, to), always split by DeviceClass; JSON or text/csv",
    )
    def usage(
        self,
        request: Request[Any, Any, Any],
        ctx: NamedDependency[AppState],
        access: NamedDependency[Access],
        start: Annotated[str, QueryParameter(name="from", description="Window start, RFC 3339.",
                                             schema_extra=TIME_SCHEMA)],
        end: Annotated[str, QueryParameter(name="to", description="Window end (exclusive), RFC 3339.",
                                           schema_extra=TIME_SCHEMA)],
        group_by: Annotated[
            Literal["team", "namespace", "deviceClass", "model", "node", "cluster"],
            QueryParameter(name="groupBy", description="Group rows by this key. Every key but cluster adds "
                           "the device-hours of all clusters unless cluster is given."),
        ] = "team",
        step: Annotated[
            str | None,
            QueryParameter(description="Bucket length for a time series: ISO 8601 duration (PT1H) or seconds."),
        ] = None,
        cluster: ClusterParam = None,
        limit: Annotated[int, QueryParameter(ge=1, le=pagination.MAX_LIMIT, description=LIMIT_DOC)] = 1000,
        page_token: Annotated[str | None, QueryParameter(name="pageToken", description=TOKEN_DOC)] = None,
    ) -> Response[Usage]:
        """Device-hours from ``device_allocations`` intervals clipped exactly to the window; rows per
        group value, DeviceClass and driver (different kinds of device are never summed); ``adminAccess``
        is not billed; a device held by several claims at once is split among their allocations by their
        ``consumedCapacity`` fractions of its capacity when every one states one, else equally (one claim alone
        is billed the whole device, whatever its results state). The team
        (``groupBy=team`` and a team-limited token's filter) is the one after the configuration's
        ``[teams] overrides``, applied to the whole window at query time. With a
        price table in the configuration, priced rows carry ``cost``. ``Accept: text/csv`` returns the
        whole result as CSV with columns group, deviceClass, driver, start, end, deviceHours, cost, currency
        (see :func:`usage_csv`); CSV refused with ``q=0``, or no acceptable type at all, answers JSON. Both carry
        ``Vary: Accept``. A media
        range whose ``q`` is not an RFC 9110 qvalue (0 to 1, three decimals at most) is ignored.

        Nothing after "now" counts (``AppState.clock``). The JSON pages are cut by offset from one result:
        the first page's instant is pinned in ``nextPageToken`` and every later page is computed at it, so
        a window ending in the future pages the same rows however late page 2 is asked for. ``pageToken``
        is checked before the query runs, for CSV as for JSON: a malformed or foreign token is a 422; a
        valid one on a CSV request is ignored (CSV is the whole result, at the current instant).

        Raises:
            Invalid: (422) ``from``/``to`` not RFC 3339 or not in order, a bad ``step`` or ``groupBy``, or
                a ``pageToken`` this API did not issue for these parameters.
        """
        scope = parse_cluster(cluster, ctx)
        t0, t1 = parse_instant(start, "from"), parse_instant(end, "to")
        if not t0 < t1:
            raise Invalid("from must be before to")
        bucket = parse_duration(step, "step", shortest=SHORTEST_STEP)
        query = pagination.fingerprint(
            request.url.path,
            # The parsed values, not their text: one instant or duration written two ways is one query.
            {"from": t0, "to": t1, "groupBy": group_by, "step": bucket, "cluster": scope}
        )
        page = pagination.decode(page_token, query=query)
        # JSON unless the client prefers CSV (q-values; q=0 refuses a type), see negotiate().
        as_csv = negotiate(request.headers.get("accept"), ["application/json", "text/csv"]) == "text/csv"
        now = ctx.clock() if as_csv or page.at is None else parse_instant(page.at, "pageToken")
        body: Any = services.usage(
            ctx.db,
            start=t0,
            end=t1,
            group_by=group_by,
            cluster=scope,
            teams=sorted(access.teams) if access.teams is not None else None,
            step=bucket,
            config=ctx.config,
            now=now,
        )
        if as_csv:
            return Response(usage_csv(body), media_type="text/csv", headers=VARY_ACCEPT)  # type: ignore[arg-type]
        rows = body["rows"]
        assert isinstance(rows, list)
        at = rfc3339(now)  # to the microsecond: page 2 must cut the very same result
        chunk, token = pagination.cut(rows, page=page, limit=limit, at=at, query=query)
        return Response(to_struct({**body, "rows": chunk, "nextPageToken": token}, Usage), headers=VARY_ACCEPT)
