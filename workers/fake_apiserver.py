"""A fake Kubernetes API server that plays a recorded history (DESIGN §9) to list/watch clients.

For tests and demos: the real kubernetes-asyncio client talks HTTP to it exactly as to a cluster.
It serves list and watch for Namespace, Pod (core/v1), DeviceClass, ResourceSlice, ResourceClaim and
DeviceTaintRule (``resource.k8s.io``, in the versions it is told to serve that have the kind: DeviceTaintRule
only in ``v1beta2`` and ``v1alpha3``), discovery (``/api``, ``/apis``, ``/apis/resource.k8s.io/<version>``) and
``coordination.k8s.io/v1`` Leases (get/create/update with resourceVersion conflicts), and honours
``resourceVersion``, ``allowWatchBookmarks``, ``timeoutSeconds``, ``limit``/``continue``.

Time is simulated. Nothing has happened until the history is played forward, by
:meth:`FakeApiServer.advance` (or ``POST /fake/advance``) or in real time at a speed: each released
line sets the server's clock to its ``observedAt`` and becomes a watch event with its own
resourceVersion (the history's, or the next integer when the history's are not increasing). A
client that stamps receive times from :meth:`FakeApiServer.now` (or ``GET /fake/clock``) records the
history's exact ``observedAt``, which is what makes a live follow comparable with a replay.

Faults, one-shot and in order (:class:`Fault`, ``POST /fake/faults``): answer a list or watch with a
status (410, 429 with ``Retry-After``, 500..., or an HTML page in place of the answer), drop a watch
stream after N events (optionally in the middle of a line), end it with an in-stream ``ERROR`` 410, or
send a line of its text as is after N events and go on (a malformed event); :meth:`FakeApiServer.expire`
compacts, so every older resourceVersion answers 410 as an etcd compaction does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Literal, TypeGuard, get_args

import aiohttp
from aiohttp import web

from ledger.errors import Invalid, shorten_repr
from ledger.recorded import BrokenLine, WatchLine, parse_time
from ledger.types import JSONObject, JSONValue
from workers.k8s.kinds import BY_KIND, BY_PLURAL, DRA_GROUP, DRA_VERSIONS

log = logging.getLogger(__name__)
_Send = Callable[[str, JSONObject], Awaitable[None]]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

DEFAULT_WATCH_TIMEOUT_S = 1800
"""Watch length when the client asks no ``timeoutSeconds``, s (kube-apiserver picks 30-60 minutes)."""

FaultAction = Literal["status", "drop", "expire", "line"]
FaultVerb = Literal["list", "watch", "get", "update", "create"]
FAULT_KINDS: tuple[str, ...] = (*BY_KIND, "Lease")
"""The kinds a fault may name: those served, and Lease."""


def _refuse(name: str, expected: str, value: object) -> ValueError:
    return ValueError(f"{name} must be {expected}; got {shorten_repr(value)}")


@dataclass(slots=True, kw_only=True)
class Fault:
    """One injected fault; matching requests consume it (``times`` of them), in injection order."""

    action: FaultAction
    """``status``: answer the request with HTTP ``status``; ``drop``: cut a watch stream after
    ``after_events`` events; ``expire``: send an in-stream ERROR 410 after ``after_events`` events;
    ``line``: send ``line`` as one more line of a watch stream after ``after_events`` events, then go on."""
    status: int = 500
    retry_after_s: int | None = None
    """``Retry-After`` header of a ``status`` answer, s."""
    kind: str | None = None
    """Only requests for this kind (``Lease`` included); ``None``: any."""
    verb: FaultVerb | None = None
    after_events: int = 0
    """Events sent in the stream before a ``drop``/``expire`` fires."""
    partial: bool = False
    """A ``drop`` first sends half of the next event's line."""
    line: str = ""
    """What a ``line`` fault sends, as is, followed by a newline: any text without one (a JSON text, an
    event cut short, ``garbage``), encoded as UTF-8; lone surrogates U+DC80..U+DCFF stand for the bytes
    0x80..0xFF (Python's ``surrogateescape``), so ``"\\udcff{}"`` sends a line that is not UTF-8."""
    page: str | None = None
    """A ``status`` answer's body as is, with Content-Type ``text/html`` (a proxy's login or error page),
    instead of a JSON Status; with ``status`` 200 it stands in for a watch or list answer."""
    times: int = 1

    @classmethod
    def from_json(cls, body: JSONValue) -> Fault:
        """A fault from its JSON form (``POST /fake/faults``): an object of the fields above, by name; only
        ``action`` is required. Checked here, so that no fault that would fail the request it meets is queued.

        Raises:
            ValueError: ``body`` is not an object, has an unknown field, or a field of the wrong type or out of
                range: ``status`` 200..599, ``retry_after_s`` and ``after_events`` 0 or more, ``times`` 1 or more,
                ``kind`` one of :data:`FAULT_KINDS`, ``line`` a single line encodable as UTF-8 (see ``line``).
                The message names the field and what it accepts.
        """
        if not isinstance(body, dict):
            raise ValueError(f"must be a JSON object; got {shorten_repr(body)}")
        names = [f.name for f in fields(cls)]
        if unknown := [k for k in body if k not in names]:
            raise ValueError(f"unknown field {', '.join(map(repr, unknown))}; the fields are {', '.join(names)}")
        action, verb, kind = body.get("action"), body.get("verb"), body.get("kind")
        if action not in get_args(FaultAction):
            raise _refuse("action", f"one of {', '.join(get_args(FaultAction))}", action)
        if verb is not None and verb not in get_args(FaultVerb):
            raise _refuse("verb", f"null or one of {', '.join(get_args(FaultVerb))}", verb)
        if kind is not None and kind not in FAULT_KINDS:
            raise _refuse("kind", f"null or one of {', '.join(FAULT_KINDS)}", kind)
        status = body.get("status", 500)
        if not _is_int(status) or not 200 <= status <= 599:  # aiohttp refuses a status outside 100..999
            raise _refuse("status", "an HTTP status code, an integer from 200 to 599", status)
        retry_after_s, after_events, times = (body.get("retry_after_s"), body.get("after_events", 0),
                                              body.get("times", 1))
        if retry_after_s is not None and (not _is_int(retry_after_s) or retry_after_s < 0):
            raise _refuse("retry_after_s", "null or an integer, 0 or more (seconds)", retry_after_s)
        if not _is_int(after_events) or after_events < 0:
            raise _refuse("after_events", "an integer, 0 or more", after_events)
        if not _is_int(times) or times < 1:
            raise _refuse("times", "an integer, 1 or more", times)
        partial, line, page = body.get("partial", False), body.get("line", ""), body.get("page")
        if not isinstance(partial, bool):
            raise _refuse("partial", "true or false", partial)
        if not isinstance(line, str):
            raise _refuse("line", "a string", line)
        if "\n" in line:
            raise _refuse("line", "a single line (no newline; one is sent after it)", line)
        try:
            line.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise _refuse("line", "encodable as UTF-8 (lone surrogates only U+DC80..U+DCFF)", line) from None
        if page is not None and not isinstance(page, str):
            raise _refuse("page", "null or a string", page)
        # The checks above narrow each field to its declared type; mypy cannot follow them through get_args
        # and negated guards.
        return cls(action=action, verb=verb, kind=kind, retry_after_s=retry_after_s,  # type: ignore[arg-type]
                   status=status, after_events=after_events, times=times, partial=partial, line=line, page=page)


