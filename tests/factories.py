"""Builders of Kubernetes objects in real ``resource.k8s.io/v1`` shapes for hand-made histories.

Names and uids come from a counter so tests never share ids.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import httpx
import pytest
import typer
from sqlalchemy import Engine, text

from ledger import cli
from ledger.cli_typer import LedgerTyper
from ledger.config import load_config
from ledger.errors import Invalid
from ledger.events import NewEvent
from ledger.translator.translate import Observation, TranslatorState, translate
from ledger.types import JSONObject, JSONValue

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
_ids = itertools.count(1)
_rv = itertools.count(5000)


def uid(prefix: str = "uid") -> str:
    """A unique uid."""
    return f"{prefix}-{next(_ids):06d}"


def at(minutes: float) -> datetime:
    """``T0`` plus ``minutes``."""
    return T0 + timedelta(minutes=minutes)


def stamp(minutes: float) -> str:
    """RFC 3339 text of :func:`at`."""
    return at(minutes).isoformat().replace("+00:00", "Z")


def rv() -> str:
    """A fresh resourceVersion."""
    return str(next(_rv))


def gpu(name: str, *, model: str = "LATEST-GPU-MODEL", multi: bool = False,
        counters: list[JSONValue] | None = None) -> JSONObject:
    """A device entry of ``ResourceSlice.spec.devices[]``."""
    dev: JSONObject = {"name": name, "attributes": {"model": {"string": model}, "index": {"int": 0}},
                       "capacity": {"memory": {"value": "80Gi"}}}
    if multi:
        dev["allowMultipleAllocations"] = True
    if counters is not None:
        dev["consumesCounters"] = counters
    return dev


def resource_slice(*, name: str, pool: str = "node-a", generation: int = 1, count: int = 1,
                   devices: list[JSONValue], driver: str = "gpu.example.com", node: str = "node-a",
                   slice_uid: str | None = None) -> JSONObject:
    """A v1 ResourceSlice."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": slice_uid or uid("slice"), "resourceVersion": rv(),
                         "creationTimestamp": stamp(0)},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                     "devices": devices}}


def claim(*, name: str, namespace: str = "ml", claim_uid: str, count: int = 1,
          device_class: str = "gpu.example.com", results: list[str] | None = None,
          allocated_at: float | None = None, reserved: list[tuple[str, str]] | None = None,
          deletion: float | None = None, annotations: dict[str, JSONValue] | None = None,
          pool: str = "node-a", driver: str = "gpu.example.com", created_at: float = 0) -> JSONObject:
    """A v1 ResourceClaim; ``results`` are device names, ``reserved`` (pod name, pod uid) pairs; times are
    minutes after T0."""
    metadata: JSONObject = {"name": name, "namespace": namespace, "uid": claim_uid, "resourceVersion": rv(),
                            "creationTimestamp": stamp(created_at)}
    if annotations:
        metadata["annotations"] = annotations
    if deletion is not None:
        metadata["deletionTimestamp"] = stamp(deletion)
    status: JSONObject = {}
    if results is not None:
        allocation: JSONObject = {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": pool, "device": d} for d in results]}}
        if allocated_at is not None:
            allocation["allocationTimestamp"] = stamp(allocated_at)
        status["allocation"] = allocation
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in reserved]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": metadata,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}]}},
            "status": status}


def taint_rule(name: str, *, selector: JSONObject | None, effect: str = "NoSchedule",
               key: str = "example.com/broken", value: str | None = None,
               api_version: str = "resource.k8s.io/v1beta2", created: float = 0) -> JSONObject:
    """A DeviceTaintRule created at minute ``created`` (``spec.deviceSelector`` = ``selector`` unless ``None``)."""
    taint: JSONObject = {"key": key, "effect": effect, "timeAdded": stamp(created)}
    if value is not None:
        taint["value"] = value
    spec: JSONObject = {"taint": taint}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"apiVersion": api_version, "kind": "DeviceTaintRule",
            "metadata": {"name": name, "uid": uid("rule"), "resourceVersion": rv(), "generation": 1,
                         "creationTimestamp": stamp(created)},
            "spec": spec}


def namespace(name: str, team: str | None) -> JSONObject:
    """A core/v1 Namespace, labelled ``team`` when given."""
    labels: JSONObject = {"kubernetes.io/metadata.name": name}
    if team is not None:
        labels["team"] = team
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": uid("ns"), "resourceVersion": rv(), "labels": labels,
                         "creationTimestamp": stamp(0)}}


def pod(*, name: str, pod_uid: str, namespace: str = "ml", phase: str = "Running",
        claim_name: str | None = None) -> JSONObject:
    """A core/v1 Pod referencing ``claim_name`` by ``resourceClaimName``."""
    spec: JSONObject = {"containers": [{"name": "c", "image": "x"}]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": pod_uid, "resourceVersion": rv(),
                         "creationTimestamp": stamp(0)},
            "spec": spec, "status": {"phase": phase}}


