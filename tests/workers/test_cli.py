"""The commands as an operator runs them: ``dra-ledger fake-apiserver`` serving seed-lab and
``dra-ledger record`` capturing it through a kubeconfig."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from ledger.recorded import WatchLine, read_history
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI as DRA_LEDGER
from tests.factories import free_port
from tests.workers.harness import SEED_LAB, WAIT_S, kubeconfig


def _call(url: str, method: str = "GET") -> dict[str, object]:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as resp:
        body = json.loads(resp.read())
    assert isinstance(body, dict)
    return body


def test_record_captures_what_the_fake_apiserver_serves_and_replay_reads_it(ledger: LedgerHandle,
                                                                           tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*DRA_LEDGER, "fake-apiserver", "--history", str(SEED_LAB), "--port", str(port),
                               "--paused"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + WAIT_S * 2
        while True:
            try:
                _call(f"{url}/fake/clock")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "fake-apiserver did not start"
                time.sleep(0.1)
        played = _call(f"{url}/fake/advance?all=1", "POST")["played"]
        assert isinstance(played, list) and len(played) == 39
        assert _call(f"{url}/fake/clock")["now"] == "2026-11-02T12:00:00+00:00"
        out = tmp_path / "captured.jsonl"
        done = subprocess.run([*DRA_LEDGER, "record", "--kubeconfig", str(kubeconfig(tmp_path / "kc", url)),
                               "--output", str(out), "--duration", "2"], capture_output=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr.decode()
    finally:
        server.terminate()
        server.wait(timeout=WAIT_S)
    lines = [x for x in read_history(out) if isinstance(x, WatchLine)]
    names = {(x.object["kind"], str(x.object["metadata"]["name"]))  # type: ignore[index,call-overload]
             for x in lines if x.type == "ADDED"}
    claims = {name for kind, name in names if kind == "ResourceClaim"}
    assert claims == {"pick-seven", "shared-gpu", "pair-0-gpus-m2xzt", "ext-0-extended-resources-q9w7d", "big"}
    assert {kind for kind, _ in names} == {"Namespace", "DeviceClass", "ResourceSlice", "ResourceClaim", "Pod"}
    assert ledger.replay(out).rejected == []
    at = lines[-1].observed_at
    assert at is not None
    listed = ledger.claims(at=at)["claims"]
    assert isinstance(listed, list)
    assert {c["name"] for c in listed if isinstance(c, dict)} == claims