@dataclass(frozen=True, slots=True, kw_only=True)
class Released:
    """One history line played forward."""

    kind: str
    type: str
    resource_version: str
    observed_at: datetime
    namespace: str | None
    name: str | None


@dataclass(slots=True)
class _Entry:
    rv: int
    type: str
    object: JSONObject


@dataclass(slots=True)
class _Kind:
    objects: dict[tuple[str, str], JSONObject] = field(default_factory=dict)
    log: list[_Entry] = field(default_factory=list)


def _status(code: int, message: str, reason: str) -> JSONObject:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 410: "Expired",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


def _meta(obj: Mapping[str, JSONValue]) -> dict[str, JSONValue]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def to_version(obj: JSONObject, version: str) -> JSONObject:
    """Serve a ``resource.k8s.io/v1`` object in ``version`` (v1beta2: relabelled; v1beta1: devices in
    ``basic``, single-choice request fields flat): the inverse of the translator's normalisation."""
    api = obj.get("apiVersion")
    if not isinstance(api, str) or not api.startswith(DRA_GROUP + "/") or api == f"{DRA_GROUP}/{version}":
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{DRA_GROUP}/{version}"
    if version != "v1beta1" or api != f"{DRA_GROUP}/v1":
        return out
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    devices = spec.get("devices")
    if out.get("kind") == "ResourceSlice" and isinstance(devices, list):
        basic: list[JSONValue] = []
        for d in devices:
            basic.append({"name": d.get("name"), "basic": {k: v for k, v in d.items() if k != "name"}}
                         if isinstance(d, dict) else d)
        spec["devices"] = basic
    requests = devices.get("requests") if isinstance(devices, dict) else None
    if out.get("kind") == "ResourceClaim" and isinstance(devices, dict) and isinstance(requests, list):
        flat: list[JSONValue] = []
        for r in requests:
            exactly = r.get("exactly") if isinstance(r, dict) else None
            flat.append({"name": r.get("name"), **exactly} if isinstance(r, dict) and isinstance(exactly, dict) else r)
        devices["requests"] = flat
    return out


