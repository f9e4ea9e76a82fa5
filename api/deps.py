"""Dependencies (``provide_*``) and the parsing of query parameters shared by the controllers."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from litestar import Request
from litestar.params import QueryParameter

from api.limits import DEFAULT_REPORT_SLOTS, REPORT_WAIT_S
from ledger import recorded
from ledger.config import LedgerConfig
from ledger.errors import Busy, Invalid, shorten_repr
from ledger.recorded import parse_query_time
from ledger.store.database import LedgerDatabase

T = TypeVar("T")

ClusterParam = Annotated[
    str | None, QueryParameter(description="Only this cluster; leave the parameter out for every cluster.")
]
"""The ``cluster`` query parameter of every ``/v1`` read; pass it through :func:`parse_cluster`."""

_SPACE_FOR_SIGN = re.compile(r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)? [0-9]")
"""Seconds (and fraction) then a space then a digit: where an offset's ``+`` stood before the query string
was decoded (``+`` means a space there), as in ``2026-01-01T00:00:00 02:00``."""


def wall_clock() -> datetime:
    """The current instant, aware UTC: the API's "now" unless :func:`api.app.create_app` is given a clock."""
    return datetime.now(UTC)


class ReportSlots:
    """Bounds how many whole-fleet reports (``/v1/quotas``, ``/v1/shared``, ``/v1/pending``,
    ``/v1/reports/idle-claims``) one API process computes at once, first come first served.

    Each of them reads every device, allocation and claim at its instant and builds its answer in memory
    (~18 MB at 12,000 devices). Run as sync handlers in Litestar's pool of 40 threads, 30 clients at once made one
    worker hold 30 such working sets (350+ MB, kept by the allocator afterwards) for no gain in speed: the Python
    of one process runs on one core at a time.

    The wait happens on the event loop, before the report takes a thread or a database connection: the thread
    pool stays free for the other endpoints (a wait inside a thread filled the pool, so the wait began only once a
    thread came free, past 40 requests at once, and occupancy and health answers queued behind it). Waiters are
    served in arrival order (``anyio.Semaphore``); one that waits ``wait_s`` gets :class:`ledger.errors.Busy`
    (503). A client that closes its connection while its request waits gives its place up (:class:`ClientGone`):
    abandoned requests, such as those of a client that timed out and asked again, would otherwise each compute a
    report nobody reads, ahead of the clients still waiting. Once its report runs (in a thread, which cannot be
    interrupted) it is computed all the same.
    """

    def __init__(self, count: int = DEFAULT_REPORT_SLOTS, *, wait_s: float = REPORT_WAIT_S) -> None:
        """Args:
            count: reports at once, at least 1.
            wait_s: seconds a request may wait for a slot.

        Raises:
            Invalid: ``count`` is below 1.
        """
        if count < 1:
            raise Invalid(f"report slots: {count}; at least 1")
        self.count = count
        self.wait_s = wait_s
        # Made outside any event loop (create_app runs before uvicorn's loop): anyio binds it on first use.
        self._free = anyio.Semaphore(count)

    @property
    def running(self) -> int:
        """Reports holding a slot now."""
        return self.count - self._free.value

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        return self._free.statistics().tasks_waiting

    async def run(self, compute: Callable[[], T], *, gone: Callable[[], Awaitable[object]] | None = None) -> T:
        """Wait for a slot (at most ``wait_s`` seconds), then run ``compute`` in a worker thread holding it.

        Args:
            compute: the report, run in a worker thread.
            gone: returns once the client has closed its connection (:func:`client_gone`); ``None``: wait whatever
                the client does.

        Returns:
            What ``compute`` returns; what it raises passes unchanged, the slot freed either way.

        Raises:
            Busy: no slot came free within ``wait_s`` seconds (``retry_after_s``: the wait, at least 1 s).
            ClientGone: ``gone`` returned before a slot came free; ``compute`` did not run, no slot is held.
        """
        try:
            with anyio.fail_after(self.wait_s):
                got = await self._acquire(gone)
        except TimeoutError:
            raise Busy(f"this API process is computing as many whole-fleet reports at once as it may ({self.count}, "
                       f"serve --report-slots) and none finished within {self.wait_s:g} s; retry later",
                       retry_after_s=max(1, round(self.wait_s))) from None
        if not got:
            raise ClientGone("the client closed its connection while its report waited for a slot")
        try:
            return await anyio.to_thread.run_sync(compute)
        finally:
            self._free.release()

    async def _acquire(self, gone: Callable[[], Awaitable[object]] | None) -> bool:
        """Take a slot, in arrival order; ``False`` when ``gone`` returned first (then no slot is held)."""
        if gone is None:
            await self._free.acquire()
            return True
        try:
            # A free slot means nobody waits (a release hands the slot straight to the first waiter), so taking it
            # keeps the order, without a task to watch the connection.
            self._free.acquire_nowait()
            return True
        except anyio.WouldBlock:
            pass
        got = False
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                await gone()
                group.cancel_scope.cancel()  # stops the acquire below; anyio's Semaphore then holds no slot for us

            group.start_soon(watch)
            await self._free.acquire()
            got = True
            group.cancel_scope.cancel()  # stops the watch
        return got


