"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Any number of replicas run; the one whose identity is in ``spec.holderIdentity`` writes, the others
wait. A standby takes the Lease once its record has not changed for ``leaseDurationSeconds`` as
measured on the standby's own monotonic clock (no clock comparison across machines). Updates use the
Lease's resourceVersion (optimistic concurrency), so two replicas can never both win one round. The
leader steps down when it could not renew for ``renew_deadline_s`` (shorter than the lease), so it
stops writing before a standby may start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any, NoReturn

from kubernetes_asyncio import client as k8s

from ledger.types import JSONObject, JSONValue
from workers.k8s.client import ApiError, NotServed, TransientApiError, get_json
from workers.settings import WatchSettings, backoff_delay_s

log = logging.getLogger(__name__)


class LeadershipLost(Exception):
    """The leader could not renew its Lease within the renew deadline (or another replica holds it)."""


def _micro_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Acquire, renew and release one Lease for ``identity``."""

    def __init__(self, api_client: k8s.ApiClient, *, identity: str, settings: WatchSettings) -> None:
        self._api: Any = k8s.CoordinationV1Api(api_client)
        self.identity = identity
        self.name = settings.lease_name
        self.namespace = settings.lease_namespace
        self._settings = settings
        self._observed: JSONValue = None
        self._observed_at = 0.0
        self.is_leader = False
        self.held_by_other = False
        """The last round found the Lease held by another replica (a leader seeing this steps down at once)."""

    async def _read(self) -> JSONObject | None:
        try:
            return await get_json(self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._settings.retry_period_s * 5),
                f"get lease {self.namespace}/{self.name}")
        except NotServed:
            return None

    async def try_acquire_or_renew(self) -> bool:
        """One round: create the Lease, renew it, or take it over once expired; True when we hold it.

        Raises:
            TransientApiError: the API server cannot be reached (the round is lost).
            ApiError: the Lease cannot be read or written (RBAC, say).
        """
        now = datetime.now(UTC)
        lease = await self._read()
        duration = self._settings.lease_duration_s
        if lease is None:
            body: JSONObject = {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": duration,
                         "acquireTime": _micro_time(now), "renewTime": _micro_time(now), "leaseTransitions": 0}}
            return await self._write(self._api.create_namespaced_lease(
                self.namespace, body, _preload_content=False), "create")
        spec = lease.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        if spec != self._observed:
            self._observed, self._observed_at = dict(spec), time.monotonic()
        holder = spec.get("holderIdentity")
        held_for = spec.get("leaseDurationSeconds")
        lease_s = held_for if isinstance(held_for, int) else duration
        if holder and holder != self.identity and time.monotonic() < self._observed_at + lease_s:
            self.held_by_other = True
            return False  # another replica holds a lease that has not expired (by our clock)
        self.held_by_other = False
        transitions = spec.get("leaseTransitions")
        count = transitions if isinstance(transitions, int) else 0
        new_spec: JSONObject = {**spec, "holderIdentity": self.identity, "leaseDurationSeconds": duration,
                                "renewTime": _micro_time(now)}
        if holder != self.identity:
            new_spec["acquireTime"] = _micro_time(now)
            new_spec["leaseTransitions"] = count + 1
        body = {**lease, "spec": new_spec}
        return await self._write(self._api.replace_namespaced_lease(
            self.name, self.namespace, body, _preload_content=False), "update")

    async def _write(self, call: Any, verb: str) -> bool:
        try:
            body = await get_json(call, f"{verb} lease {self.namespace}/{self.name}")
        except ApiError as e:
            if e.status == 409:  # AlreadyExists / Conflict: someone else wrote first this round
                return False
            raise
        spec = body.get("spec")
        self._observed, self._observed_at = (dict(spec) if isinstance(spec, dict) else None), time.monotonic()
        return True

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease (retrying every ``retry_period_s``, transient faults included)."""
        failures = 0
        while True:
            try:
                if await self.try_acquire_or_renew():
                    self.is_leader = True
                    log.info("acquired lease %s/%s as %s", self.namespace, self.name, self.identity)
                    return
                failures = 0
                await asyncio.sleep(self._settings.retry_period_s)
            except TransientApiError as e:
                delay = min(backoff_delay_s(self._settings, failures), self._settings.retry_period_s * 2)
                failures += 1
                log.warning("lease %s/%s: %s; retrying in %.2fs", self.namespace, self.name, e, delay)
                await asyncio.sleep(delay)

    async def hold(self) -> NoReturn:
        """Renew every ``retry_period_s`` while leader.

        Raises:
            LeadershipLost: no successful renewal for ``renew_deadline_s``, or the Lease was taken.
        """
        last_renewed = time.monotonic()
        while True:
            await asyncio.sleep(self._settings.retry_period_s)
            try:
                renewed = await self.try_acquire_or_renew()
            except TransientApiError as e:
                log.warning("lease %s/%s renewal failed: %s", self.namespace, self.name, e)
                renewed = False
            if renewed:
                last_renewed = time.monotonic()
            elif self.held_by_other or time.monotonic() - last_renewed > self._settings.renew_deadline_s:
                self.is_leader = False
                raise LeadershipLost(f"could not renew lease {self.namespace}/{self.name} "
                                     f"for {self._settings.renew_deadline_s}s")

    async def release(self) -> None:
        """Give the Lease up (empty holder, 1 s duration) so a standby takes over at once; best effort."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self._read()
            spec = lease.get("spec") if lease else None
            if lease is None or not isinstance(spec, dict) or spec.get("holderIdentity") != self.identity:
                return
            body = {**lease, "spec": {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                                      "renewTime": _micro_time(datetime.now(UTC))}}
            await self._write(self._api.replace_namespaced_lease(self.name, self.namespace, body,
                                                                 _preload_content=False), "release")
        except ApiError as e:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, e)
