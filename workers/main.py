"""One worker process: leader election, then one list/watch task per kind, restarted after backoff.

``run_worker`` is what ``dra-ledger watch`` runs (and what the tests run in-process). While standby it
only competes for the Lease; as leader it runs the watch loops (five, six where the server serves
DeviceTaintRule) and the Lease renewal together,
and drops back to standby (cancelling the loops) when the Lease is lost.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from kubernetes_asyncio import client as k8s

from ledger.errors import STREAM_CONFLICT_HINT, LedgerError, StreamConflict
from workers.health import WorkerMetrics
from workers.k8s.client import (
    ApiError,
    Clock,
    KubeSource,
    NotServed,
    TransientApiError,
    served_resources,
    served_versions,
)
from workers.k8s.kinds import DRA_GROUP, KINDS, KindInfo
from workers.leader import LeadershipLost, LeaseElector
from workers.settings import WatchSettings, backoff_delay_s
from workers.watch import Sink, follow

log = logging.getLogger(__name__)


async def system_clock() -> datetime:
    """The receive time of live events: now, UTC."""
    return datetime.now(UTC)


def default_identity() -> str:
    """This replica's Lease identity: ``$POD_NAME`` in a pod, else ``hostname-pid``."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class _Stopped(Exception):
    """The stop event was set."""


REFUSAL_HINTS = {
    401: "the API server did not accept the worker's credentials: check the kubeconfig's user, or the ServiceAccount "
         "token the pod mounts",
    403: "the worker's credentials may not do this: it needs get, list and watch on the kinds it follows, as the "
         "ClusterRole in deploy/kubernetes/rbac.yaml grants",
}
"""What to fix, by the HTTP status of a refusal that restarts a watch (said after the server's own message)."""


async def choose_version(api_client: k8s.ApiClient, info: KindInfo, settings: WatchSettings) -> str:
    """The most preferred version of ``info`` the server serves (v1, else v1beta2, else v1beta1).

    For an optional kind (DeviceTaintRule) a served group version is not enough: the version's resource
    list (``GET /apis/resource.k8s.io/<version>``) must name the kind's plural too.
    Retries transient discovery failures with backoff.

    Raises:
        NotServed: the server serves none of the kind's versions (no DRA on this cluster, or no
            DeviceTaintRule in any version it serves).
    """
    if info.group != DRA_GROUP:
        return info.versions[0]
    failures = 0
    while True:
        try:
            served = await served_versions(api_client, info.group, timeout_s=settings.request_timeout_s)
            break
        except TransientApiError as e:
            delay = backoff_delay_s(settings, failures, retry_after_s=e.retry_after_s)
            failures += 1
            log.warning("discovery failed, retrying in %.2fs: %s", delay, e,
                        extra={"resource": info.plural, "resourceVersion": None})
            await asyncio.sleep(delay)
    for version in info.versions:
        if version in served and (not info.optional or info.plural in await _resources(api_client, info, version,
                                                                                          settings)):
            return version
    raise NotServed(f"{info.group} serves {served or 'nothing'}; the ledger reads {', '.join(info.versions)}")


async def _resources(api_client: k8s.ApiClient, info: KindInfo, version: str, settings: WatchSettings) -> list[str]:
    """:func:`served_resources` of ``info.group``/``version``, retrying transient failures with backoff."""
    failures = 0
    while True:
        try:
            return await served_resources(api_client, info.group, version, timeout_s=settings.request_timeout_s)
        except TransientApiError as e:
            delay = backoff_delay_s(settings, failures, retry_after_s=e.retry_after_s)
            failures += 1
            log.warning("discovery of %s/%s failed, retrying in %.2fs: %s", info.group, version, delay, e,
                        extra={"resource": info.plural, "resourceVersion": None})
            await asyncio.sleep(delay)


