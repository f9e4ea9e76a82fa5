"""List and watch one kind through kubernetes-asyncio, as raw JSON (what the API server sent).

The generated API methods are called with ``_preload_content=False`` so nothing is decoded into
models: kubernetes-asyncio 36 looks up a model ``V1ResourceClaim`` that does not exist when it
decodes a ResourceClaim watch, and models would drop fields the ledger does not know yet. The
translator sees exactly the API server's bytes, parsed as JSON.

Failures are sorted for the watch loop (STYLE, error handling): :class:`WatchExpired` (410, as a
status or an in-stream ERROR) means list again at once; :class:`TransientApiError` (connection
refused/reset, stream cut, timeouts, 429, 5xx) means back off; :class:`ApiError` is anything else
and fails the task loudly. A whole line of a watch stream that is no watch event (not UTF-8, not JSON,
JSON without ``type``, with an unknown one, without ``object`` or with an ``object`` that is not a JSON
object, an ``ERROR`` without a Status) is no failure: it becomes a :class:`MalformedEvent` in its burst,
which the ledger stores as a rejected observation, and the stream is read on. A line is whole when the
server's newline ended it; bytes left after the last newline when the stream ends were cut, and that
is a broken connection (:meth:`KubeSource.watch` says why).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias, TypedDict, cast

import aiohttp
from kubernetes_asyncio import client as k8s

from ledger.recorded import envelope_problem, error_status_problem, json_problem
from ledger.types import JSONObject, JSONValue
from workers.k8s.kinds import DRA_GROUP, KindInfo

log = logging.getLogger(__name__)

Clock = Callable[[], Awaitable[datetime]]
"""Receive-time source: tz-aware UTC ``now`` (async so that a test clock may live in another process)."""

EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


class RawWatchEvent(TypedDict):
    """One line of a watch stream: ``{"type": ..., "object": {...}}`` (an ERROR carries a Status)."""

    type: str
    object: dict[str, JSONValue]


class RawListMeta(TypedDict, total=False):
    """``metadata`` of a List response."""

    resourceVersion: str
    # ``continue`` is a Python keyword: read with .get("continue").


class RawList(TypedDict, total=False):
    """A List response (``XxxList``): items usually lack ``kind``/``apiVersion``."""

    apiVersion: str
    kind: str
    metadata: RawListMeta
    items: list[dict[str, JSONValue]]


class ApiError(Exception):
    """The API server refused a request in a way that retrying will not fix (or an unknown answer)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class WatchExpired(ApiError):
    """410 Gone: the resourceVersion is too old (compacted); list again."""