class Feed:
    """Feeds observations to the translator with a shared state, numbering digests."""

    def __init__(self) -> None:
        self.state = TranslatorState()
        self._n = itertools.count()

    def __call__(self, type_: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"], obj: JSONObject,
                 minutes: float) -> list[NewEvent]:
        """Translate one watch event observed at ``T0 + minutes``; return the new events."""
        obs = Observation(type=type_, object=obj, observed_at=at(minutes), recorded_at=at(minutes),
                          digest=f"d{next(self._n)}")
        return translate(self.state, obs)


def types(events: list[NewEvent]) -> list[str]:
    """The event type names, in order."""
    return [e.event.TYPE for e in events]


def dig(obj: JSONObject, *path: str) -> JSONObject:
    """The nested mapping at ``path`` inside ``obj`` (asserting each step is a mapping)."""
    cur: JSONValue = obj
    for key in path:
        assert isinstance(cur, dict), key
        cur = cur[key]
    assert isinstance(cur, dict)
    return cur


def history(path: Path, events: list[tuple[str, JSONObject, float]]) -> Path:
    """Write a recorded history (DESIGN §9) of (watch type, object, minutes after T0) to ``path``."""
    lines = [json.dumps({"observedAt": stamp(m), "type": t, "object": o}) for t, o, m in events]
    path.write_text("\n".join(lines) + "\n")
    return path


CLI = [sys.executable, "-c", "from ledger.cli import main; main()"]
"""The command line running ``dra-ledger`` under this interpreter (add the command and its options)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ServedApi:
    """A ``dra-ledger serve`` process started by :func:`served_api`."""

    base: str
    """Its base URL, e.g. ``http://127.0.0.1:41234``."""
    process: subprocess.Popen[str]
    output: str = ""
    """Its stdout and stderr, read once it stopped (after the ``with`` block)."""


@contextmanager
def served_api(*args: str, database_url: str) -> Iterator[ServedApi]:
    """``dra-ledger serve`` with ``args`` on a free loopback port, in a process of its own, over ``database_url``.

    Yields once ``/healthz`` answers 200 (or once the process ended, or after 120 s, when the test's own requests
    will say why: on a machine busy with other jobs two workers took over 30 s to start); on leaving the block the
    process gets SIGINT (Ctrl-C) and its output is read into :attr:`ServedApi.output`.
    """
    port = free_port()
    env = {**os.environ, "LEDGER_DATABASE_URL": database_url}
    process = subprocess.Popen([*CLI, "serve", "--port", str(port), *args], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    served = ServedApi(base=f"http://127.0.0.1:{port}", process=process)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"{served.base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield served
    finally:
        process.send_signal(signal.SIGINT)
        served.output, _ = process.communicate(timeout=60)


def signalled(process: subprocess.Popen[str], signum: int, *, timeout_s: float = 120) -> tuple[str, str]:
    """Send ``signum`` to ``process`` and read its stdout and stderr once it ended (within ``timeout_s``); a process
    still running then, or when anything goes wrong on the way, is killed, so no test leaves one behind."""
    try:
        process.send_signal(signum)
        return process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@contextmanager
def taken_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that a socket listens on until the block ends (another process's port)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@contextmanager
def plugin_commands() -> Iterator[typer.Typer]:
    """A fresh Typer app holding the commands other packages register through ``ledger.cli.COMMAND_GROUP``
    (serve, jobs, watch, record, fake-apiserver), as ``dra-ledger`` loads them: onto a
    :class:`ledger.cli_typer.LedgerTyper`, as ``ledger.cli.app`` is one, so that they are the same commands.

    ``ledger.cli.DEMO_FOLLOWUPS`` is restored when the block ends: ``api.cli.register`` makes the demo
    serve the API until interrupted, and a later in-process ``demo`` test would hang.
    """
    app = LedgerTyper()
    followups = list(cli.DEMO_FOLLOWUPS)
    try:
        for entry in importlib.metadata.entry_points(group=cli.COMMAND_GROUP):
            entry.load()(app)
        yield app
    finally:
        cli.DEMO_FOLLOWUPS[:] = followups


def config_error(tmp_path: Path, body: str) -> str:
    """The message of the ``Invalid`` that loading ``body`` as ``ledger.toml`` raises (failing if none is)."""
    path = tmp_path / "ledger.toml"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(Invalid) as caught:
        load_config(path)
    return str(caught.value)


def run_while_locked(engine: Engine, lock: str, argv: list[str], setting: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a Python command line) while another session of ``engine`` holds ``lock`` (a ``LOCK TABLE``
    statement) in an open transaction, with ``setting`` (``lock_timeout=300``, say) for the command's sessions."""
    with engine.connect() as blocker:
        blocker.execute(text(lock))
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "PGOPTIONS": f"-c {setting}"})
        finally:
            blocker.rollback()