class ClientGone(Exception):
    """The client closed its connection while its request waited for a report slot: the report was not computed
    and nobody is left to read an answer (:mod:`api.errors` answers it with status 499, the code proxies such as nginx
    give a request the client closed)."""


def client_gone(request: Request[Any, Any, Any]) -> Callable[[], Awaitable[None]]:
    """A ``gone`` for :meth:`ReportSlots.run`: waits until the ASGI server reports ``http.disconnect`` for
    ``request``, the client having closed its connection.

    Only for requests whose body the handler never reads (the reports are GETs): the messages before the disconnect
    (the request body, empty for a GET) are read and dropped.
    """

    async def wait() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return wait


@dataclass(frozen=True, slots=True)
class AppState:
    """What the app was created with: the ledger database, the configuration, the cluster filter, the
    clock that says when "now" is (aware UTC; tests pass a fake one), and the report slots."""

    db: LedgerDatabase
    config: LedgerConfig
    cluster: str | None
    reports: ReportSlots
    clock: Callable[[], datetime] = wall_clock


def provide_state(request: Request[Any, Any, Any]) -> AppState:
    """Dependency: the :class:`AppState` stored on the application."""
    state: AppState = request.app.state.ledger
    return state


def parse_cluster(value: str | None, ctx: AppState) -> str | None:
    """The cluster a request asks about: ``value`` (``None``: every cluster), or the one the app was created for.

    An app created for one cluster (``serve --cluster``) answers for that cluster only: a request that leaves
    ``cluster`` out gets it, and one that names another is refused, so a deployment for one cluster never shows
    another's rows. An empty ``?cluster=`` never gets here: the ``/v1`` guard
    (:func:`api.parameters.known_query_parameters`) answers every parameter given empty with a 422.

    Raises:
        Invalid: ``value`` names another cluster than the app's (the value echoed at most 100 characters long).
    """
    if ctx.cluster is None:
        return value
    if value is not None and value != ctx.cluster:
        raise Invalid(f"cluster: this API answers for cluster {shorten_repr(ctx.cluster)} only (serve --cluster), "
                      f"not {shorten_repr(value)}; leave cluster out")
    return ctx.cluster


def parse_instant(value: str | None, name: str, default: datetime | None = None) -> datetime:
    """Parse an RFC 3339 query parameter (with a zone) into aware UTC; ``default`` (else now) when absent.

    Raises:
        Invalid: not RFC 3339, no zone, or beyond year 9998 (the value echoed at most 100 characters
            long). When a space stands where the offset's sign
            would be, the message adds that ``+`` must be sent as ``%2B`` (an unencoded ``+`` in a query
            string arrives as a space).
    """
    if value is None:
        return default or datetime.now(UTC)
    try:
        return parse_query_time(value)
    except (Invalid, OverflowError, ValueError) as e:
        hint = ""
        if _SPACE_FOR_SIGN.search(value):
            hint = "; a '+' in a URL query means a space: send the offset's '+' as %2B"
        raise Invalid(f"{name}: {e}{hint}") from e


def asked_instant(at: str | None) -> datetime | None:
    """The ``at`` query parameter as an aware UTC instant, ``None`` when absent (the answer is then for now).

    Paged lists put this, not the text of ``at``, in their query fingerprint, so that one instant written two ways
    (``2026-01-01T01:00:00+01:00`` and ``2026-01-01T00:00:00Z``) is one query and its ``pageToken`` is accepted.

    Raises:
        Invalid: a bad ``at`` (see :func:`parse_instant`).
    """
    return parse_instant(at, "at") if at is not None else None


def page_instant(page_at: str | None, asked: datetime | None, *, name: str = "at") -> datetime:
    """The instant a paged answer is for: the one the first page answered for, as its ``pageToken`` carries it (so
    that an instant left to default, now, stays put from page to page), else ``asked`` (:func:`asked_instant`; a
    timeline's ``to``), else now; aware UTC.

    Raises:
        Invalid: ``asked`` given and the token carrying another instant (a token edited, or issued for another
            ``name``): the token belongs to another list, as for any other parameter changed.
    """
    if page_at is None:
        return asked or datetime.now(UTC)
    carried = parse_instant(page_at, "pageToken")
    if asked is not None and asked != carried:
        raise Invalid(f"pageToken was issued for another {name}; leave pageToken out to ask for the first page")
    return carried


def parse_duration(value: str | None, name: str, *, shortest: timedelta = timedelta(0)) -> timedelta | None:
    """Parse an ISO 8601 duration (``PT30M``) or a number of seconds; ``None`` when absent.

    ``shortest`` is the shortest accepted (0; :data:`ledger.recorded.SHORTEST_STEP` for ``step``).

    Raises:
        Invalid: see :func:`ledger.recorded.parse_duration`.
    """
    return None if value is None else recorded.parse_duration(value, name, shortest=shortest)