async def supervise(api_client: k8s.ApiClient, info: KindInfo, sink: Sink, *, clock: Clock,
                    settings: WatchSettings, metrics: WorkerMetrics | None) -> None:
    """Follow one kind forever; a task that fails (non-transient API error, ledger error) is logged
    loudly and restarted after backoff, discovery included (the server may start serving v1).

    An optional kind (:attr:`KindInfo.optional`: DeviceTaintRule) the server does not serve is said once
    in the log (a warning) and the task returns: the other kinds are followed without it, and the next
    leadership term looks again.
    """
    failures = 0
    while True:
        try:
            try:
                version = await choose_version(api_client, info, settings)
            except NotServed as e:
                if not info.optional:
                    raise
                log.warning("%s is not served; following the other kinds without it: %s", info.kind, e,
                            extra={"resource": info.plural, "resourceVersion": None})
                return
            source = KubeSource(api_client, info, version, clock=clock, request_timeout_s=settings.request_timeout_s,
                                page_size=settings.list_page_size)
            log.info("following %s", info.kind, extra={"resource": info.plural, "resourceVersion": None,
                                                       "apiVersion": source.api_version})
            await follow(source, sink, settings, metrics)
        except (ApiError, LedgerError) as e:
            delay = backoff_delay_s(settings, failures)
            failures += 1
            hint = f" ({STREAM_CONFLICT_HINT})" if isinstance(e, StreamConflict) else ""
            if isinstance(e, ApiError) and e.status in REFUSAL_HINTS:
                hint = f" ({REFUSAL_HINTS[e.status]})"
            # A refusal the API server answered (a status and its message) says all there is: its traceback, once
            # per kind and restart, buried the line that says what to fix. Anything else keeps its traceback.
            answered = isinstance(e, ApiError) and e.status is not None
            log.error("watch of %s failed, restarting in %.2fs: %s%s", info.kind, delay, e, hint,
                      extra={"resource": info.plural, "resourceVersion": None}, exc_info=not answered)
            if metrics is not None:
                metrics.restarted(info.kind, "failed")
            await asyncio.sleep(delay)


async def _until(stop: asyncio.Event) -> NoReturn:
    await stop.wait()
    raise _Stopped


LeaderTask = Callable[[], Coroutine[Any, Any, None]]
"""Work that only the leader does besides the watches (projection catch-up, scheduled jobs); started
when this replica becomes the leader and cancelled when it steps down."""


async def run_worker(*, api_client: k8s.ApiClient, sink: Sink, settings: WatchSettings, stop: asyncio.Event,
                     clock: Clock = system_clock, identity: str | None = None, elect: bool = True,
                     metrics: WorkerMetrics | None = None, kinds: Sequence[KindInfo] = KINDS,
                     while_leading: Sequence[LeaderTask] = ()) -> None:
    """Run until ``stop`` is set: compete for the Lease, then follow ``kinds`` into ``sink`` while leader.

    Args:
        api_client: a configured kubernetes-asyncio client (kubeconfig or in-cluster).
        sink: where objects go (:class:`workers.sink.LedgerSink` or a recording file).
        clock: receive-time source of events (tests pass the fake API server's simulated clock).
        identity: Lease holder identity (default :func:`default_identity`).
        elect: compete for the Lease (False: follow at once; for ``record`` and single-replica use).
        while_leading: tasks run beside the watches while this replica is the leader.

    Raises:
        Whatever a watch task raises that is not an ``ApiError`` / ``LedgerError`` (a bug): the process
        exits and Kubernetes restarts it.
    """
    elector = LeaseElector(api_client, identity=identity or default_identity(), settings=settings) if elect else None
    stopped = False
    try:
        while not stop.is_set() and not stopped:
            if elector is not None:
                waiting = asyncio.ensure_future(elector.acquire())
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for task in (waiting, stopping):
                    task.cancel()
                await asyncio.gather(waiting, stopping, return_exceptions=True)
                if stop.is_set():
                    break
                # Never follow without the Lease: if acquiring failed (403 on the Lease, an API server
                # that does not serve Leases, ...), this replica must not write; the error ends the run.
                failure = waiting.exception() if waiting.done() and not waiting.cancelled() else None
                if failure is not None:
                    raise failure
                if not waiting.done() or waiting.cancelled():
                    continue
            sink.reset()  # a former leader may have written since this replica last did
            if metrics is not None:
                metrics.set_leader(True)
            try:
                async with asyncio.TaskGroup() as group:
                    for info in kinds:
                        group.create_task(supervise(api_client, info, sink, clock=clock, settings=settings,
                                                    metrics=metrics))
                    if elector is not None:
                        group.create_task(elector.hold())
                    for leader_task in while_leading:
                        group.create_task(leader_task())
                    group.create_task(_until(stop))
            except* LeadershipLost as lost:
                log.warning("lost the lease, back to standby: %s", lost.exceptions[0])
            except* _Stopped:
                stopped = True
            finally:
                if metrics is not None:
                    metrics.set_leader(False)
    finally:
        if elector is not None:
            await elector.release()
