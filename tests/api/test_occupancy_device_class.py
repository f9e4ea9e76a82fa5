"""``GET /v1/occupancy?deviceClass`` and ``dra-ledger occupancy --device-class`` on the two-class history of
:mod:`tests.integration.test_occupancy_device_class` (whole GPUs and MIG partitions, an off-slice GPU, a
class created at minute 40): pages, page tokens, problems, the OpenAPI parameter, the cached "now" page,
and the CLI's JSON equal to the API body.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import Connection

from api.app import create_app
from ledger.config import DEFAULT
from ledger.projections import queries
from ledger.projections.queries import rfc3339
from ledger.testing.handle import LedgerHandle
from tests.api.test_cli_bodies import run_cli
from tests.factories import at
from tests.integration.test_occupancy_device_class import LATE, LATER, MIG, WHOLE, T, two_classes

AT = rfc3339(T)
WHOLE_TOTALS = {"devices": 4, "allocated": 3, "free": 1, "shared": 0}
"""gpu-0, gpu-1 (train), gpu-2 (held-off, off-slice), gpu-3 (free); worked out in the integration tests."""


@pytest.fixture()
def lab(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    two_classes().replay(ledger, tmp_path)
    return ledger


@pytest.fixture()
def api(lab: LedgerHandle) -> Iterator[TestClient[Litestar]]:
    with TestClient(create_app(db=lab.db, config=DEFAULT)) as client:
        yield client


def _names(body: Any) -> list[str]:
    return [d["device"] for d in body["devices"]]


def test_pages_of_one_class_follow_the_tokens_with_the_class_totals_on_each(api: TestClient[Litestar]) -> None:
    query = {"at": AT, "deviceClass": WHOLE, "limit": "1"}
    bodies = [api.get("/v1/occupancy", params=query).json()]
    while bodies[-1]["nextPageToken"] is not None and len(bodies) < 10:
        response = api.get("/v1/occupancy", params={**query, "pageToken": bodies[-1]["nextPageToken"]})
        assert response.status_code == 200, response.text
        bodies.append(response.json())
    assert [_names(b) for b in bodies] == [["gpu-0"], ["gpu-1"], ["gpu-2"], ["gpu-3"]]
    assert [b["devices"][0]["offSlice"] for b in bodies] == [False, False, True, False]
    assert all(b["totals"] == WHOLE_TOTALS for b in bodies)


def test_a_page_token_of_one_class_is_refused_with_another_class_or_without_one(api: TestClient[Litestar]) -> None:
    first = api.get("/v1/occupancy", params={"at": AT, "deviceClass": WHOLE, "limit": "2"}).json()
    token = first["nextPageToken"]
    assert _names(first) == ["gpu-0", "gpu-1"] and token is not None
    for other in ({"deviceClass": MIG}, {}):
        problem = api.get("/v1/occupancy", params={"at": AT, "limit": "2", "pageToken": token, **other})
        assert problem.status_code == 422, problem.text
        assert problem.json()["detail"].startswith("pageToken was issued for another list (")
    following = api.get("/v1/occupancy", params={"at": AT, "deviceClass": WHOLE, "limit": "2", "pageToken": token})
    assert _names(following.json()) == ["gpu-2", "gpu-3"] and following.json()["nextPageToken"] is None


def test_a_class_not_defined_at_t_is_a_404_problem_and_an_empty_one_a_422(api: TestClient[Litestar]) -> None:
    for name, when in (("gpu.nvidia.com", AT), (LATE, AT)):
        problem = api.get("/v1/occupancy", params={"at": when, "deviceClass": name})
        assert problem.status_code == 404, problem.text
        assert problem.headers["content-type"].startswith("application/problem+json")
        assert name in problem.json()["detail"]
    assert api.get("/v1/occupancy", params={"at": AT, "deviceClass": ""}).status_code == 422


def test_a_cached_later_answer_is_never_served_for_an_instant_before_the_class_existed(
        api: TestClient[Litestar]) -> None:
    # Minute 50 is after every interval bound: its page is cached. Minute 30 is after every bound of the
    # devices, allocations and consumers (minute 20) but before late-gpu was created (minute 40).
    later = api.get("/v1/occupancy", params={"at": rfc3339(LATER), "deviceClass": LATE})
    assert later.status_code == 200 and _names(later.json()) == ["gpu-1", "gpu-3"]
    assert api.get("/v1/occupancy", params={"at": AT, "deviceClass": LATE}).status_code == 404
    # Nor is one class's cached page served for another.
    assert _names(api.get("/v1/occupancy", params={"at": rfc3339(LATER), "deviceClass": MIG}).json()) == [
        "mig-0", "mig-1", "mig-2", "mig-3"]


def test_the_openapi_document_lists_the_device_class_parameter(api: TestClient[Litestar]) -> None:
    operation = api.get("/schema/openapi.json").json()["paths"]["/v1/occupancy"]["get"]
    [parameter] = [p for p in operation["parameters"] if p["name"] == "deviceClass"]
    assert parameter["in"] == "query" and not parameter.get("required")
    assert "DeviceClass" in parameter["description"]
    assert "404" in operation["responses"]  # a class not defined at T: documented, so clients expect it


@pytest.mark.parametrize("device_class", [WHOLE, MIG])
def test_cli_json_of_a_class_is_the_api_body(lab: LedgerHandle, api: TestClient[Litestar], device_class: str) -> None:
    response = api.get("/v1/occupancy", params={"at": AT, "deviceClass": device_class})
    assert response.status_code == 200, response.text

    code, output = run_cli(lab, "occupancy", "--at", AT, "--device-class", device_class, "--output", "json")

    assert code == 0, output
    assert json.loads(output) == response.json()


def test_cli_refuses_a_class_not_defined_at_t_with_exit_code_2(lab: LedgerHandle) -> None:
    code, output = run_cli(lab, "occupancy", "--at", AT, "--device-class", LATE)

    assert code == 2
    assert f"DeviceClass '{LATE}' is not defined at {AT}" in output


def test_the_pages_of_one_class_query_evaluate_its_selectors_once(api: TestClient[Litestar],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    evaluate = queries.device_class_members

    def counted(conn: Connection, **kwargs: Any) -> frozenset[queries.DeviceSortKey]:
        calls.append(kwargs["device_class"])
        return evaluate(conn, **kwargs)

    monkeypatch.setattr(queries, "device_class_members", counted)
    query = {"at": rfc3339(at(35)), "deviceClass": MIG, "limit": "1"}  # before minute 40: no page from the page cache
    token = api.get("/v1/occupancy", params=query).json()["nextPageToken"]
    pages = 1
    while token is not None:
        token = api.get("/v1/occupancy", params={**query, "pageToken": token}).json()["nextPageToken"]
        pages += 1
    assert pages == 4 and calls == [MIG]
