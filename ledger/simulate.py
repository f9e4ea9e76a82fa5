"""A deterministic fleet simulator: a recorded history (DESIGN §9) of a GPU cluster under load.

Benchmarks and tests need histories far larger than any fixture (a 5,000-node fleet writes about
4 million events a day), and they must be reproducible: the same :class:`FleetSpec` (seed included)
gives the same bytes, because every random choice comes from one ``random.Random(seed)``, every uid
is derived from that generator, and time is simulated (no clock, no environment, no hash seeds).

What the simulated fleet does (each knob is a field of :class:`FleetSpec`):

- one ResourceSlice of devices per node for ``gpu.example.com`` (pool = node); a ``mig_node_fraction``
  of the nodes also publish MIG partitions that consume the counters of their GPU (``consumesCounters``).
  Such a node's counter sets (``sharedCounters``, one per GPU) go in slices of their own in the same
  pool, at most :data:`MAX_COUNTER_SETS_PER_SLICE` each, because ``resource.k8s.io/v1`` refuses a slice
  that sets both ``devices`` and ``sharedCounters``; the pool's ``resourceSliceCount`` counts every slice
  (1 without MIG, 2 for up to 8 GPUs, 3 for 9-12). One ``nic.example.com`` slice per node with a NIC
  that ``allowMultipleAllocations`` (consumable capacity, shares carry ``shareID`` and
  ``consumedCapacity``);
- driver restarts: a node's GPU slices are republished under new names with ``generation + 1`` and
  the old slices deleted (devices keep their identity ``(driver, pool, device)``);
- namespaces of several teams (label ``team``), with ``relabels`` namespaces moving team mid-run;
- workloads arriving as a Poisson process sized to ``utilisation``: template claims from Deployments
  and Jobs (claim owned by the pod, deleted with it), manual claims shared by several pods,
  extended-resource claims made by the scheduler, requests with ``count`` > 1, MIG partitions, NIC
  bandwidth shares, pending over-requests that no node can satisfy (deleted after a while), and manual
  claims left allocated with nobody using them (idle).

Only :func:`write_history` touches the filesystem; :func:`simulate` is pure (a generator of lines).
"""

from __future__ import annotations

import heapq
import json
import math
import os
import random
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ledger.recorded import LATEST_TIME, LATEST_TIME_TEXT
from ledger.simulate_bounds import (
    MAX_GPUS_PER_MIG_NODE,
    MAX_GPUS_PER_NODE,
    MAX_HOURS,
    MAX_JOB_MINUTES,
    MAX_NODES,
    MAX_TEAMS,
)
from ledger.types import JSONObject, JSONValue

GPU_DRIVER = "gpu.example.com"
MIG_DRIVER = GPU_DRIVER
NIC_DRIVER = "nic.example.com"
GPU_CLASS = "gpu.example.com"
MIG_CLASS = "mig.gpu.example.com"
NIC_CLASS = "nic.example.com"
MIG_PARTITIONS = 4
"""MIG partitions a GPU of a MIG node offers (each consumes a quarter of its memory counter)."""
MAX_COUNTER_SETS_PER_SLICE = 8
"""Counter sets one ResourceSlice may define (``spec.sharedCounters``, resource.k8s.io/v1 from Kubernetes 1.35)."""
NIC_BANDWIDTH_G = 100
"""Bandwidth of one NIC in Gbit/s; a share takes 10 or 25."""

_SUFFIX_LETTERS = "bcdfghjklmnpqrstvwxz2456789"
"""Letters of the random suffix Kubernetes appends to a ``generateName``."""

PROGRESS_LINES = 100_000
""":func:`write_history` reports progress every this many lines."""