class FakeApiServer:
    """The fake API server; use as ``async with FakeApiServer(lines) as server:`` (listens on 127.0.0.1)."""

    def __init__(self, history: Iterable[WatchLine | BrokenLine], *,
                 served: Mapping[str, Sequence[str]] | None = None) -> None:
        self._pending = [x for x in history if isinstance(x, WatchLine)]
        self._next = 0
        self.served: dict[str, list[str]] = {DRA_GROUP: list(DRA_VERSIONS), **{k: list(v) for k, v in
                                                                                (served or {}).items()}}
        first = next((x.observed_at for x in self._pending if x.observed_at), None)
        self.clock: datetime = first or datetime(1970, 1, 1, tzinfo=UTC)
        self._rv = min((_int(_meta(x.object).get("resourceVersion")) or 1 for x in self._pending), default=1) - 1
        self._compacted = 0
        self._kinds: dict[str, _Kind] = {k: _Kind() for k in BY_KIND}
        self._changed = asyncio.Condition()
        self.faults: list[Fault] = []
        self.requests: list[str] = []
        """``METHOD path?query`` of every request, in order (for assertions)."""
        self._leases: dict[tuple[str, str], JSONObject] = {}
        self._lease_rv = itertools.count(1)
        self._snapshots: dict[int, tuple[str, list[JSONObject]]] = {}
        self._snapshot_ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing = False
        self._player: asyncio.Task[None] | None = None
        self.url = ""

    # --- simulated time --------------------------------------------------------------------------

    async def now(self) -> datetime:
        """The simulated clock (a :data:`workers.k8s.client.Clock`): ``observedAt`` of the last line played."""
        return self.clock

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion (what a list answers now)."""
        return str(self._rv)

    @property
    def remaining(self) -> int:
        """History lines not played yet."""
        return len(self._pending) - self._next

    def peek(self) -> WatchLine | None:
        """The next history line to be played, if any."""
        return self._pending[self._next] if self._next < len(self._pending) else None

    def advance(self, count: int | None = 1, *, until: datetime | None = None) -> list[Released]:
        """Play history lines forward: ``count`` lines, or (with ``until``) all observed at or before it.

        BOOKMARK lines send a bookmark to watchers of their kind. Watchers are woken at once.

        Returns:
            What was played, in order.
        """
        played: list[Released] = []
        while self._next < len(self._pending):
            line = self._pending[self._next]
            if until is not None:
                if line.observed_at is not None and line.observed_at > until:
                    break
            elif count is not None and len(played) >= count:
                break
            self._next += 1
            played.append(self._apply(line))
        if until is not None and until > self.clock:
            self.clock = until
        self._wake()
        return played

    def _apply(self, line: WatchLine) -> Released:
        if line.observed_at is not None:
            self.clock = line.observed_at
        obj = copy.deepcopy(line.object)
        kind = str(obj.get("kind"))
        store = self._kinds.setdefault(kind, _Kind())
        meta = _meta(obj)
        if line.type == "BOOKMARK":
            store.log.append(_Entry(rv=self._rv, type="BOOKMARK", object={
                "kind": kind, "apiVersion": obj.get("apiVersion"), "metadata": {"resourceVersion": str(self._rv)}}))
            return Released(kind=kind, type="BOOKMARK", resource_version=str(self._rv), observed_at=self.clock,
                            namespace=None, name=None)
        rv = _int(meta.get("resourceVersion"))
        if rv is None or rv <= self._rv:
            rv = self._rv + 1
            obj["metadata"] = {**meta, "resourceVersion": str(rv)}
        self._rv = rv
        namespace, name = meta.get("namespace"), meta.get("name")
        key = (str(namespace or ""), str(name))
        if line.type == "DELETED":
            store.objects.pop(key, None)
        else:
            store.objects[key] = obj
        store.log.append(_Entry(rv=rv, type=line.type, object=obj))
        return Released(kind=kind, type=line.type, resource_version=str(rv), observed_at=self.clock,
                        namespace=namespace if isinstance(namespace, str) else None,
                        name=name if isinstance(name, str) else None)

    def _wake(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()
        asyncio.ensure_future(notify())  # noqa: RUF006 - fire and forget; the condition outlives it

    def expire(self) -> None:
        """Compact: every resourceVersion older than the newest answers 410 from now on."""
        self._compacted = self._rv
        self._snapshots.clear()

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each fires on the next matching request(s)."""
        self.faults.extend(faults)

    async def play(self, *, speed: float) -> None:
        """Play the whole history in simulated real time, ``speed`` times faster (0 = all at once)."""
        while (line := self.peek()) is not None:
            if speed > 0 and line.observed_at is not None and line.observed_at > self.clock:
                await asyncio.sleep((line.observed_at - self.clock).total_seconds() / speed)
            self.advance(1)

    # --- faults ------------------------------------------------------------------------------------

    def _take(self, kind: str, verb: str, *, actions: Sequence[str], sent: int = 0) -> Fault | None:
        for fault in self.faults:
            if fault.action not in actions or fault.kind not in (None, kind) or fault.verb not in (None, verb):
                continue
            if fault.action != "status" and fault.after_events > sent:
                continue
            fault.times -= 1
            if fault.times <= 0:
                self.faults.remove(fault)
            return fault
        return None

    def _status_fault(self, kind: str, verb: str) -> web.Response | None:
        fault = self._take(kind, verb, actions=("status",))
        if fault is None:
            return None
        headers = {"Retry-After": str(fault.retry_after_s)} if fault.retry_after_s is not None else None
        if fault.page is not None:
            return web.Response(text=fault.page, content_type="text/html", status=fault.status, headers=headers)
        reason = _REASONS.get(fault.status, "Unknown")
        return web.json_response(_status(fault.status, f"injected fault: {reason}", reason), status=fault.status,
                                 headers=headers)

    # --- HTTP --------------------------------------------------------------------------------------

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host``:``port`` (0: a free port); returns and sets :attr:`url`."""
        app = web.Application(middlewares=[self._log_request])
        r = app.router
        for prefix in ("/api", "/api/"):
            r.add_get(prefix, self._core_versions)
        for prefix in ("/apis", "/apis/"):
            r.add_get(prefix, self._groups)
        r.add_get("/api/v1/{plural}", self._collection)
        for suffix in ("", "/"):  # kubernetes-asyncio asks with the slash
            r.add_get("/apis/" + DRA_GROUP + "/{version}" + suffix, self._resources)
        r.add_get("/apis/" + DRA_GROUP + "/{version}/{plural}", self._collection)
        r.add_get("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", self._lease_get)
        r.add_put("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}", self._lease_put)
        r.add_post("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases", self._lease_post)
        r.add_get("/fake/clock", self._clock)
        r.add_post("/fake/advance", self._advance)
        r.add_post("/fake/expire", self._expire)
        r.add_post("/fake/faults", self._faults)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []  # the only way to learn port 0's pick
        bound = int(sockets[0].getsockname()[1]) if sockets else port
        self.url = f"http://{host}:{bound}"
        return self.url

    async def stop(self) -> None:
        """Stop playing and listening; open watches are closed."""
        if self._player is not None:
            self._player.cancel()
        self._closing = True
        async with self._changed:
            self._changed.notify_all()  # open watches end now instead of at their timeoutSeconds
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start_playing(self, *, speed: float) -> None:
        """Play the history in the background (see :meth:`play`)."""
        self._player = asyncio.ensure_future(self.play(speed=speed))

    @web.middleware
    async def _log_request(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path_qs}")
        return await handler(request)

    async def _core_versions(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"]})

    async def _groups(self, _: web.Request) -> web.Response:
        def group(name: str, versions: Sequence[str]) -> JSONObject:
            listed: list[JSONValue] = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
            return {"name": name, "versions": listed, "preferredVersion": listed[0] if listed else None}
        groups: list[JSONValue] = [group(n, v) for n, v in self.served.items() if v]
        groups.append(group("coordination.k8s.io", ["v1"]))
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _resources(self, request: web.Request) -> web.Response:
        """``GET /apis/resource.k8s.io/<version>``: the APIResourceList of the kinds served in that version."""
        version = request.match_info["version"]
        if version not in self.served.get(DRA_GROUP, []):
            return web.json_response(_status(404, f"the server could not find {request.path}", "NotFound"),
                                     status=404)
        resources: list[JSONValue] = [
            {"name": info.plural, "singularName": "", "namespaced": info.kind == "ResourceClaim", "kind": info.kind,
             "verbs": ["get", "list", "watch"]}
            for info in BY_PLURAL.values() if info.group == DRA_GROUP and version in info.versions]
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1",
                                  "groupVersion": f"{DRA_GROUP}/{version}", "resources": resources})

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        plural = request.match_info["plural"]
        version = request.match_info.get("version", "v1")
        info = BY_PLURAL.get(plural)
        if info is None or (info.group == DRA_GROUP) != ("version" in request.match_info) or (
                info.group == DRA_GROUP and (version not in self.served.get(DRA_GROUP, [])
                                             or version not in info.versions)):
            return web.json_response(_status(404, f"the server could not find {request.path}", "NotFound"),
                                     status=404)
        watching = _flag(request.query.get("watch"))
        verb = "watch" if watching else "list"
        if (answer := self._status_fault(info.kind, verb)) is not None:
            return answer
        if watching:
            try:
                return await self._watch(request, info.kind, info.api_version(version), version)
            except ConnectionResetError:  # the client went away mid-stream: nothing to answer
                return web.Response(status=499)
        return self._list(request, info.kind, info.api_version(version), version)

    def _serve(self, obj: JSONObject, version: str) -> JSONObject:
        return to_version(obj, version)

    def _list(self, request: web.Request, kind: str, api_version: str, version: str) -> web.Response:
        token = request.query.get("continue")
        limit = _int(request.query.get("limit"))
        if token:
            snap_id, _, offset_text = token.partition(":")
            snapshot = self._snapshots.get(_int(snap_id) or 0)
            if snapshot is None:
                return web.json_response(_status(410, "the continue token has expired", "Expired"), status=410)
            rv, items = snapshot
            offset = _int(offset_text) or 0
        else:
            rv = str(self._rv)
            items = []
            for _, obj in sorted(self._kinds[kind].objects.items()):
                served = self._serve(obj, version)
                items.append({k: v for k, v in served.items() if k not in ("kind", "apiVersion")})
            offset = 0
        meta: JSONObject = {"resourceVersion": rv}
        page = items[offset:offset + limit] if limit else items[offset:]
        if limit and offset + limit < len(items):
            snap_id_new = _int(token.partition(":")[0]) if token else next(self._snapshot_ids)
            assert snap_id_new is not None
            self._snapshots[snap_id_new] = (rv, items)
            meta["continue"] = f"{snap_id_new}:{offset + limit}"
        body: JSONObject = {"apiVersion": api_version, "kind": f"{kind}List", "metadata": meta,
                            "items": list[JSONValue](page)}
        return web.json_response(body)

    async def _watch(self, request: web.Request, kind: str, api_version: str, version: str) -> web.StreamResponse:
        since = _int(request.query.get("resourceVersion"))
        bookmarks = _flag(request.query.get("allowWatchBookmarks"))
        timeout_s = _int(request.query.get("timeoutSeconds")) or DEFAULT_WATCH_TIMEOUT_S
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        async def send(event_type: str, obj: JSONObject) -> None:
            await resp.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")

        store = self._kinds[kind]
        if since is None:  # "0" or unset: synthetic ADDED for what exists now, then changes
            for _, obj in sorted(store.objects.items()):
                await send("ADDED", self._serve(obj, version))
            since = self._rv
        elif since < self._compacted:
            await send("ERROR", _status(410, f"too old resource version: {since} ({self._compacted})", "Expired"))
            await resp.write_eof()
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        position = next((i for i, e in enumerate(store.log) if e.rv > since), len(store.log))
        sent = 0
        while True:
            while True:
                fault = self._take(kind, "watch", actions=("drop", "expire", "line"), sent=sent)
                if fault is not None and fault.action == "line":
                    await resp.write(fault.line.encode("utf-8", "surrogateescape") + b"\n")
                    continue
                if fault is not None:
                    return await self._stream_fault(request, resp, fault, send,
                                                    store.log[position] if position < len(store.log) else None)
                if position >= len(store.log):
                    break
                entry = store.log[position]
                position += 1
                if entry.type == "BOOKMARK" and not bookmarks:
                    continue
                await send(entry.type, self._serve(entry.object, version))
                sent += 1
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing:
                break
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        if bookmarks:  # as kube-apiserver does just before a watch times out
            await send("BOOKMARK", {"kind": kind, "apiVersion": api_version,
                                    "metadata": {"resourceVersion": str(self._rv)}})
        await resp.write_eof()
        return resp

    async def _stream_fault(self, request: web.Request, resp: web.StreamResponse, fault: Fault,
                            send: _Send, upcoming: _Entry | None) -> web.StreamResponse:
        if fault.action == "expire":
            await send("ERROR", _status(410, "too old resource version (injected)", "Expired"))
            await resp.write_eof()
            return resp
        if fault.partial and upcoming is not None:
            line = json.dumps({"type": upcoming.type, "object": upcoming.object}).encode()
            await resp.write(line[: len(line) // 2])
        transport = request.transport
        if transport is not None:
            transport.abort()  # cut the connection: no terminating chunk, the client sees a broken stream
        return resp

    # --- leases ------------------------------------------------------------------------------------

    async def _lease_get(self, request: web.Request) -> web.Response:
        if (answer := self._status_fault("Lease", "get")) is not None:
            return answer
        key = (request.match_info["namespace"], request.match_info["name"])
        lease = self._leases.get(key)
        if lease is None:
            return web.json_response(_status(404, f"leases \"{key[1]}\" not found", "NotFound"), status=404)
        return web.json_response(lease)

    async def _lease_post(self, request: web.Request) -> web.Response:
        if (answer := self._status_fault("Lease", "create")) is not None:
            return answer
        body = await request.json()
        meta = _meta(body)
        key = (request.match_info["namespace"], str(meta.get("name")))
        if key in self._leases:
            return web.json_response(_status(409, f"leases \"{key[1]}\" already exists", "AlreadyExists"),
                                     status=409)
        body["metadata"] = {**meta, "namespace": key[0], "resourceVersion": str(next(self._lease_rv))}
        self._leases[key] = body
        return web.json_response(body, status=201)

    async def _lease_put(self, request: web.Request) -> web.Response:
        if (answer := self._status_fault("Lease", "update")) is not None:
            return answer
        key = (request.match_info["namespace"], request.match_info["name"])
        body = await request.json()
        current = self._leases.get(key)
        if current is None:
            return web.json_response(_status(404, "not found", "NotFound"), status=404)
        if _meta(body).get("resourceVersion") != _meta(current).get("resourceVersion"):
            return web.json_response(_status(409, "the object has been modified", "Conflict"), status=409)
        body["metadata"] = {**_meta(body), "resourceVersion": str(next(self._lease_rv))}
        self._leases[key] = body
        return web.json_response(body)

    def lease(self, namespace: str, name: str) -> JSONObject | None:
        """The stored Lease, if any (for assertions)."""
        return self._leases.get((namespace, name))

    # --- control endpoints (for tests in other processes and demos) --------------------------------

    async def _clock(self, _: web.Request) -> web.Response:
        return web.json_response({"now": self.clock.isoformat(), "resourceVersion": str(self._rv),
                                  "remaining": self.remaining})

    async def _advance(self, request: web.Request) -> web.Response:
        """``POST /fake/advance?count=N|until=T|all=1``: ``count`` a whole number, 1 or more (default 1); ``until``
        an RFC 3339 time with a zone. A bad one answers 400 naming it, and nothing is played."""
        until_text, count_text = request.query.get("until"), request.query.get("count")
        try:
            until = parse_time(until_text) if until_text is not None else None
        except Invalid as e:
            return _bad_request(f"until: {e}; give an RFC 3339 time with a zone, e.g. 2026-11-02T09:00:00Z")
        count = _int(count_text) if count_text is not None else 1
        if count is None or count < 1:
            return _bad_request(f"count must be a whole number, 1 or more; got {shorten_repr(count_text)}")
        played = self.advance(None) if _flag(request.query.get("all")) else self.advance(count, until=until)
        return web.json_response({"played": [{**asdict(p), "observed_at": p.observed_at.isoformat()} for p in played]})

    async def _expire(self, _: web.Request) -> web.Response:
        self.expire()
        return web.json_response({"compacted": str(self._compacted)})

    async def _faults(self, request: web.Request) -> web.Response:
        """``POST /fake/faults``: one fault (:meth:`Fault.from_json`) or a list of them. Bad JSON or a bad fault
        answers 400 naming it, and none of the faults posted is queued."""
        try:
            body = json.loads(await request.read())
        except ValueError:  # not JSON, or not UTF-8
            return _bad_request("the body must be a JSON fault object or a list of them, e.g. "
                                '{"action": "status", "status": 429, "kind": "Pod", "verb": "list"}')
        faults: list[Fault] = []
        for n, item in enumerate(body if isinstance(body, list) else [body]):
            try:
                faults.append(Fault.from_json(item))
            except ValueError as e:  # refused before any is queued: a list is taken whole or not at all
                return _bad_request(f"fault {n}: {e}" if isinstance(body, list) else str(e))
        self.inject(*faults)
        return web.json_response({"queued": len(self.faults)})


def _bad_request(message: str) -> web.Response:
    return web.json_response(_status(400, message, "BadRequest"), status=400)


def _flag(value: str | None) -> bool:
    # Go's strconv.ParseBool, as kube-apiserver parses query booleans (kubernetes-asyncio sends "True").
    return value is not None and value.lower() in ("1", "t", "true")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int | None:
    if _is_int(value):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit():  # "²".isdigit() too, but int() refuses it
        return int(value)
    return None


class HttpClock:
    """A :data:`~workers.k8s.client.Clock` reading a fake API server's ``GET /fake/clock``, for a worker in
    another process than the test that plays the history (``dra-ledger watch --clock-url``)."""

    def __init__(self, url: str) -> None:
        self._url = url.rstrip("/") + "/fake/clock"
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self) -> datetime:
        """The server's simulated time.

        Raises:
            aiohttp.ClientError: the server cannot be reached.
        """
        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with self._session.get(self._url) as resp:
            body = await resp.json()
        return parse_time(str(body["now"]))

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
