"""A ``/`` inside a path segment: sent as ``%2F``, it stays in its segment (``api.app.LedgerApp``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from api.app import create_app
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

POOL = "rack-1/lab-node"
"""A pool name as Kubernetes allows it: DNS subdomains joined by a slash (``ResourceSlice.spec.pool.name``)."""


def _in_pool(line: str, pool: str) -> str:
    """A seed-lab line with its pool (``lab-node``) renamed ``pool`` in slices and in allocation results."""
    event = json.loads(line)
    obj = event["object"]
    if obj["kind"] == "ResourceSlice" and event["type"] != "BOOKMARK":
        obj["spec"]["pool"]["name"] = pool
    for result in ((obj.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
        result["pool"] = pool
    return json.dumps(event)


@pytest.fixture()
def client(ledger: LedgerHandle, tmp_path: Path) -> Iterator[TestClient[Litestar]]:
    """The app over the seed lab, its pool renamed :data:`POOL`."""
    history = tmp_path / "slashed-pool.jsonl"
    lines = (HISTORIES / "seed-lab.jsonl").read_text(encoding="utf-8").splitlines()
    history.write_text("".join(_in_pool(line, POOL) + "\n" for line in lines if line.strip()), encoding="utf-8")
    report = ledger.replay(history)
    assert report.rejected == []
    with TestClient(create_app(db=ledger.db, config=DEFAULT)) as test_client:
        yield test_client


@pytest.mark.parametrize("encoded", ["rack-1%2Flab-node", "rack-1%2flab-node"])
def test_the_timeline_of_a_device_in_a_pool_with_a_slash_is_found_by_its_encoded_pool(
        client: TestClient[Litestar], encoded: str) -> None:
    response = client.get(f"/v1/devices/gpu.example.com/{encoded}/gpu-1/timeline",
                          params={"from": "2026-11-02T08:00:00Z", "to": "2026-11-02T13:00:00Z"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pool"] == POOL
    # The same entries as gpu-1 of the unrenamed seed lab (tests/api/test_seed_lab_http.py): its publication at the
    # slice's creationTimestamp, then the shared claim from its allocationTimestamp.
    assert [(e["kind"], e["from"], e["to"], e.get("claim")) for e in body["entries"]] == [
        ("inventory", "2026-11-02T08:50:00Z", None, None),
        ("allocation", "2026-11-02T09:10:00Z", None, "shared-gpu"),
    ]


def test_the_pool_with_a_slash_is_also_what_occupancy_filters_on(client: TestClient[Litestar]) -> None:
    # The query-parameter side, for comparison: the pool's devices are there under their full pool name.
    response = client.get("/v1/occupancy", params={"pool": POOL, "at": "2026-11-02T09:30:00Z"})
    assert response.status_code == 200, response.text
    assert {d["pool"] for d in response.json()["devices"]} == {POOL}


def test_an_unencoded_slash_splits_the_segment_and_names_no_route(client: TestClient[Litestar]) -> None:
    response = client.get(f"/v1/devices/gpu.example.com/{POOL}/gpu-1/timeline")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_an_encoded_slash_in_a_claim_name_names_no_claim_instead_of_another_route(
        client: TestClient[Litestar]) -> None:
    # Decoded before routing, ".../shared-gpu%2Fhistory" was the history of claim shared-gpu; a claim name never
    # holds a slash, so it is a claim that does not exist.
    assert client.get("/v1/claims/ml-serve/shared-gpu/history").status_code == 200
    response = client.get("/v1/claims/ml-serve/shared-gpu%2Fhistory")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_an_encoded_slash_in_the_device_name_is_a_device_never_recorded(client: TestClient[Litestar]) -> None:
    response = client.get("/v1/devices/gpu.example.com/rack-1%2Flab-node/gpu%2F1/timeline")
    assert response.status_code == 404
    assert "gpu%2F1" in response.json()["detail"]


def test_a_pool_encoded_twice_names_the_pool_its_text_spells_which_is_none(client: TestClient[Litestar]) -> None:
    # rack-1%252Flab-node is the text "rack-1%2Flab-node" encoded once: a pool of that name, not rack-1/lab-node.
    response = client.get("/v1/devices/gpu.example.com/rack-1%252Flab-node/gpu-1/timeline")
    assert response.status_code == 404
    assert "rack-1%2Flab-node/gpu-1" in response.json()["detail"]
    # A percent sign and a slash, each encoded once, are both turned back in the pool.
    odd = client.get("/v1/devices/gpu.example.com/a%25b%2Fc/gpu-1/timeline")
    assert odd.status_code == 404
    assert "a%b/c/gpu-1" in odd.json()["detail"]