class TransientApiError(ApiError):
    """A fault that passes: connection refused/reset, stream cut, timeout, 429 or 5xx."""

    def __init__(self, message: str, *, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after_s = retry_after_s


class NotServed(ApiError):
    """404: the server does not serve this group/version/resource."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchEvent:
    """One decoded watch event with its receive time."""

    type: EventType
    object: JSONObject
    """As sent; ``kind``/``apiVersion`` filled in when the server left them out."""
    resource_version: str | None
    """``object.metadata.resourceVersion`` (for a BOOKMARK, the only field that matters)."""
    received_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class MalformedEvent:
    """A whole line of a watch stream that is no watch event, with its receive time.

    Source: the API server (or a proxy before it) sent it between two events, ended by its newline: bytes
    that are not UTF-8, text that is not JSON (an event cut short, ``garbage``), JSON that is no watch
    event, or an ``ERROR`` whose object is no Status. The events around it are read as usual. It carries
    no resourceVersion: nothing in it is trusted.
    """

    text: str
    """The line as received, without its line end (``\n`` or ``\r\n``; bytes that are not UTF-8 replaced by U+FFFD)."""
    reason: str
    """What is wrong, as a replay of the same line says it where it can: ``not UTF-8: invalid start byte at
    byte 0``, ``invalid JSON: Expecting value (column 1)`` (``ledger.recorded.json_problem``),
    ``missing field 'type'`` (``envelope_problem``), ``type: ERROR without a Status: ...``
    (``error_status_problem``)."""
    received_at: datetime


Received: TypeAlias = WatchEvent | MalformedEvent
"""One line of a watch burst, in stream order: an event, or a line that is none."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ListPage:
    """One page of a list of one kind (at most the ``limit`` asked, 500 objects by default)."""

    items: list[JSONValue]
    """This page's objects, ``kind`` and ``apiVersion`` set, in server order; an item that is no JSON object (a
    server or proxy fault) as it came, in its place."""
    offset: int
    """Objects on the earlier pages of the same list (0 on the first page)."""
    resource_version: str
    """``metadata.resourceVersion`` of the list's FIRST page (a consistent snapshot): watch from here."""
    received_at: datetime
    """When the list's first page was received (the clock's time)."""
    last: bool
    """True on the last page (the server sent no ``continue`` token)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Listed:
    """What a sink stored of a complete list (every page): no objects, only the totals."""

    count: int
    """Objects in the list (every page)."""
    resource_version: str
    """``metadata.resourceVersion`` of the list's first page: watch from here."""


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _json_media(resp: aiohttp.ClientResponse) -> bool:
    """Whether ``resp`` is JSON (``application/json``, ``application/*+json``; parameters such as
    ``;stream=watch`` ignored: aiohttp's ``content_type`` is the lower-cased media type alone). No
    Content-Type at all counts as JSON (aiohttp would report ``application/octet-stream``): the lines are
    judged one by one."""
    if "Content-Type" not in resp.headers:
        return True
    media = resp.content_type
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _status_error(status: int, body: bytes, headers: Mapping[str, str], what: str) -> ApiError:
    try:
        decoded = json.loads(body) if body else {}
        message = str(decoded.get("message", "")) if isinstance(decoded, dict) else ""
    except ValueError:
        message = body[:200].decode("utf-8", "replace")
    text = f"{what}: HTTP {status} {message}".strip()
    if status == 410:
        return WatchExpired(text, status=status)
    if status == 429 or status >= 500:
        return TransientApiError(text, status=status, retry_after_s=_retry_after(headers))
    if status == 404:
        return NotServed(text, status=status)
    return ApiError(text, status=status)


def api_for(api_client: k8s.ApiClient, group: str, version: str) -> Any:
    """The kubernetes-asyncio API class instance serving ``group``/``version`` (CoreV1Api, ResourceV1Api, ...)."""
    name = "CoreV1Api" if not group else f"Resource{version.capitalize()}Api"
    return getattr(k8s, name)(api_client)


async def served_versions(api_client: k8s.ApiClient, group: str = DRA_GROUP, *,
                          timeout_s: float = 30.0) -> list[str]:
    """Versions of ``group`` the server serves (``GET /apis`` discovery), e.g. ``["v1", "v1beta2"]``.

    Raises:
        TransientApiError: connection problems, 429 or 5xx.
        ApiError: any other refusal.
    """
    call = k8s.ApisApi(api_client).get_api_versions(_preload_content=False, _request_timeout=timeout_s)
    body = await get_json(cast(Awaitable[aiohttp.ClientResponse], call), "GET /apis")
    groups = body.get("groups")
    for g in groups if isinstance(groups, list) else []:
        if isinstance(g, dict) and g.get("name") == group:
            versions = g.get("versions")
            return [str(v.get("version")) for v in (versions if isinstance(versions, list) else [])
                    if isinstance(v, dict)]
    return []


async def served_resources(api_client: k8s.ApiClient, group: str, version: str, *,
                           timeout_s: float = 30.0) -> list[str]:
    """Resource names (plurals, no subresources) that ``group``/``version`` serves: ``GET /apis/<group>/<version>``.

    Why: a group version may be served without every kind in it (``resource.k8s.io/v1beta2`` has no
    DeviceTaintRule before Kubernetes 1.36), so an optional kind is looked up here before it is watched.

    Returns:
        E.g. ``["deviceclasses", "devicetaintrules", "resourceclaims"]`` in the server's order; ``[]`` when
        the group version is not served (404).

    Raises:
        TransientApiError: connection problems, 429 or 5xx.
        ApiError: any other refusal.
    """
    call = api_for(api_client, group, version).get_api_resources(_preload_content=False, _request_timeout=timeout_s)
    try:
        body = await get_json(cast(Awaitable[aiohttp.ClientResponse], call), f"GET /apis/{group}/{version}")
    except NotServed:
        return []
    resources = body.get("resources")
    return [str(r["name"]) for r in (resources if isinstance(resources, list) else [])
            if isinstance(r, dict) and isinstance(r.get("name"), str) and "/" not in str(r["name"])]


async def get_json(call: Awaitable[aiohttp.ClientResponse], what: str) -> dict[str, JSONValue]:
    """Await a kubernetes-asyncio call made with ``_preload_content=False`` and decode its JSON object body.

    Args:
        call: the pending request; ``what`` names it in error messages (``list pods.v1``).

    Raises:
        WatchExpired: HTTP 410.
        TransientApiError: connection problems, timeouts, 429, 5xx, a body that is not a JSON object.
        NotServed: HTTP 404.
        ApiError: any other non-2xx answer.
    """
    try:
        resp = await call
        async with resp:
            body = await resp.read()
            if not 200 <= resp.status <= 299:
                raise _status_error(resp.status, body, resp.headers, what)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise TransientApiError(f"{what}: {type(e).__name__}: {e}") from e
    try:
        decoded = json.loads(body)
    except ValueError as e:
        raise TransientApiError(f"{what}: response is not JSON: {e}") from e
    if not isinstance(decoded, dict):
        raise TransientApiError(f"{what}: response is not a JSON object")
    return cast(dict[str, JSONValue], decoded)


def list_shape(body: dict[str, JSONValue], what: str) -> dict[str, JSONValue]:
    """``body`` when it has the shape of a List (``metadata`` a mapping whose ``resourceVersion`` and ``continue`` are
    strings when present, ``items`` a list or null), the shape :meth:`KubeSource.pages` reads.

    Why: an API server answers a List in this shape; anything else (a proxy's or a broken server's JSON) ended the
    worker in an ``AttributeError`` or ``TypeError`` traceback, or stored a mapping as the resourceVersion
    checkpoint. It is treated as a non-JSON body is: a transient fault, retried with backoff.

    Raises:
        TransientApiError: the body is not shaped as a List; the message names the first field that is not.
    """
    meta = body.get("metadata", {})
    if not isinstance(meta, dict):
        raise TransientApiError(f"{what}: response is no List: metadata is {type(meta).__name__}, not an object")
    for name in ("resourceVersion", "continue"):
        if name in meta and meta[name] is not None and not isinstance(meta[name], str):
            raise TransientApiError(f"{what}: response is no List: metadata.{name} is {type(meta[name]).__name__}, "
                                    "not a string")
    items = body.get("items")
    if items is not None and not isinstance(items, list):
        raise TransientApiError(f"{what}: response is no List: items is {type(items).__name__}, not an array")
    return body


class KubeSource:
    """List and watch one kind in one served version, all namespaces, returning raw JSON objects.

    Args:
        api_client: a configured kubernetes-asyncio client.
        info: the kind (its kubernetes-asyncio list method and plural).
        version: the served version to use, e.g. ``v1beta2``.
        clock: receive-time source; read once per list and once per watch event.
        request_timeout_s: timeout of a list page, and of silence on a watch beyond its
            ``timeoutSeconds``, s.
        page_size: ``limit`` of each list page (objects).
    """

    def __init__(self, api_client: k8s.ApiClient, info: KindInfo, version: str, *, clock: Clock,
                 request_timeout_s: float = 60.0, page_size: int = 500) -> None:
        self.info = info
        self.version = version
        self.api_version = info.api_version(version)
        self._list = getattr(api_for(api_client, info.group, version), info.list_method)
        self._clock = clock
        self._timeout_s = request_timeout_s
        self._page_size = page_size

    def _complete(self, obj: dict[str, JSONValue]) -> JSONObject:
        # List items (and some proxies' watch objects) omit kind/apiVersion; the translator needs them.
        if "kind" not in obj or "apiVersion" not in obj:
            obj = {"apiVersion": self.api_version, "kind": self.info.kind, **obj}
        return obj

    async def pages(self) -> AsyncIterator[ListPage]:
        """List every object of the kind, yielding each page (``limit``/``continue``) as it arrives.

        The next page is requested only when the consumer asks for it, so a consumer that drops each
        page holds one page at a time: a worker that kept whole lists of 106,019 claims and 120,038
        pods as decoded objects peaked at 1,320 MiB (see ``services.record_relist_page``).

        Yields:
            Pages in server order; ``offset`` counts the objects of the pages before. A list with no
            objects yields one empty page (with ``last`` set).

        Raises:
            WatchExpired: a ``continue`` token expired (410) mid-way: list again (the pages yielded
                before were real states, but the list is incomplete).
            TransientApiError / NotServed / ApiError: see the module docstring.
        """
        token: str | None = None
        version: str | None = None
        received_at: datetime | None = None
        offset = 0
        what = f"list {self.info.plural}.{self.api_version}"
        while True:
            kwargs: dict[str, object] = {"limit": self._page_size, "_preload_content": False,
                                         "_request_timeout": self._timeout_s}
            if token:
                kwargs["_continue"] = token
            body = cast(RawList, list_shape(await get_json(self._list(**kwargs), what), what))
            if received_at is None:
                received_at = await self._clock()
            meta = body.get("metadata", {})
            if version is None:
                version = str(meta.get("resourceVersion", ""))
            # An item that is no object is kept as it came: the sink stores it as rejected in its place.
            # (RawList types its items as objects, which a faulty server does not guarantee.)
            raw: list[JSONValue] = cast(list[JSONValue], body.get("items") or [])
            items: list[JSONValue] = [self._complete(item) if isinstance(item, dict) else item for item in raw]
            del body  # the raw page goes now: only ``items`` is kept
            next_token = cast(Mapping[str, object], meta).get("continue")
            last = not isinstance(next_token, str) or not next_token
            yield ListPage(items=items, offset=offset, resource_version=version, received_at=received_at,
                           last=last)
            offset += len(items)
            del items  # drop this page before the next is fetched: one page alive at a time
            if last:
                break
            token = cast(str, next_token)
        log.info("listed %s", self.info.kind, extra={"resource": self.info.plural, "resourceVersion": version,
                                                     "items": offset})

    async def watch(self, *, since: str, timeout_s: int,
                    batch_size: int = 500) -> AsyncIterator[builtins.list[Received]]:
        """Watch from resourceVersion ``since`` with bookmarks, until the server ends the stream.

        Yields bursts: the events whose lines arrived in one network read (at most ``batch_size``
        each), in stream order, each stamped with the clock when its line was complete. A line cut
        by a dropped connection is never yielded; the server's ``timeoutSeconds`` end is a normal end.
        A whole line that is no watch event (not UTF-8, not JSON, JSON but no event, an ERROR without a
        Status) is yielded in its place as a :class:`MalformedEvent`, and the stream is read on.

        Raises:
            WatchExpired: HTTP 410, or an in-stream ERROR Status with code 410.
            TransientApiError: connection problems, a stream cut (ended inside a line), 429/5xx, a 2xx
                whose Content-Type is not JSON (a proxy's page), an in-stream ERROR Status with a 5xx code or
                none.
            ApiError: any other refusal or in-stream ERROR Status.
        """
        what = f"watch {self.info.plural}.{self.api_version} from {since}"
        try:
            resp: aiohttp.ClientResponse = await self._list(
                watch=True, resource_version=since, allow_watch_bookmarks=True, timeout_seconds=timeout_s,
                _preload_content=False, _request_timeout=(self._timeout_s, timeout_s + self._timeout_s))
            async with resp:
                if not 200 <= resp.status <= 299:
                    raise _status_error(resp.status, await resp.read(), resp.headers, what)
                if not _json_media(resp):
                    # A 2xx that is not JSON is no watch stream: a proxy's login or error page, say. Read as
                    # a stream, each of its lines would be stored as a rejected observation and, as such a
                    # page ends at once, the loop would watch again and store them again, with no pause.
                    # Backing off as from a 5xx stores nothing and says what came instead.
                    raise TransientApiError(f"{what}: answered Content-Type "
                                            f"{resp.headers.get('Content-Type')!r}, not a JSON watch stream")
                # Broken line or broken connection? A line is complete once its newline arrived: the
                # server wrote that line whole, and whatever it holds (garbage, an event cut short, not
                # UTF-8) is what the server or a proxy before it sent, so it is a broken line: stored as
                # rejected by the sink, and the next line is read (watching again from before it would
                # only meet it again). Bytes with no newline after them are a line still arriving; if the
                # stream ends there (the server died mid-write, a proxy cut it), the connection broke,
                # and that stays a transient fault below (as do HTTP errors and aiohttp's payload
                # errors): nothing after the last complete line was stored, so watching again from the
                # last stored resourceVersion loses and duplicates nothing.
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    burst: builtins.list[Received] = []
                    while (end := buffer.find(b"\n")) != -1:
                        line, buffer = buffer[:end], buffer[end + 1:]
                        if line.strip():
                            try:
                                burst.append(await self._event(line, what))
                            except ApiError:
                                if burst:
                                    yield burst  # what came before the ERROR is still good
                                raise
                        if len(burst) >= batch_size:
                            yield burst
                            burst = []
                    if burst:
                        yield burst
                if buffer.strip():
                    # A stream that ends on a partial line was cut: do not trust what we have.
                    raise TransientApiError(f"{what}: stream ended inside an event ({len(buffer)} bytes)")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TransientApiError(f"{what}: {type(e).__name__}: {e}") from e

    async def _event(self, line: bytes, what: str) -> Received:
        """Decode one complete line (its newline removed) of the stream ``what`` names.

        A line that is no watch event is no failure of the stream (see :meth:`watch`): it comes back as a
        :class:`MalformedEvent` whose reason is the one a replay of the line gives where it can.

        Raises:
            WatchExpired / TransientApiError / ApiError: an in-stream ERROR carrying a Status, by its code.
        """
        try:
            # Decoded here, not by json.loads (which would also take UTF-16 and UTF-32): a replay reads
            # the same line as UTF-8 and reports it the same way.
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            return await self._malformed(line, f"not UTF-8: {e.reason} at byte {e.start}")
        try:
            decoded: object = json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the decoder goes
            return await self._malformed(line, json_problem(e))
        if isinstance(decoded, dict) and decoded.get("type") == "ERROR":
            if (problem := error_status_problem(decoded)) is not None:
                # Not the API server's ERROR (it always sends a Status): nothing says the watch ended
                # or why. Read on; if the stream does end here, the loop simply watches again.
                return await self._malformed(line, problem)
            status_obj = cast(dict[str, JSONValue], decoded["object"])
            code = status_obj.get("code")
            status = code if isinstance(code, int) and not isinstance(code, bool) else 500
            raise _status_error(status, json.dumps(status_obj).encode(), {}, f"{what}: in-stream ERROR") from None
        if (problem := envelope_problem(decoded)) is not None:
            return await self._malformed(line, problem)
        raw = cast(RawWatchEvent, decoded)
        obj = raw["object"]
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return WatchEvent(type=cast(EventType, raw["type"]), object=self._complete(obj),
                          resource_version=rv if isinstance(rv, str) else None, received_at=await self._clock())

    async def _malformed(self, line: bytes, reason: str) -> MalformedEvent:
        # No failure of the stream: the lines around it are good events, and watching again from
        # before it could only meet it again. The sink stores it as a rejected observation.
        return MalformedEvent(text=line.rstrip(b"\r").decode("utf-8", "replace"), reason=reason,
                              received_at=await self._clock())


async def wait_closed(api_client: k8s.ApiClient) -> None:
    """Close the client's connection pool (kubernetes-asyncio ``ApiClient.close``)."""
    await api_client.close()
    await asyncio.sleep(0)