LINE_TAIL = timedelta(seconds=13)
"""How long after the end of the run (:attr:`FleetSpec.start` + :attr:`FleetSpec.hours`) its last line may be
dated. No action runs after the end, and the latest line an action writes comes 13 s after it: a claim made at
the end is allocated 1 s later and its pods run 12 s after that. A workload still running at the end is not
finished (its claim stays allocated), so a hold time never carries a line past the end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetSpec:
    """The knobs of a simulated fleet. Two equal specs give byte-identical histories."""

    nodes: int = 10
    """Nodes in the cluster (each with one GPU slice and one NIC slice)."""
    gpus_per_node: int = 8
    """Whole GPUs per node."""
    hours: float = 24.0
    """Simulated time in hours, from :attr:`start`."""
    seed: int = 0
    """Seed of the single random generator; the same seed gives the same bytes."""
    start: datetime = datetime(2026, 11, 1, tzinfo=UTC)
    """Instant the history starts (inventory and namespaces are published then)."""
    teams: int = 6
    """Teams; each owns :attr:`namespaces_per_team` namespaces labelled ``team=<name>``."""
    namespaces_per_team: int = 2
    """Namespaces per team."""
    utilisation: float = 0.7
    """Target fraction of GPUs held on average (sets the arrival rate of workloads)."""
    job_minutes: float = 60.0
    """Mean hold time of a workload in minutes (exponential, at least 5 minutes)."""
    mig_node_fraction: float = 0.1
    """Fraction of nodes whose GPUs also publish MIG partitions (counters shared with the GPU)."""
    restarts_per_node_day: float = 0.05
    """Driver restarts per node per simulated day (each bumps the node's pool generation)."""
    relabels: int = 1
    """Namespaces that move to another team half-way through (attribution changes from then on)."""
    idle_fraction: float = 0.03
    """Fraction of manual single-pod claims whose pod finishes while the claim stays allocated."""
    pending_fraction: float = 0.01
    """Fraction of workloads that over-request (more GPUs than any node has) and stay pending."""


@dataclass(slots=True)
class SimulationSummary:
    """What a simulation generated; a replay of its history must show the same counts."""

    lines: int = 0
    """Watch lines written (BOOKMARKs excluded: there are none)."""
    devices: int = 0
    """Distinct devices ``(driver, pool, device)`` ever published (GPUs, MIG partitions, NICs)."""
    gpus: int = 0
    """Whole GPUs published."""
    claims: int = 0
    """ResourceClaims created."""
    allocations: int = 0
    """Allocation results ever made: distinct (claim, device, shareID) pairs."""
    pending_claims: int = 0
    """Claims that were never allocated."""
    idle_claims: int = 0
    """Manual claims left allocated after their pod finished."""
    restarts: int = 0
    """Driver restarts (pool generation bumps)."""
    kinds: dict[str, int] = field(default_factory=dict)
    """Workloads started per kind (``deployment``, ``job``, ``shared``, ``extended``, ``mig``, ``nic``,
    ``multi``, ``idle``, ``pending``)."""

    def to_json(self) -> JSONObject:
        """The summary as a JSON object (for the CLI and the benchmark)."""
        kinds: JSONObject = {k: v for k, v in sorted(self.kinds.items())}
        return {"lines": self.lines, "devices": self.devices, "gpus": self.gpus, "claims": self.claims,
                "allocations": self.allocations, "pendingClaims": self.pending_claims,
                "idleClaims": self.idle_claims, "restarts": self.restarts, "kinds": kinds}


def _ts(at: datetime) -> str:
    # isoformat, not strftime: glibc's %Y writes year 1 as "1", which no RFC 3339 reader takes; both give the
    # same text for years 1000 to 9999.
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _iso(at: datetime) -> str:
    """``at`` in RFC 3339 as the CLI's messages write times (``Z``, a fraction only when there is one)."""
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _ts_s(at: datetime) -> str:
    return at.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"  # as _ts, whole seconds


@dataclass(slots=True)
class _Node:
    name: str
    uid: str
    mig: bool
    generation: int = 1
    slice_name: str = ""
    free: set[int] = field(default_factory=set)
    """GPU indexes with nothing allocated (neither whole nor any partition)."""
    partitions: dict[int, set[int]] = field(default_factory=dict)
    """MIG nodes: GPU index -> partitions in use (the GPU is then not whole-free)."""
    published: list[JSONObject] = field(default_factory=list)
    """The GPU pool's ResourceSlices last published for the node, devices first (what a driver restart
    deletes)."""
    nic_used_g: int = 0


@dataclass(slots=True)
class _Claim:
    uid: str
    name: str
    namespace: str
    meta: JSONObject
    spec: JSONObject
    status: JSONObject = field(default_factory=dict)


class _Simulation:
    """The mutable state of one run; :func:`simulate` drives it."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.rv = 1000
        self.summary = SimulationSummary()
        self.queue: list[tuple[datetime, int, Callable[[datetime], None]]] = []
        self.out: list[tuple[datetime, int, str, JSONObject]] = []
        self.seq = 0
        self.end = spec.start + timedelta(hours=spec.hours)
        self.nodes: list[_Node] = []
        self.namespaces: list[tuple[str, str]] = []
        self.workload = 0

    # --- helpers -----------------------------------------------------------------------------
    def uid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def suffix(self, rng: random.Random | None = None) -> str:
        return "".join((rng or self.rng).choice(_SUFFIX_LETTERS) for _ in range(5))

    def line(self, at: datetime, kind: str, obj: JSONObject) -> None:
        """Queue a watch line; :meth:`flush` writes it once simulated time reaches ``at``."""
        self.seq += 1
        heapq.heappush(self.out, (at, self.seq, kind, obj))

    def flush(self, until: datetime | None) -> Iterator[str]:
        """Yield queued lines up to ``until`` (all when None), in time order, numbering resourceVersions."""
        while self.out and (until is None or self.out[0][0] <= until):
            at, _, kind, obj = heapq.heappop(self.out)
            self.rv += 1
            meta = obj["metadata"]
            assert isinstance(meta, dict)
            meta["resourceVersion"] = str(self.rv)
            self.summary.lines += 1
            yield json.dumps({"observedAt": _ts(at), "type": kind, "object": obj}, separators=(",", ":"))

    def at(self, when: datetime, action: Callable[[datetime], None]) -> None:
        # Whole seconds, like Kubernetes timestamps: an allocationTimestamp (whole seconds) never
        # precedes the observed release of the device's previous holder.
        if when.microsecond:
            when = when.replace(microsecond=0) + timedelta(seconds=1)
        if when <= self.end:
            self.seq += 1
            heapq.heappush(self.queue, (when, self.seq, action))

    def count(self, kind: str) -> None:
        self.summary.kinds[kind] = self.summary.kinds.get(kind, 0) + 1

    # --- inventory ---------------------------------------------------------------------------
    def gpu_slices(self, node: _Node, at: datetime) -> list[JSONObject]:
        """The node's GPU pool at ``node.generation``: one slice of devices, then its counter-only slices.

        A MIG node's counter sets (one per GPU) go in slices without devices, at most
        :data:`MAX_COUNTER_SETS_PER_SLICE` each: ``resource.k8s.io/v1`` refuses a slice that sets both
        ``spec.devices`` and ``spec.sharedCounters``. ``resourceSliceCount`` is the number of slices returned.
        """
        devices: list[JSONValue] = []
        shared: list[JSONValue] = []
        for i in range(self.spec.gpus_per_node):
            gpu_uuid = f"gpu-{uuid.UUID(int=(hash_int(node.uid) + i) % (1 << 128), version=4)}"
            attrs: JSONObject = {"index": {"int": i}, "model": {"string": "LATEST-GPU-MODEL"},
                                 "uuid": {"string": gpu_uuid}, "driverVersion": {"version": "1.0.0"}}
            dev: JSONObject = {"name": f"gpu-{i}", "attributes": attrs,
                               "capacity": {"memory": {"value": "80Gi"}}}
            if node.mig:
                counter_set = f"gpu-{i}-counters"
                shared.append({"name": counter_set, "counters": {"memory": {"value": "80Gi"}}})
                dev["consumesCounters"] = [{"counterSet": counter_set, "counters": {"memory": {"value": "80Gi"}}}]
                devices.append(dev)
                for j in range(MIG_PARTITIONS):
                    devices.append({
                        "name": f"gpu-{i}-mig-{j}",
                        "attributes": {"index": {"int": i}, "model": {"string": "LATEST-GPU-MODEL-MIG-1g.20gb"},
                                       "parentUUID": {"string": gpu_uuid}},
                        "capacity": {"memory": {"value": "20Gi"}},
                        "consumesCounters": [{"counterSet": counter_set, "counters": {"memory": {"value": "20Gi"}}}],
                    })
            else:
                devices.append(dev)
        chunks = [shared[k:k + MAX_COUNTER_SETS_PER_SLICE] for k in range(0, len(shared), MAX_COUNTER_SETS_PER_SLICE)]
        pool: JSONObject = {"name": node.name, "generation": node.generation, "resourceSliceCount": 1 + len(chunks)}
        specs: list[JSONObject] = [{"driver": GPU_DRIVER, "nodeName": node.name, "pool": pool, "devices": devices}]
        specs.extend({"driver": GPU_DRIVER, "nodeName": node.name, "pool": dict(pool), "sharedCounters": chunk}
                     for chunk in chunks)
        slices: list[JSONObject] = []
        for n, spec in enumerate(specs):
            if n == 0:
                name, uid = node.slice_name, self.uid()
            else:
                # Counter slices draw their name and uid from a generator of their own (seeded by the run's
                # seed, the node, the generation and the slice), so they leave every other random choice of
                # the run, the workloads included, as it would be without them.
                own = random.Random(f"{self.spec.seed}/{node.uid}/{node.generation}/{n}")
                name = f"{node.name}-{GPU_DRIVER}-{self.suffix(own)}"
                uid = str(uuid.UUID(int=own.getrandbits(128), version=4))
            slices.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                           "metadata": {"name": name, "generateName": f"{node.name}-{GPU_DRIVER}-",
                                        "uid": uid, "generation": 1, "creationTimestamp": _ts_s(at),
                                        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name,
                                                             "uid": node.uid, "controller": True}]},
                           "spec": spec})
        return slices

    def nic_slice(self, node: _Node, at: datetime) -> JSONObject:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node.name}-{NIC_DRIVER}-{self.suffix()}", "uid": self.uid(),
                             "generation": 1, "creationTimestamp": _ts_s(at)},
                "spec": {"driver": NIC_DRIVER, "nodeName": node.name,
                         "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "eth1", "allowMultipleAllocations": True,
                                      "attributes": {"model": {"string": "NIC-100G"}},
                                      "capacity": {"bandwidth": {"value": f"{NIC_BANDWIDTH_G}G"}}}]}}

    def setup(self) -> None:
        spec, t0 = self.spec, self.spec.start
        for t in range(spec.teams):
            team = f"team-{t:02d}"
            for n in range(spec.namespaces_per_team):
                ns = f"{team}-ns{n}"
                self.namespaces.append((ns, team))
                self.line(t0, "ADDED", self.namespace_obj(ns, team, t0))
        for name, expr in ((GPU_CLASS, f"device.driver == '{GPU_DRIVER}' && !('parentUUID' in "
                                       f"device.attributes['{GPU_DRIVER}'])"),
                           (MIG_CLASS, f"device.driver == '{GPU_DRIVER}' && 'parentUUID' in "
                                       f"device.attributes['{GPU_DRIVER}']"),
                           (NIC_CLASS, f"device.driver == '{NIC_DRIVER}'")):
            self.line(t0, "ADDED", {
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name, "uid": self.uid(), "generation": 1, "creationTimestamp": _ts_s(t0)},
                "spec": {"selectors": [{"cel": {"expression": expr}}]}})
        mig_nodes = round(spec.nodes * spec.mig_node_fraction)
        for i in range(spec.nodes):
            node = _Node(name=f"node-{i:05d}", uid=self.uid(), mig=i < mig_nodes)
            node.slice_name = f"{node.name}-{GPU_DRIVER}-{self.suffix()}"
            node.free = set(range(spec.gpus_per_node))
            self.nodes.append(node)
            node.published = self.gpu_slices(node, t0)
            for obj in node.published:
                self.line(t0, "ADDED", obj)
            self.line(t0, "ADDED", self.nic_slice(node, t0))
            per_node = spec.gpus_per_node * (1 + (MIG_PARTITIONS if node.mig else 0))
            self.summary.devices += per_node + 1
            self.summary.gpus += spec.gpus_per_node
        # Driver restarts: a Poisson process per fleet.
        rate_h = spec.restarts_per_node_day * spec.nodes / 24.0
        when = t0
        while rate_h > 0:
            # Compared as a gap, not as a time: a draw far past the end must not step past datetime.max first.
            gap = timedelta(hours=min(self.rng.expovariate(rate_h), spec.hours + 1))
            if gap > self.end - when:
                break
            when += gap
            self.at(when, self.restart(self.rng.randrange(spec.nodes)))
        # Relabels half-way through.
        for k in range(min(spec.relabels, len(self.namespaces))):
            self.at(t0 + timedelta(hours=spec.hours / 2, seconds=k), self.relabel(k))

    def namespace_obj(self, ns: str, team: str, at: datetime) -> JSONObject:
        return {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": f"ns-{ns}", "creationTimestamp": _ts_s(self.spec.start),
                             "labels": {"kubernetes.io/metadata.name": ns, "team": team}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}

    def relabel(self, k: int) -> Callable[[datetime], None]:
        def run(at: datetime) -> None:
            ns, team = self.namespaces[k]
            others = sorted({t for _, t in self.namespaces} - {team})
            if others:
                new_team = others[self.rng.randrange(len(others))]
                self.namespaces[k] = (ns, new_team)
                self.line(at, "MODIFIED", self.namespace_obj(ns, new_team, at))
        return run

    def restart(self, index: int) -> Callable[[datetime], None]:
        def run(at: datetime) -> None:
            node = self.nodes[index]
            old = node.published  # the very slices published before: same uids, so the DELETEDs remove them
            node.generation += 1
            node.slice_name = f"{node.name}-{GPU_DRIVER}-{self.suffix()}"
            self.summary.restarts += 1
            node.published = self.gpu_slices(node, at)
            # Devices first: the highest generation among the slices that exist counts (DESIGN §11.4), so a
            # new counter slice seen before its device slice would withdraw every device of the pool for an
            # instant; in this order the devices move to the new generation in one step.
            for obj in node.published:
                self.line(at, "ADDED", obj)
            for obj in old:
                self.line(at + timedelta(seconds=2), "DELETED", obj)
        return run

    # --- workloads ---------------------------------------------------------------------------
    def arrivals(self) -> None:
        spec = self.spec
        mean_gpus = 1.6  # mean GPUs per workload of the mix below (MIG and NIC shares count ~0)
        rate_per_min = spec.utilisation * spec.nodes * spec.gpus_per_node / (mean_gpus * spec.job_minutes)
        t = spec.start + timedelta(minutes=1)
        while rate_per_min > 0:
            # As for restarts: the gap to the end is compared, so a long draw cannot overflow the datetime.
            gap = timedelta(minutes=min(self.rng.expovariate(rate_per_min), spec.hours * 60 + 1))
            if gap >= self.end - t:
                break
            t += gap
            self.at(t, self.workload_start)

    def hold_time(self) -> timedelta:
        return timedelta(minutes=max(5.0, self.rng.expovariate(1.0 / self.spec.job_minutes)))

    def pick_gpus(self, count: int) -> tuple[_Node, list[int]] | None:
        """Up to 8 random nodes are tried; None when none has ``count`` GPUs free (the claim waits)."""
        for _ in range(8):
            node = self.nodes[self.rng.randrange(len(self.nodes))]
            if len(node.free) >= count:
                chosen = sorted(node.free)[:count]
                node.free.difference_update(chosen)
                return node, chosen
        return None

    def pick_partition(self) -> tuple[_Node, int, int] | None:
        mig = [n for n in self.nodes[: max(1, round(len(self.nodes) * self.spec.mig_node_fraction))] if n.mig]
        for _ in range(8):
            if not mig:
                return None
            node = mig[self.rng.randrange(len(mig))]
            for gpu, used in sorted(node.partitions.items()):
                if len(used) < MIG_PARTITIONS:
                    part = min(set(range(MIG_PARTITIONS)) - used)
                    used.add(part)
                    return node, gpu, part
            if node.free:
                gpu = min(node.free)
                node.free.discard(gpu)
                node.partitions[gpu] = {0}
                return node, gpu, 0
        return None

    def workload_start(self, at: datetime) -> None:
        self.workload += 1
        roll = self.rng.random()
        spec = self.spec
        ns, _team = self.namespaces[self.rng.randrange(len(self.namespaces))]
        if roll < spec.pending_fraction:
            self.pending(at, ns)
        elif roll < spec.pending_fraction + spec.idle_fraction:
            self.single(at, ns, kind="idle")
        elif roll < 0.30:
            self.single(at, ns, kind="deployment")
        elif roll < 0.55:
            self.single(at, ns, kind="job")
        elif roll < 0.65:
            self.single(at, ns, kind="multi")
        elif roll < 0.73:
            self.single(at, ns, kind="extended")
        elif roll < 0.83:
            self.shared(at, ns)
        elif roll < 0.92:
            self.single(at, ns, kind="mig")
        else:
            self.single(at, ns, kind="nic")

    def pod_obj(self, *, name: str, ns: str, uid: str, at: datetime, claim_ref: JSONObject, phase: str,
                node: str | None = None, statuses: list[JSONValue] | None = None,
                extended: JSONObject | None = None) -> JSONObject:
        spec: JSONObject = {"containers": [{"name": "ctr0", "image": "registry.example.com/train:1.0",
                                            "resources": {"claims": [{"name": "gpu"}]}}],
                            "resourceClaims": [claim_ref] if claim_ref else [], "restartPolicy": "Never"}
        if node is not None:
            spec["nodeName"] = node
        status: JSONObject = {"phase": phase}
        if statuses:
            status["resourceClaimStatuses"] = statuses
        if extended is not None:
            status["extendedResourceClaimStatus"] = extended
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": _ts_s(at)},
                "spec": spec, "status": status}

    def claim_obj(self, claim: _Claim) -> JSONObject:
        obj: JSONObject = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                           "metadata": dict(claim.meta), "spec": claim.spec, "status": dict(claim.status)}
        return obj

    def request_of(self, kind: str, count: int) -> tuple[str, JSONObject]:
        if kind == "mig":
            return "gpu", {"name": "gpu", "exactly": {"deviceClassName": MIG_CLASS, "allocationMode": "ExactCount",
                                                      "count": 1}}
        if kind == "nic":
            bw = self.rng.choice((10, 25))
            return "net", {"name": "net", "exactly": {"deviceClassName": NIC_CLASS, "allocationMode": "ExactCount",
                                                      "count": 1, "capacity": {"requests": {"bandwidth": f"{bw}G"}}}}
        if kind == "extended":
            return "container-0-request-0", {"name": "container-0-request-0", "exactly": {
                "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": count}}
        return "gpu", {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount",
                                                  "count": count}}

    def allocate(self, kind: str, request: str, count: int, claim: JSONObject) -> tuple[str, list[JSONValue]] | None:
        """Choose devices; returns (node, allocation results) or None when nothing fits now."""
        if kind == "mig":
            got = self.pick_partition()
            if got is None:
                return None
            node, gpu, part = got
            return node.name, [{"request": request, "driver": MIG_DRIVER, "pool": node.name,
                                "device": f"gpu-{gpu}-mig-{part}"}]
        if kind == "nic":
            requests = claim["requests"]
            assert isinstance(requests, list) and isinstance(requests[0], dict)
            exactly = requests[0]["exactly"]
            assert isinstance(exactly, dict) and isinstance(exactly["capacity"], dict)
            reqs = exactly["capacity"]["requests"]
            assert isinstance(reqs, dict)
            bw = int(str(reqs["bandwidth"]).rstrip("G"))
            for _ in range(8):
                node = self.nodes[self.rng.randrange(len(self.nodes))]
                if node.nic_used_g + bw <= NIC_BANDWIDTH_G:
                    node.nic_used_g += bw
                    return node.name, [{"request": request, "driver": NIC_DRIVER, "pool": node.name,
                                        "device": "eth1", "shareID": self.uid(),
                                        "consumedCapacity": {"bandwidth": f"{bw}G"}}]
            return None
        picked = self.pick_gpus(count)
        if picked is None:
            return None
        node, gpus = picked
        return node.name, [{"request": request, "driver": GPU_DRIVER, "pool": node.name, "device": f"gpu-{g}"}
                           for g in gpus]

    def release(self, node_name: str, results: list[JSONValue]) -> None:
        node = self.nodes[int(node_name.rsplit("-", 1)[1])]
        for r in results:
            assert isinstance(r, dict)
            device = str(r["device"])
            if r["driver"] == NIC_DRIVER:
                consumed = r["consumedCapacity"]
                assert isinstance(consumed, dict)
                node.nic_used_g -= int(str(consumed["bandwidth"]).rstrip("G"))
            elif "-mig-" in device:
                gpu, part = int(device.split("-")[1]), int(device.rsplit("-", 1)[1])
                used = node.partitions[gpu]
                used.discard(part)
                if not used:
                    del node.partitions[gpu]
                    node.free.add(gpu)
            else:
                node.free.add(int(device.split("-")[1]))

    def new_claim(self, at: datetime, ns: str, name: str, request: JSONObject, *,
                  owner: tuple[str, str] | None = None, annotations: JSONObject | None = None) -> _Claim:
        uid = self.uid()
        meta: JSONObject = {"name": name, "namespace": ns, "uid": uid, "creationTimestamp": _ts_s(at)}
        if owner is not None:
            meta["generateName"] = name.rsplit("-", 1)[0] + "-"
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner[0], "uid": owner[1],
                                        "controller": True, "blockOwnerDeletion": True}]
        if annotations:
            meta["annotations"] = annotations
        self.summary.claims += 1
        return _Claim(uid=uid, name=name, namespace=ns, meta=meta, spec={"devices": {"requests": [request]}})

    def single(self, at: datetime, ns: str, *, kind: str) -> None:
        """One pod with one claim: template (deployment/job/multi/mig/nic), extended, or manual (idle)."""
        self.count(kind)
        n = self.workload
        count = self.rng.choice((2, 4, 8)) if kind == "multi" else 1
        count = min(count, self.spec.gpus_per_node)
        pod_name = {"deployment": f"serve-{n}-{self.suffix()}", "job": f"train-{n}-{self.suffix()}"}.get(
            kind, f"{kind}-{n}")
        pod_uid = self.uid()
        request_name, request = self.request_of(kind, count)
        if kind == "extended":
            claim = self.new_claim(at, ns, f"{pod_name}-extended-resources-{self.suffix()}", request,
                                   owner=(pod_name, pod_uid),
                                   annotations={"resource.kubernetes.io/extended-resource-claim": "true"})
            claim_ref: JSONObject = {}
        elif kind == "idle":
            claim = self.new_claim(at, ns, f"manual-{n}", request)
            claim_ref = {"name": "gpu", "resourceClaimName": claim.name}
        else:
            claim = self.new_claim(at, ns, f"{pod_name}-gpu-{self.suffix()}", request, owner=(pod_name, pod_uid),
                                   annotations={"resource.kubernetes.io/pod-claim-name": "gpu"})
            claim_ref = {"name": "gpu", "resourceClaimTemplateName": f"{kind}-template"}
        self.line(at, "ADDED", self.pod_obj(name=pod_name, ns=ns, uid=pod_uid, at=at, claim_ref=claim_ref,
                                                  phase="Pending"))
        self.line(at, "ADDED", self.claim_obj(claim))
        self.try_allocate(at, claim, kind, request_name, count, [(pod_name, pod_uid)], claim_ref,
                                     attempt=0)

    def try_allocate(self, at: datetime, claim: _Claim, kind: str, request_name: str, count: int,
                     pods: list[tuple[str, str]], claim_ref: JSONObject, *, attempt: int) -> None:
        devices = claim.spec["devices"]
        assert isinstance(devices, dict)
        got = self.allocate(kind, request_name, count, devices)
        if got is None:
            if attempt < 6:  # the scheduler retries; the claim stays pending meanwhile
                def retry(when: datetime) -> None:
                    self.try_allocate(when, claim, kind, request_name, count, pods, claim_ref,
                                                 attempt=attempt + 1)
                self.at(at + timedelta(minutes=5), retry)
            else:
                self.summary.pending_claims += 1
            return
        node, results = got
        self.summary.allocations += len(results)
        alloc_at = at + timedelta(seconds=1)
        claim.meta["finalizers"] = ["resource.kubernetes.io/delete-protection"]
        claim.status = {"allocation": {"devices": {"results": results},
                                       "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                                           {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                                       "allocationTimestamp": _ts_s(alloc_at)},
                        "reservedFor": [{"resource": "pods", "name": p, "uid": u} for p, u in pods]}
        self.line(alloc_at, "MODIFIED", self.claim_obj(claim))
        extended: JSONObject | None = ({"requestMappings": [{"containerName": "ctr0", "requestName": request_name,
                                          "resourceName": "example.com/gpu"}], "resourceClaimName": claim.name}
                    if kind == "extended" else None)
        statuses: list[JSONValue] = ([{"name": "gpu", "resourceClaimName": claim.name}]
                                     if claim_ref.get("resourceClaimTemplateName") else [])
        run_at = alloc_at + timedelta(seconds=12)
        for p, u in pods:
            self.line(run_at, "MODIFIED", self.pod_obj(name=p, ns=claim.namespace, uid=u, at=at,
                                                             claim_ref=claim_ref, phase="Running", node=node,
                                                             statuses=statuses, extended=extended))
        hold = self.hold_time()

        def finish(when: datetime) -> None:
            phase = "Succeeded" if kind in ("job", "multi", "idle", "mig", "nic") else "Failed"
            if kind in ("deployment", "extended"):
                phase = "Succeeded"
            for p, u in pods:
                self.line(when, "MODIFIED", self.pod_obj(name=p, ns=claim.namespace, uid=u, at=at,
                                                               claim_ref=claim_ref, phase=phase, node=node,
                                                               statuses=statuses, extended=extended))
            claim.status = {k: v for k, v in claim.status.items() if k != "reservedFor"}
            if kind == "idle":
                # The pod is gone but nobody deletes the manual claim: it stays allocated, unused.
                self.summary.idle_claims += 1
                self.line(when + timedelta(seconds=1), "MODIFIED", self.claim_obj(claim))
                for p, u in pods:
                    self.line(when + timedelta(seconds=2), "DELETED", self.pod_obj(
                        name=p, ns=claim.namespace, uid=u, at=at, claim_ref=claim_ref, phase=phase, node=node))
                return
            self.line(when + timedelta(seconds=1), "MODIFIED", self.claim_obj(claim))
            allocation = claim.status.get("allocation")
            assert isinstance(allocation, dict)
            alloc_devices = allocation["devices"]
            assert isinstance(alloc_devices, dict) and isinstance(alloc_devices["results"], list)
            self.release(node, alloc_devices["results"])
            claim.status = {}
            claim.meta.pop("finalizers", None)
            self.line(when + timedelta(seconds=2), "MODIFIED", self.claim_obj(claim))
            self.line(when + timedelta(seconds=2), "DELETED", self.claim_obj(claim))
            for p, u in pods:
                self.line(when + timedelta(seconds=3), "DELETED", self.pod_obj(
                    name=p, ns=claim.namespace, uid=u, at=at, claim_ref=claim_ref, phase=phase, node=node))
        # A workload that outlives the run is not finished (at() would drop it anyway); checked as a gap so that
        # a long hold near the latest time the ledger accepts cannot step past datetime.max.
        if hold <= self.end - run_at:
            self.at(run_at + hold, finish)

    def shared(self, at: datetime, ns: str) -> None:
        """A manual claim shared by 2-3 pods (inference replicas on one GPU)."""
        self.count("shared")
        n = self.workload
        request_name, request = self.request_of("shared", 1)
        claim = self.new_claim(at, ns, f"shared-{n}", request)
        claim_ref: JSONObject = {"name": "gpu", "resourceClaimName": claim.name}
        pods = [(f"shared-{n}-{k}", self.uid()) for k in range(self.rng.choice((2, 3)))]
        self.line(at, "ADDED", self.claim_obj(claim))
        for p, u in pods:
            self.line(at, "ADDED", self.pod_obj(name=p, ns=ns, uid=u, at=at, claim_ref=claim_ref,
                                                      phase="Pending"))
        self.try_allocate(at, claim, "shared", request_name, 1, pods, claim_ref, attempt=0)

    def pending(self, at: datetime, ns: str) -> None:
        """An over-request no node can satisfy: pending until deleted an hour later."""
        self.count("pending")
        n = self.workload
        _, request = self.request_of("multi", self.spec.gpus_per_node * 2)
        claim = self.new_claim(at, ns, f"big-{n}", request)
        self.summary.pending_claims += 1
        self.line(at, "ADDED", self.claim_obj(claim))

        def give_up(when: datetime) -> None:
            self.line(when, "DELETED", self.claim_obj(claim))
        self.at(at + timedelta(hours=1), give_up)


def hash_int(text: str) -> int:
    """A stable integer from ``text`` (``hash()`` is salted per process; this is not)."""
    return int(uuid.UUID(text))


def check_spec(spec: FleetSpec) -> None:
    """Refuse knobs out of range before anything is simulated or written.

    Raises:
        ValueError: no nodes, no GPUs, no hours or teams; a knob past its ``MAX_*`` bound; a run whose lines would
            go past :data:`ledger.recorded.LATEST_TIME` (its end plus :data:`LINE_TAIL`), so that every instant of a
            simulated history can be asked about; or more than :data:`MAX_GPUS_PER_MIG_NODE`
            GPUs a node while nodes have MIG partitions. The message names the knob.
    """
    if spec.nodes < 1 or spec.gpus_per_node < 1 or spec.hours <= 0 or spec.teams < 1 \
            or spec.namespaces_per_team < 1:
        raise ValueError("nodes, gpus_per_node, hours, teams and namespaces_per_team must be positive")
    for knob, value, bound in (("nodes", spec.nodes, MAX_NODES), ("gpus_per_node", spec.gpus_per_node,
                                                                   MAX_GPUS_PER_NODE),
                               ("hours", spec.hours, MAX_HOURS), ("teams", spec.teams, MAX_TEAMS),
                               ("job_minutes", spec.job_minutes, MAX_JOB_MINUTES)):
        if value > bound:
            raise ValueError(f"{knob} is {value}; at most {bound} is simulated")
    # As a gap from the start: start + hours itself may lie past datetime.max.
    room = LATEST_TIME - LINE_TAIL - spec.start
    if timedelta(hours=spec.hours) > room:
        most = math.floor(room.total_seconds() / 36) / 100  # hours, rounded down to the 0.01 h --hours takes
        fix = f"at most {most:g} hours from that start" if most >= 0.01 else "give an earlier start"
        raise ValueError(f"hours (--hours) {spec.hours:g} from start (--start) {_iso(spec.start)}: the history would "
                         f"end after {LATEST_TIME_TEXT}, the latest time the ledger accepts (its last lines come up "
                         f"to {LINE_TAIL.seconds} s after the end); {fix}")
    if spec.mig_node_fraction > 0 and spec.gpus_per_node > MAX_GPUS_PER_MIG_NODE:
        raise ValueError(f"gpus_per_node (--gpus-per-node) is {spec.gpus_per_node}; at most "
                         f"{MAX_GPUS_PER_MIG_NODE} is simulated while nodes have MIG partitions (their ResourceSlice "
                         "may list 64 devices that consume counters); a mig_node_fraction (--mig-node-fraction) "
                         "of 0 allows 128")


def simulate(spec: FleetSpec, summary: SimulationSummary | None = None) -> Iterator[str]:
    """Yield the history of the fleet ``spec`` describes, one JSON line (no newline) at a time.

    Lines are in ``observedAt`` order (ties in the order they were scheduled). Pure: the output is a
    function of ``spec`` alone.

    Args:
        spec: the fleet and its seed.
        summary: filled in while the lines are generated (complete once the generator is exhausted).

    Raises:
        ValueError: see :func:`check_spec` (raised when the generator starts).
    """
    check_spec(spec)
    sim = _Simulation(spec)
    if summary is not None:
        sim.summary = summary
    sim.setup()
    sim.arrivals()
    while sim.queue:
        when, _, action = heapq.heappop(sim.queue)
        # Actions only queue lines at or after their own time, so every line up to `when` is final.
        yield from sim.flush(when)
        action(when)
    yield from sim.flush(None)


def write_history(spec: FleetSpec, path: Path, *,
                  progress: Callable[[int], None] | None = None) -> SimulationSummary:
    """Write the history of ``spec`` to ``path`` (JSON Lines, UTF-8, ``\\n`` line ends).

    The lines go to a temporary file beside ``path`` (``.<name>.*.tmp``, same directory, so the rename is
    atomic) that replaces ``path`` only once the history is complete: a bad knob, a full disk or any exception
    on the way (``KeyboardInterrupt`` for Ctrl-C; ``dra-ledger simulate`` turns SIGTERM into one too) leaves an
    earlier file of that name as it was, and no partial history behind.

    Args:
        progress: called with the lines written so far every :data:`PROGRESS_LINES` lines.

    Returns:
        What was generated (see :class:`SimulationSummary`).

    Raises:
        OSError: the file cannot be written.
        ValueError: see :func:`check_spec` (raised before any file is made).
    """
    check_spec(spec)  # before the temporary file exists
    summary = SimulationSummary()
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        # mkstemp makes the file 0600; give it the mode a plain open() would (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for n, line in enumerate(simulate(spec, summary), 1):
                f.write(line)
                f.write("\n")
                if progress is not None and n % PROGRESS_LINES == 0:
                    progress(n)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return summary
