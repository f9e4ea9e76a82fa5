"""The translator: previous recorded state + one watch event -> domain events.

One code path serves live watches and recorded files. It is pure: the caller hands it a mutable
:class:`TranslatorState` (loaded from table ``translator_state`` or empty) and persists the keys
listed in ``state.dirty`` in the same transaction as the events returned. The translator diffs the
new object against what it recorded last and emits only real transitions, so a relist, a duplicate
delivery or a MODIFIED that changes nothing tracked emits nothing.

Field rules (DESIGN §11) enforced here:
- a release is the allocation leaving ``status.allocation`` or the claim DELETED, dated when observed;
  ``deletionTimestamp`` only yields ``ClaimDeletionRequested``;
- ``reservedFor`` entries are typed consumers keyed by uid; re-adding the same uid after a removal
  is a new reservation, a repeated entry is not;
- the pool generation that counts is the highest among the slices that exist now;
- devices are identified by ``(driver, pool, device)``, never by slice name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec

from ledger import events as ev
from ledger.errors import InvalidObject, UnsupportedObject
from ledger.events import EventSource, NewEvent, event_id_for
from ledger.translator.entries import StateEntries, as_int, counting_slices, published_devices
from ledger.translator.fields import (
    maps_in,
    opt_bool,
    opt_int,
    opt_list,
    opt_map,
    opt_str,
    opt_text,
    opt_time,
    parse_k8s_time,
    req_str,
    req_text,
)
from ledger.translator.normalize import copy_json, normalize
from ledger.types import JSONObject, JSONValue, StreamId, StreamPosition

WatchType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
DEFAULT_NAMESPACE = "default"
"""Namespace of a namespaced manifest written without one (where ``kubectl apply`` puts it)."""


@dataclass(slots=True)
class TranslatorState:
    """What the translator recorded last, per state key (``claim:<uid>``, ``pool:<driver>/<pool>``,
    ``slice:<uid>``, ``class:<name>``, ``taintrule:<name>``, ``namespace:<name>``, ``pod:<uid>``).

    Values are JSON objects so they can be stored as ``jsonb``; in memory they are packed as JSON bytes
    (:class:`StateEntries`). ``dirty`` lists the keys changed since the caller last persisted; the
    caller clears it after writing.
    """

    entries: StateEntries = field(default_factory=StateEntries)
    dirty: set[str] = field(default_factory=set)
    stale: bool = False
    """``True`` after :meth:`forget`: ``entries`` is empty and must be loaded again before any use."""
    appends: int = 0
    """The cluster's count of committed append transactions that changed ``translator_state`` (table
    ``cluster_appends``) that ``entries`` reflect, counting the batches translated and handed to a writer: an append
    that finds another count under its lock knows another writer changed the stored state since, so ``entries``
    may lag it (``ledger.store.database``)."""

    def forget(self) -> None:
        """Drop every entry and mark the state stale (a write with it failed, so memory may hold changes that
        never committed). Whoever uses it next loads it again (``ledger.services`` does before each write);
        dropping the entries first means the stale copy is freed before the fresh one is loaded."""
        self.entries = StateEntries()
        self.dirty.clear()
        self.stale = True
        self.appends = 0

    def take(self, fresh: TranslatorState) -> None:
        """Become ``fresh``, a state just loaded (``translator_state`` and its append count), in place: the one place
        that knows every field a load fills, for the callers that hold this object (a stale state loaded again, or
        one another writer moved on). ``dirty`` is cleared: nothing in ``fresh`` is unsaved."""
        self.entries, self.appends = fresh.entries, fresh.appends
        self.dirty.clear()
        self.stale = False

    def get(self, key: str) -> JSONObject | None:
        """Return a new copy of the entry for ``key`` (the caller may edit it freely), or ``None``."""
        return self.entries.get(key)

    def put(self, key: str, value: JSONObject) -> None:
        """Store ``value`` under ``key`` and mark it dirty."""
        self.entries[key] = value
        self.dirty.add(key)

    def delete(self, key: str) -> None:
        """Forget ``key`` (its deletion is persisted as a dirty key with no entry)."""
        self.entries.pop(key, None)
        self.dirty.add(key)


class _Scratch(msgspec.Struct):
    """A copy-on-write view of a :class:`TranslatorState` for one :func:`translate` call.

    Reads fall through to ``base`` until a key is written (``put``, or a private copy stored in
    ``entries`` by :meth:`take`) or deleted here; ``base`` is never modified. Entries written here are
    live objects the call keeps editing (stream positions) until :func:`translate` merges them.
    """

    base: TranslatorState
    entries: dict[str, JSONObject] = msgspec.field(default_factory=dict)
    dirty: set[str] = msgspec.field(default_factory=set)
    deleted: set[str] = msgspec.field(default_factory=set)
    read: dict[str, JSONObject] = msgspec.field(default_factory=dict)
    """``base`` entries decoded in this call (each a new copy), so a line that reads an entry and then
    takes it decodes it once: ``base`` keeps entries packed, and a claim line does both."""

    def get(self, key: str) -> JSONObject | None:
        """Return the entry for ``key`` as this call sees it, or ``None`` (callers only read it)."""
        if key in self.entries:
            return self.entries[key]
        if key in self.deleted:
            return None
        if key not in self.read:
            entry = self.base.get(key)
            if entry is None:
                return None
            self.read[key] = entry
        return self.read[key]

    def take(self, key: str) -> JSONObject | None:
        """Return a private copy of the entry for ``key``, stored in the overlay so edits stay in this call.

        A copy of ``base``'s entry is new already (:meth:`TranslatorState.get`); an entry written
        earlier in this call is copied, so events built from it never see later edits.
        """
        written_here = key in self.entries
        entry = self.get(key)
        if entry is None:
            return None
        mine = copy_json(entry) if written_here else self.read.pop(key)
        self.entries[key] = mine
        return mine

    def put(self, key: str, value: JSONObject) -> None:
        """Store ``value`` under ``key`` in the overlay and mark it dirty."""
        self.deleted.discard(key)
        self.entries[key] = value
        self.dirty.add(key)

    def delete(self, key: str) -> None:
        """Forget ``key`` in the overlay (marked dirty, so the merge removes it from ``base``)."""
        self.deleted.add(key)
        self.entries.pop(key, None)
        self.read.pop(key, None)
        self.dirty.add(key)


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """One watch event as received, already parsed.

    ``observed_at`` is the receive time (``observedAt`` of a recorded line, or the time given to
    ``replay --at``); ``recorded_at`` the time the ledger stores it; ``digest`` identifies the line.
    """

    type: WatchType
    object: JSONObject
    observed_at: datetime
    recorded_at: datetime
    digest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TranslatorSettings:
    """Options of the translator."""

    team_label: str = "team"
    """Namespace label whose value names the team billed for the namespace (DESIGN §2)."""


class _Emitter(msgspec.Struct):
    state: _Scratch
    obs: Observation
    source: EventSource
    out: list[NewEvent] = msgspec.field(default_factory=list)

    def emit(self, key: str, stream: StreamId, event: ev.Event, at: datetime, *, pos_holder: JSONObject,
             pos_field: str = "pos") -> None:
        position = as_int(pos_holder.get(pos_field)) + 1
        pos_holder[pos_field] = position
        self.state.dirty.add(key)
        self.out.append(NewEvent(
            stream=stream, stream_position=StreamPosition(position), event=event, occurred_at=at,
            recorded_at=self.obs.recorded_at, source=self.source,
            event_id=event_id_for(self.obs.digest, len(self.out), self.obs.observed_at),
        ))


def translate(state: TranslatorState, obs: Observation,
              settings: TranslatorSettings = TranslatorSettings()) -> list[NewEvent]:
    """Translate one observation into domain events, updating ``state`` in place.

    Args:
        state: the translator's memory; changed keys are added to ``state.dirty``.
        obs: the watch event; ``obs.object`` may be any supported API version (normalised to v1).
        settings: team label key.

    Returns:
        The new events in append order (possibly empty: no tracked change, or a BOOKMARK).
        Stream positions continue from ``state``; event ids derive from ``obs.digest``.

    Raises:
        InvalidObject: a field the ledger reads is missing or has the wrong type (path in message).
        UnsupportedObject: an unknown kind or API version. In both cases ``state`` is unchanged.
    """
    if obs.type == "BOOKMARK":
        return []
    try:
        obj = normalize(obs.object)
    except RecursionError as e:  # valid JSON a few hundred levels deep: too deep to copy, never a crash
        raise InvalidObject("object", "nested too deeply to read") from e
    kind = req_str(obj, "kind")
    source = EventSource(kind=kind, uid=opt_str(obj, "metadata.uid"),
                         resource_version=opt_str(obj, "metadata.resourceVersion"),
                         watch_type=obs.type, digest=obs.digest)
    handler = _HANDLERS.get(kind)
    if handler is None:
        if kind == "ResourceClaimTemplate":
            return []  # an accepted kind the ledger does not record
        raise UnsupportedObject(f"kind {kind!r} is not tracked")
    # Work on a copy-on-write overlay so that an error half-way leaves the caller's state untouched.
    # (Copying every entry per observation cost O(state) per line: ~1.5 ms at 40,000 devices and
    # 100,000 claims, which alone capped ingest below 1,000 lines/s.)
    scratch = _Scratch(base=state)
    emitter = _Emitter(state=scratch, obs=obs, source=source)
    try:
        handler(emitter, obj, settings)
        state.entries.replace({key: scratch.entries[key] for key in scratch.dirty if key in scratch.entries},
                              removed=[key for key in scratch.dirty if key not in scratch.entries])
    except RecursionError as e:
        raise InvalidObject("object", "nested too deeply to read") from e
    state.dirty |= scratch.dirty
    return emitter.out


def _within(prefix: str, error: InvalidObject) -> InvalidObject:
    """``error``, raised by a read of a nested mapping, with its path in the whole object (``prefix`` before it).

    Callers wrap a read in ``try`` and raise this from ``except InvalidObject``: the path of a list item is only
    formatted when the item is bad. (A context manager given the path, entered for every claim reference of
    every pod and every request of every claim, formatted it for every item: ~0.7 µs each, 2-3 µs a line.)
    """
    return InvalidObject(f"{prefix}{'' if error.path.startswith('[') else '.'}{error.path}", error.reason)


def _change_time(obj: JSONObject, fallback: datetime) -> datetime:
    """Latest ``metadata.managedFields[].time``, else ``fallback`` (DESIGN §4 precedence)."""
    latest: datetime | None = None
    for i, entry in enumerate(maps_in(obj, "metadata.managedFields")):
        try:
            when = opt_time(entry, "time")
        except InvalidObject as e:
            raise _within(f"metadata.managedFields[{i}]", e) from e
        if when is not None and (latest is None or when > latest):
            latest = when
    return latest if latest is not None else fallback


def _created_time(obj: JSONObject, fallback: datetime) -> datetime:
    return opt_time(obj, "metadata.creationTimestamp") or fallback


# --- ResourceSlice -> pool and device streams -------------------------------------------------


def _device_view(slice_node: str | None, slice_name: str, dev: JSONObject, i: int) -> JSONObject:
    prefix = f"spec.devices[{i}]"
    try:
        node = opt_str(dev, "nodeName") or slice_node
        attributes = opt_map(dev, "attributes")
        capacity = opt_map(dev, "capacity")
        multi = bool(opt_bool(dev, "allowMultipleAllocations"))
        counters = opt_list(dev, "consumesCounters")
        taints = opt_list(dev, "taints")
    except InvalidObject as e:
        raise InvalidObject(f"{prefix}.{e.path}", e.reason) from e
    return {"node": node, "slice": slice_name, "attributes": attributes, "capacity": capacity,
            "allowMultipleAllocations": multi, "consumesCounters": counters, "taints": taints}


def _slice_view(obj: JSONObject) -> tuple[str, str, str, JSONObject]:
    driver = req_str(obj, "spec.driver")
    pool = req_str(obj, "spec.pool.name")
    generation = opt_int(obj, "spec.pool.generation") or 0
    count = opt_int(obj, "spec.pool.resourceSliceCount") or 1
    name = opt_str(obj, "metadata.name") or ""
    slice_id = opt_str(obj, "metadata.uid") or f"name:{name}"
    node = opt_str(obj, "spec.nodeName")
    devices: JSONObject = {}
    for i, dev in enumerate(maps_in(obj, "spec.devices")):
        try:
            dev_name = req_str(dev, "name")
        except InvalidObject as e:
            raise InvalidObject(f"spec.devices[{i}].{e.path}", e.reason) from e
        devices[dev_name] = _device_view(node, name, dev, i)
    view: JSONObject = {"name": name, "generation": generation, "count": count, "devices": devices,
                        "sharedCounters": opt_list(obj, "spec.sharedCounters")}
    return driver, pool, slice_id, view


def _on_slice(em: _Emitter, obj: JSONObject, _: TranslatorSettings) -> None:
    driver, pool, slice_id, view = _slice_view(obj)
    slice_key = f"slice:{slice_id}"
    pool_id = f"{driver}/{pool}"
    base = _created_time(obj, em.obs.observed_at) if em.obs.type == "ADDED" else em.obs.observed_at
    at_publish = _change_time(obj, base)
    previous = em.state.get(slice_key)
    old_pool = previous.get("pool") if previous else None
    if isinstance(old_pool, str) and old_pool != pool_id:
        _remove_slice(em, old_pool, slice_id, em.obs.observed_at)
    if em.obs.type == "DELETED":
        _remove_slice(em, pool_id, slice_id, em.obs.observed_at)
        em.state.delete(slice_key)
        return
    em.state.put(slice_key, {"pool": pool_id})
    pool_key = f"pool:{pool_id}"
    pstate = em.state.take(pool_key) or _new_pool(driver, pool)
    slices = pstate["slices"]
    assert isinstance(slices, dict)
    slices[slice_id] = view
    em.state.put(pool_key, pstate)
    _reconcile_pool(em, pool_key, pstate, at_publish=at_publish, at_withdraw=em.obs.observed_at)


def _new_pool(driver: str, pool: str) -> JSONObject:
    return {"driver": driver, "pool": pool, "pos": 0, "slices": {}, "published": {}, "devpos": {},
            "observed": None}


def _remove_slice(em: _Emitter, pool_id: str, slice_id: str, at: datetime) -> None:
    pool_key = f"pool:{pool_id}"
    pstate = em.state.take(pool_key)
    if pstate is None:
        return
    slices = pstate["slices"]
    assert isinstance(slices, dict)
    slices.pop(slice_id, None)
    em.state.put(pool_key, pstate)
    _reconcile_pool(em, pool_key, pstate, at_publish=at, at_withdraw=at)


def _reconcile_pool(em: _Emitter, pool_key: str, pstate: JSONObject, *, at_publish: datetime,
                    at_withdraw: datetime) -> None:
    """Recompute the counting generation and the published device set of a pool; emit the diff."""
    driver, pool = str(pstate["driver"]), str(pstate["pool"])
    slices = pstate["slices"]
    published = pstate["published"]
    devpos = pstate["devpos"]
    assert isinstance(slices, dict) and isinstance(published, dict) and isinstance(devpos, dict)
    generation, current = counting_slices(slices)  # DESIGN §11.4: the highest among the slices that exist now
    wanted = published_devices(current)
    shared: list[JSONValue] = []
    for v in current:
        shared.extend(opt_list(v, "sharedCounters"))
    observed: JSONObject | None = None
    if generation is not None:
        count = max(as_int(v["count"]) for v in current)
        observed = {"generation": generation, "resourceSliceCount": count, "slices": len(current),
                    "complete": len(current) >= count, "sharedCounters": shared}
    if observed is not None and observed != pstate.get("observed"):
        em.emit(pool_key, StreamId(f"pool:{driver}/{pool}"), ev.PoolGenerationObserved(
            driver=driver, pool=pool, generation=as_int(observed["generation"]),
            resource_slice_count=as_int(observed["resourceSliceCount"]),
            slices=len(current), complete=bool(observed["complete"]), shared_counters=shared,
        ), at_publish, pos_holder=pstate)
    pstate["observed"] = observed
    for name in sorted(set(published) - set(wanted)):
        em.emit(pool_key, StreamId(f"device:{driver}/{pool}/{name}"),
                ev.DeviceWithdrawn(driver=driver, pool=pool, device=name), at_withdraw,
                pos_holder=devpos, pos_field=name)
        del published[name]
    for name in sorted(wanted):
        view = wanted[name]
        assert isinstance(view, dict)
        before = published.get(name)
        if before == view:
            continue
        cls = ev.DevicePublished if before is None else ev.DeviceUpdated
        em.emit(pool_key, StreamId(f"device:{driver}/{pool}/{name}"), cls(
            driver=driver, pool=pool, device=name, node=opt_str(view, "node"),
            slice_name=str(view["slice"]), attributes=opt_map(view, "attributes"),
            capacity=opt_map(view, "capacity"),
            allow_multiple_allocations=bool(view["allowMultipleAllocations"]),
            consumes_counters=opt_list(view, "consumesCounters"), taints=opt_list(view, "taints"),
        ), at_publish, pos_holder=devpos, pos_field=name)
        published[name] = view
    em.state.put(pool_key, pstate)


# --- ResourceClaim -> claim stream ------------------------------------------------------------


def namespace_of(obj: Mapping[str, JSONValue]) -> str:
    """Return ``metadata.namespace`` of a Pod or ResourceClaim, or ``"default"`` when it is missing.

    The API server always sets it; a manifest replayed from a file often omits it (the
    dra-driver-cpu claim in ``fixtures/real``), and ``kubectl apply`` would create it in ``default``.

    Raises:
        InvalidObject: the namespace is present but not a string.
    """
    return opt_str(obj, "metadata.namespace") or DEFAULT_NAMESPACE


def claim_uid_of(obj: Mapping[str, JSONValue]) -> str:
    """Return ``metadata.uid``, or ``name:<namespace>/<name>`` for trimmed objects without one.

    Raises:
        InvalidObject: neither a uid nor a name is present.
    """
    uid = opt_str(obj, "metadata.uid")
    if uid:
        return uid
    return f"name:{namespace_of(obj)}/{req_str(obj, 'metadata.name')}"


def _origin(obj: JSONObject) -> tuple[str, str | None, str | None]:
    annotations = opt_map(obj, "metadata.annotations")
    owner_name: str | None = None
    owner_uid: str | None = None
    for i, ref in enumerate(maps_in(obj, "metadata.ownerReferences")):
        if ref.get("kind") == "Pod":
            try:
                owner_name = opt_str(ref, "name")
                owner_uid = opt_str(ref, "uid")
            except InvalidObject as e:
                raise _within(f"metadata.ownerReferences[{i}]", e) from e
            break
    if annotations.get(EXTENDED_ANNOTATION) == "true":
        return "extended", owner_name, owner_uid
    if POD_CLAIM_ANNOTATION in annotations:
        return "template", owner_name, owner_uid
    return "manual", owner_name, owner_uid


MAX_REQUEST_COUNT = 2**63 - 1
"""The largest ``count`` a request can carry (the API's type is int64)."""


def _check_counts(requests: list[JSONObject]) -> None:
    """Refuse a request ``count`` the API server would refuse: not an integer, below 1, or beyond int64.

    ``count`` is how many devices an ``ExactCount`` request wants; quotas, pending demand and a claim's
    ``requested`` are counted from it, so a claim carrying ``0``, ``-3``, ``"2"`` or ``2.5`` is corrupt
    input, recorded as rejected, never a number that differs between those views.

    Raises:
        InvalidObject: at ``spec.devices.requests[i].exactly.count`` or ``...firstAvailable[j].count``.
    """
    # Every claim line passes here: look at the counts directly first, and name paths only once one is wrong.
    for req in requests:
        exactly = req.get("exactly")
        subs = req.get("firstAvailable")
        if not _count_ok(exactly.get("count") if isinstance(exactly, dict) else None):
            break
        if isinstance(subs, list) and not all(_count_ok(sub.get("count")) for sub in subs if isinstance(sub, dict)):
            break
    else:
        return
    for i, req in enumerate(requests):
        exactly = req.get("exactly")
        subs = req.get("firstAvailable")
        specs = [(f"spec.devices.requests[{i}].exactly", exactly)] if isinstance(exactly, dict) else []
        if isinstance(subs, list):
            specs += [(f"spec.devices.requests[{i}].firstAvailable[{j}]", sub) for j, sub in enumerate(subs)
                      if isinstance(sub, dict)]
        for path, spec in specs:
            try:
                count = opt_int(spec, "count")
            except InvalidObject as e:
                raise _within(path, e) from e
            if not _count_ok(count):
                raise InvalidObject(f"{path}.count", f"expected a device count from 1 to {MAX_REQUEST_COUNT}, "
                                                     f"got {count}")


def _count_ok(count: object) -> bool:
    """Whether a request ``count`` (``None``: absent) passes :func:`_check_counts`."""
    return count is None or (type(count) is int and 1 <= count <= MAX_REQUEST_COUNT)


def _request_classes(requests: list[JSONObject]) -> tuple[dict[str, str | None], dict[str, bool]]:
    """Map request names (``req`` and ``req/sub``) to deviceClassName and to adminAccess."""
    classes: dict[str, str | None] = {}
    admin: dict[str, bool] = {}
    for i, req in enumerate(requests):
        try:
            name = req_str(req, "name") if "name" in req else f"#{i}"
            exactly = opt_map(req, "exactly")
            subs = maps_in(req, "firstAvailable")
        except InvalidObject as e:
            raise _within(f"spec.devices.requests[{i}]", e) from e
        if exactly:
            try:
                classes[name] = opt_str(exactly, "deviceClassName")
                admin[name] = bool(opt_bool(exactly, "adminAccess"))
            except InvalidObject as e:
                raise _within(f"spec.devices.requests[{i}].exactly", e) from e
        for j, sub in enumerate(subs):
            try:
                sub_name = opt_str(sub, "name") or f"#{j}"
                classes[f"{name}/{sub_name}"] = opt_str(sub, "deviceClassName")
            except InvalidObject as e:
                raise _within(f"spec.devices.requests[{i}].firstAvailable[{j}]", e) from e
            admin[f"{name}/{sub_name}"] = False
    return classes, admin


def _results(obj: JSONObject, requests: list[JSONObject]) -> list[JSONValue] | None:
    allocation = opt_map(obj, "status.allocation")
    if not allocation:
        return None
    classes, admin = _request_classes(requests)
    out: list[JSONValue] = []
    try:
        found = maps_in(allocation, "devices.results")
    except InvalidObject as e:
        raise _within("status.allocation", e) from e
    for i, res in enumerate(found):
        try:
            request = req_str(res, "request")
            result: JSONObject = {
                "request": request,
                "driver": req_str(res, "driver"),
                "pool": req_str(res, "pool"),
                "device": req_str(res, "device"),
                "adminAccess": bool(opt_bool(res, "adminAccess")) or admin.get(request, False),
                "shareID": opt_str(res, "shareID"),
                "consumedCapacity": opt_map(res, "consumedCapacity"),
                "deviceClassName": classes.get(request, classes.get(request.split("/")[0])),
            }
        except InvalidObject as e:
            raise InvalidObject(f"status.allocation.devices.results[{i}].{e.path}", e.reason) from e
        out.append(result)
    out.sort(key=lambda r: (str(r["driver"]), str(r["pool"]), str(r["device"]), str(r["shareID"]))
             if isinstance(r, dict) else ("", "", "", ""))
    return out


def _allocation_node(obj: JSONObject) -> str | None:
    for i, term in enumerate(maps_in(obj, "status.allocation.nodeSelector.nodeSelectorTerms")):
        try:
            matches = maps_in(term, "matchFields")
        except InvalidObject as e:
            raise _within(f"status.allocation.nodeSelector.nodeSelectorTerms[{i}]", e) from e
        for j, match in enumerate(matches):
            try:
                values = opt_list(match, "values")
            except InvalidObject as e:
                raise _within(f"status.allocation.nodeSelector.nodeSelectorTerms[{i}].matchFields[{j}]", e) from e
            if match.get("key") == "metadata.name" and len(values) == 1 and isinstance(values[0], str):
                return values[0]
    return None


def _consumers(obj: JSONObject) -> dict[str, JSONValue]:
    out: dict[str, JSONValue] = {}
    for i, ref in enumerate(maps_in(obj, "status.reservedFor")):
        try:
            resource = req_str(ref, "resource")
            name = req_str(ref, "name")
            uid = opt_str(ref, "uid")
            group = opt_str(ref, "apiGroup") or ""
        except InvalidObject as e:
            raise InvalidObject(f"status.reservedFor[{i}].{e.path}", e.reason) from e
        consumer: JSONObject = {"resource": resource, "name": name, "uid": uid, "apiGroup": group or None}
        out[consumer_key(consumer)] = consumer
    return out


def consumer_key(consumer: Mapping[str, JSONValue]) -> str:
    """The key of a ``reservedFor`` entry among a claim entry's ``consumers``: the consumer's ``uid``, else
    ``<apiGroup>/<resource>/<name>`` (``apiGroup`` empty for the core group).

    Args:
        consumer: a consumer as a claim entry and the ``ClaimReserved`` payload hold it (``resource``, ``name``,
            ``uid``, ``apiGroup``; source ``ResourceClaim.status.reservedFor[]``).
    """
    uid = consumer.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return f"{consumer.get('apiGroup') or ''}/{consumer.get('resource')}/{consumer.get('name')}"


def _on_claim(em: _Emitter, obj: JSONObject, _: TranslatorSettings) -> None:
    uid = claim_uid_of(obj)
    namespace = namespace_of(obj)
    name = req_str(obj, "metadata.name")
    key = f"claim:{uid}"
    stream = StreamId(f"claim:{uid}")
    requests = maps_in(obj, "spec.devices.requests")
    _check_counts(requests)
    results = _results(obj, requests)
    consumers = _consumers(obj)
    deletion = opt_text(obj, "metadata.deletionTimestamp")
    rv = opt_str(obj, "metadata.resourceVersion")
    state = em.state.take(key)
    observed = em.obs.observed_at
    if state is not None and (state.get("namespace"), state.get("name")) != (namespace, name):
        # The API server never reuses a uid: another claim under it is corrupt input, not an update that
        # could release (and stop billing) the devices the first claim holds.
        raise InvalidObject("metadata.uid", f"{uid} already belongs to ResourceClaim "
                            f"{state.get('namespace')}/{state.get('name')}, not {namespace}/{name}")
    if state is not None and em.obs.type != "DELETED" and rv is not None and state.get("rv") == rv:
        return  # a relist or a repeated delivery of what we already recorded
    if (state is not None and results is not None and state.get("results") is None and em.obs.type != "DELETED"
            and state.get("releasedStamp") is not None
            and opt_text(obj, "status.allocation.allocationTimestamp") == state["releasedStamp"]):
        # An older version of the claim, delivered after the release of the very allocation it shows (a recording
        # replayed again with other receive times, overlapping recordings, a watch resumed from an old
        # resourceVersion): translated, it allocated the devices again from the release on and billed the gap. The
        # scheduler stamps every allocation anew, so an allocation stamped as the released one is that one.
        return
    created = _created_time(obj, observed)
    if state is None:
        origin, owner, owner_uid = _origin(obj)
        state = {"pos": 0, "namespace": namespace, "name": name, "results": None, "consumers": {},
                 "deletion": None, "rv": None}
        em.emit(key, stream, ev.ClaimCreated(
            uid=uid, namespace=namespace, name=name, origin=origin, owner_pod=owner,
            owner_pod_uid=owner_uid, requests=list(requests)), created,
            pos_holder=state)
    state["rv"] = rv
    # Never before the claim existed (a replay --at earlier than creationTimestamp, say).
    changed_at = max(_change_time(obj, observed), created)
    if deletion is not None and state.get("deletion") is None:
        em.emit(key, stream, ev.ClaimDeletionRequested(uid=uid, deletion_timestamp=deletion),
                parse_k8s_time(deletion, "metadata.deletionTimestamp"), pos_holder=state)
        state["deletion"] = deletion
    old_results = state.get("results")
    old_consumers = state.get("consumers")
    assert isinstance(old_consumers, dict)
    # Releases first (consumers, then the allocation), dated when observed (DESIGN §4, §11.1).
    gone = sorted(set(old_consumers) - set(consumers)) if em.obs.type != "DELETED" else sorted(old_consumers)
    for ckey in gone:
        consumer = old_consumers.pop(ckey)
        assert isinstance(consumer, dict)
        em.emit(key, stream, ev.ClaimUnreserved(uid=uid, consumer=consumer), changed_at, pos_holder=state)
    new_results = results if em.obs.type != "DELETED" else None
    if old_results is not None and old_results != new_results:
        em.emit(key, stream, ev.ClaimDeallocated(uid=uid), observed, pos_holder=state)
        state["results"] = None
        state["released"] = observed.isoformat()  # a later allocation of this claim never starts before it
        state["releasedStamp"] = state.pop("stamp", None)  # an older version showing it again is skipped (above)
    if em.obs.type == "DELETED":
        em.emit(key, stream, ev.ClaimDeleted(uid=uid), observed, pos_holder=state)
        em.state.put(key, {"pos": state["pos"], "deleted": True, "rv": rv})
        return
    if new_results is not None and state.get("results") is None:
        stamp = opt_text(obj, "status.allocation.allocationTimestamp")
        released = state.get("released")
        not_before = max(created, datetime.fromisoformat(released)) if isinstance(released, str) else created
        at = _allocation_time(stamp, not_before=not_before, observed=observed, fallback=changed_at)
        em.emit(key, stream, ev.ClaimAllocated(
            uid=uid, namespace=namespace, name=name, results=new_results, node=_allocation_node(obj),
            allocation_timestamp=stamp), at, pos_holder=state)
        state["results"] = new_results
        if stamp:
            state["stamp"] = stamp
    for ckey in sorted(set(consumers) - set(old_consumers)):
        consumer = consumers[ckey]
        assert isinstance(consumer, dict)
        em.emit(key, stream, ev.ClaimReserved(uid=uid, consumer=consumer), changed_at, pos_holder=state)
        old_consumers[ckey] = consumer
    em.state.put(key, state)


def _allocation_time(stamp: str | None, *, not_before: datetime, observed: datetime, fallback: datetime) -> datetime:
    """When a ClaimAllocated happened: ``status.allocation.allocationTimestamp``, kept between ``not_before`` (the
    claim's ``creationTimestamp``, or the moment its previous allocation was seen released, whichever is later)
    and the time the allocation was first seen; ``fallback`` without a stamp.

    Why the bounds: the stamp is the scheduler's clock. A claim cannot hold devices before it existed, so a stamp
    older than the claim (a skewed or reset clock, an object edited by hand) would bill hours that never were,
    and a stamp older than the claim's own last release would overlap that allocation (the claim listed twice on
    a device); an allocation seen at ``observed`` existed then, so a stamp ahead of it (a clock running fast)
    would shorten, or empty, the interval its release closes. ``observed`` never bounds below ``not_before``: a
    replay ``--at`` earlier than the object keeps the object's own times, and with clocks skewed the other way
    (the claim created after the allocation was seen) the creation wins.

    Raises:
        InvalidObject: the stamp is not an RFC 3339 time with a zone.
    """
    if not stamp:
        return fallback
    at = parse_k8s_time(stamp, "status.allocation.allocationTimestamp")
    return min(max(at, not_before), max(observed, not_before))


def _on_claim_any(em: _Emitter, obj: JSONObject, settings: TranslatorSettings) -> None:
    uid = claim_uid_of(obj)
    existing = em.state.get(f"claim:{uid}")
    if existing is not None and existing.get("deleted"):
        return  # a uid is never reused: anything after the deletion is a late duplicate
    if existing is None and em.obs.type == "DELETED":
        # A DELETED for a claim never seen: record what it held, then its release and deletion.
        added = Observation(type="ADDED", object=obj, observed_at=em.obs.observed_at,
                            recorded_at=em.obs.recorded_at, digest=em.obs.digest)
        sub = _Emitter(state=em.state, obs=added, source=em.source, out=em.out)
        _on_claim(sub, obj, settings)
    _on_claim(em, obj, settings)


# --- DeviceClass, Namespace, Pod ----------------------------------------------------------------


def _on_class(em: _Emitter, obj: JSONObject, _: TranslatorSettings) -> None:
    name = req_str(obj, "metadata.name")
    key = f"class:{name}"
    stream = StreamId(key)
    spec = opt_map(obj, "spec")
    state = em.state.take(key)
    if em.obs.type == "DELETED":
        if state is not None and not state.get("deleted"):
            em.emit(key, stream, ev.DeviceClassDeleted(name=name), em.obs.observed_at, pos_holder=state)
            em.state.put(key, {"pos": state["pos"], "deleted": True, "spec": None})
        return
    if state is None or state.get("deleted"):
        state = {"pos": state["pos"] if state else 0, "spec": spec}
        em.emit(key, stream, ev.DeviceClassDefined(name=name, spec=spec),
                _created_time(obj, em.obs.observed_at), pos_holder=state)
    elif state.get("spec") != spec:
        state["spec"] = spec
        em.emit(key, stream, ev.DeviceClassChanged(name=name, spec=spec),
                _change_time(obj, em.obs.observed_at), pos_holder=state)
    em.state.put(key, state)


# --- DeviceTaintRule ----------------------------------------------------------------------------

_SELECTOR_NAMES = ("deviceClassName", "driver", "pool", "device")
"""The string fields of ``DeviceTaintRule.spec.deviceSelector``, in the order they are recorded."""


def _taint_rule_view(obj: JSONObject) -> tuple[JSONObject | None, JSONObject]:
    """Return the recorded ``(deviceSelector, taint)`` of a DeviceTaintRule (see ``ev.DeviceTaintRuleDefined``).

    Source: ``DeviceTaintRule.spec.deviceSelector`` and ``spec.taint``. Only the fields the ledger reads are
    kept, so a change elsewhere (``status``, an unknown field) is no change of the rule.

    Raises:
        InvalidObject: ``spec.taint`` is missing or its ``key`` / ``effect`` is missing or empty; a selector
            field, ``taint.value`` or a CEL ``expression`` is not a string; ``selectors`` is not a list of
            mappings; ``taint.timeAdded`` is not an RFC 3339 time with a zone. The path names the field,
            e.g. ``spec.deviceSelector.selectors[0].cel.expression``.
    """
    raw = opt_map(obj, "spec.deviceSelector") if opt_map(obj, "spec").get("deviceSelector") is not None else None
    selector: JSONObject | None = None
    if raw is not None:
        selector = {}
        for name in _SELECTOR_NAMES:
            value = opt_str(obj, f"spec.deviceSelector.{name}")
            if value is not None:
                selector[name] = value
        if raw.get("selectors") is not None:
            cels: list[JSONValue] = []
            for i, entry in enumerate(maps_in(obj, "spec.deviceSelector.selectors")):
                try:
                    expression = req_text(entry, "cel.expression")
                except InvalidObject as e:
                    raise _within(f"spec.deviceSelector.selectors[{i}]", e) from e
                cels.append({"cel": {"expression": expression}})
            selector["selectors"] = cels
    if not opt_map(obj, "spec.taint"):
        raise InvalidObject("spec.taint", "required mapping is missing or empty")
    time_added = opt_text(obj, "spec.taint.timeAdded")
    if time_added is not None:
        parse_k8s_time(time_added, "spec.taint.timeAdded")
    taint: JSONObject = {"key": req_str(obj, "spec.taint.key"), "value": opt_str(obj, "spec.taint.value"),
                         "effect": req_str(obj, "spec.taint.effect"), "timeAdded": time_added}
    return selector, taint


def _on_taint_rule(em: _Emitter, obj: JSONObject, _: TranslatorSettings) -> None:
    """Record a DeviceTaintRule on stream ``taintrule:<name>``: Defined, Changed (selector or taint), Deleted.

    As for a DeviceClass: a relist or a repeated delivery of the recorded spec emits nothing; a deletion is
    dated when observed, a definition by ``creationTimestamp``, a change by ``metadata.managedFields[].time``.
    A DELETED object is not validated beyond its name: its spec no longer matters.
    """
    name = req_str(obj, "metadata.name")
    key = f"taintrule:{name}"
    stream = StreamId(key)
    state = em.state.take(key)
    if em.obs.type == "DELETED":
        if state is not None and not state.get("deleted"):
            em.emit(key, stream, ev.DeviceTaintRuleDeleted(name=name), em.obs.observed_at, pos_holder=state)
            em.state.put(key, {"pos": state["pos"], "deleted": True})
        return
    selector, taint = _taint_rule_view(obj)
    if state is None or state.get("deleted"):
        state = {"pos": state["pos"] if state else 0, "deviceSelector": selector, "taint": taint}
        em.emit(key, stream, ev.DeviceTaintRuleDefined(name=name, device_selector=selector, taint=taint),
                _created_time(obj, em.obs.observed_at), pos_holder=state)
    elif state.get("deviceSelector") != selector or state.get("taint") != taint:
        state["deviceSelector"], state["taint"] = selector, taint
        em.emit(key, stream, ev.DeviceTaintRuleChanged(name=name, device_selector=selector, taint=taint),
                _change_time(obj, em.obs.observed_at), pos_holder=state)
    else:
        return  # nothing tracked changed: a relist or a repeated delivery
    em.state.put(key, state)


def _on_namespace(em: _Emitter, obj: JSONObject, settings: TranslatorSettings) -> None:
    name = req_str(obj, "metadata.name")
    key = f"namespace:{name}"
    if em.obs.type == "DELETED":
        return  # the last team stays the attribution of anything still recorded in the namespace
    labels = opt_map(obj, "metadata.labels")
    value = labels.get(settings.team_label)
    if value is not None and not isinstance(value, str):
        # Label values are strings in Kubernetes; a number or boolean here is a broken object, not "no team".
        raise InvalidObject(f"metadata.labels.{settings.team_label}", f"expected a string, got {value!r}")
    team, label = (value, settings.team_label) if isinstance(value, str) and value else (name, None)
    state = em.state.take(key)
    first = state is None
    if state is None:
        state = {"pos": 0, "team": None}
    if state.get("team") == team:
        return
    at = _created_time(obj, em.obs.observed_at) if first else _change_time(obj, em.obs.observed_at)
    em.emit(key, StreamId(key), ev.TeamAssigned(namespace=name, team=team, label=label), at,
            pos_holder=state)
    state["team"] = team
    em.state.put(key, state)


def _pod_claims(obj: JSONObject) -> list[JSONValue]:
    names: set[str] = set()
    for i, ref in enumerate(maps_in(obj, "spec.resourceClaims")):
        try:
            claim = opt_str(ref, "resourceClaimName")
        except InvalidObject as e:
            raise _within(f"spec.resourceClaims[{i}]", e) from e
        if claim:
            names.add(claim)
    for i, status in enumerate(maps_in(obj, "status.resourceClaimStatuses")):
        try:
            claim = opt_str(status, "resourceClaimName")
        except InvalidObject as e:
            raise _within(f"status.resourceClaimStatuses[{i}]", e) from e
        if claim:
            names.add(claim)
    extended = opt_str(obj, "status.extendedResourceClaimStatus.resourceClaimName")
    if extended:
        names.add(extended)
    out: list[JSONValue] = [*sorted(names)]
    return out


def _on_pod(em: _Emitter, obj: JSONObject, _: TranslatorSettings) -> None:
    name = req_str(obj, "metadata.name")
    namespace = namespace_of(obj)
    uid = opt_str(obj, "metadata.uid") or f"name:{namespace}/{name}"
    key = f"pod:{uid}"
    stream = StreamId(key)
    state = em.state.take(key)
    observed = em.obs.observed_at
    view: JSONObject = {"phase": opt_str(obj, "status.phase") or "Pending",
                        "node": opt_str(obj, "spec.nodeName"), "claims": _pod_claims(obj)}
    if state is not None and state.get("deleted"):
        return  # a pod uid is never reused; anything after its deletion is a late duplicate
    if state is None or any(state.get(k) != v for k, v in view.items()):
        at = _created_time(obj, observed) if state is None else _change_time(obj, observed)
        # namespace/name let a relist after 410 write the deletion of a pod that vanished (relist.py).
        state = {"pos": state["pos"] if state else 0, "namespace": namespace, "name": name, **view}
        em.emit(key, stream, ev.PodPhaseChanged(
            uid=uid, namespace=namespace, name=name, phase=str(view["phase"]),
            node=opt_str(view, "node"), claims=opt_list(view, "claims")), at, pos_holder=state)
    if em.obs.type == "DELETED":
        em.emit(key, stream, ev.PodDeleted(uid=uid, namespace=namespace, name=name), observed,
                pos_holder=state)
        state = {"pos": state["pos"], "deleted": True}
    em.state.put(key, state)


_HANDLERS: Mapping[str, Callable[[_Emitter, JSONObject, TranslatorSettings], None]] = {
    "ResourceSlice": _on_slice,
    "ResourceClaim": _on_claim_any,
    "DeviceClass": _on_class,
    "DeviceTaintRule": _on_taint_rule,
    "Namespace": _on_namespace,
    "Pod": _on_pod,
}
