"""Bearer tokens: none -> 401, unknown -> 401, team-limited tokens see only their teams' rows and totals."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from ledger.config import LedgerConfig

ADMIN = "admin-token-0123456789abcdef"
VISION = "vision-token-0123456789abcdef"
CONFIG = LedgerConfig.model_validate({"api": {"tokens": [
    {"name": "admin", "token": ADMIN},
    {"name": "vision-chargeback", "token": VISION, "teams": ["vision"]},
]}})
AT = "2026-11-02T09:30:00Z"


@pytest.fixture()
def guarded(make_client: Callable[[LedgerConfig], TestClient[Litestar]]) -> TestClient[Litestar]:
    return make_client(CONFIG)


def get(client: TestClient[Litestar], path: str, token: str | None, **params: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.get(path, params=params, headers=headers)


@pytest.mark.parametrize("path", ["/v1/occupancy", "/v1/claims", "/v1/events", "/v1/reports/idle-claims",
                                  "/v1/claims/ml-serve/shared-gpu/history"])
def test_no_token_or_a_bad_token_is_401_problem_details(guarded: TestClient[Litestar], path: str) -> None:
    for token in (None, "not-a-token", ADMIN + "x"):
        response = get(guarded, path, token)
        assert response.status_code == 401
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"] == "Bearer"
    basic = guarded.get(path, headers={"Authorization": f"Basic {ADMIN}"})
    assert basic.status_code == 401


def _get_with_raw_headers(app: Litestar, path: str, headers: list[tuple[str, str]]) -> tuple[int, dict[str, str], Any]:
    """GET ``path`` from ``app`` over ASGI with ``headers`` sent as given, repeated names included.

    Not through the TestClient: its transport builds the scope from ``httpx.Headers.items()``, which joins two fields
    of one name into one (``Bearer a, Bearer b``), as a proxy may but a client such as curl does not.
    """
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), *[(k.lower().encode(), v.encode()) for k, v in headers]],
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80), "state": {}}
    asyncio.run(app(scope, receive, send))  # type: ignore[arg-type]  # reason: plain dicts for the ASGI messages
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, json.loads(body)


@pytest.mark.parametrize("tokens", [(ADMIN, "not-a-token"), ("not-a-token", ADMIN), (VISION, ADMIN), (ADMIN, ADMIN)])
def test_two_authorization_headers_are_401_whatever_their_order(guarded: TestClient[Litestar],
                                                                tokens: tuple[str, str]) -> None:
    # The first of two was taken: (admin, bad) answered 200 and (bad, admin) 401, so the order decided who asked.
    # Refused by the guard, before any handler or database work, so the app is called here from a loop of its own.
    headers = [("Authorization", f"Bearer {token}") for token in tokens]
    for path in ("/v1/occupancy", "/v1/claims"):
        status, sent, body = _get_with_raw_headers(guarded.app, path, headers)
        assert status == 401, body
        assert sent["www-authenticate"] == "Bearer"
        assert body["detail"] == "the Authorization header was sent 2 times; send one bearer token"
    one = guarded.get("/v1/occupancy", headers=dict(headers[:1]))
    assert one.status_code == (401 if tokens[0] == "not-a-token" else 200)


def test_probes_stay_open(guarded: TestClient[Litestar]) -> None:
    assert guarded.get("/healthz").status_code == 200
    assert guarded.get("/readyz").status_code == 200
    assert guarded.get("/metrics").status_code == 200  # metricsPublic defaults to true


def test_metrics_need_a_token_when_metrics_public_is_false(
        make_client: Callable[[LedgerConfig], TestClient[Litestar]]) -> None:
    closed = make_client(CONFIG.model_copy(update={"api": CONFIG.api.model_copy(update={"metrics_public": False})}))
    for token in (None, "not-a-token"):
        refused = get(closed, "/metrics", token)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    for token in (ADMIN, VISION):  # the figures are cluster-wide: any configured token reads them
        answered = get(closed, "/metrics", token)
        assert answered.status_code == 200 and "dra_ledger_database_up 1.0" in answered.text
    assert closed.get("/healthz").status_code == 200 and closed.get("/readyz").status_code == 200


def test_a_full_token_sees_every_team(guarded: TestClient[Litestar]) -> None:
    body = get(guarded, "/v1/occupancy", ADMIN, at=AT).json()
    assert body["totals"] == {"devices": 8, "allocated": 6, "free": 2, "shared": 1}


def test_a_team_limited_token_sees_only_its_teams_rows_and_totals(guarded: TestClient[Litestar]) -> None:
    occupancy = get(guarded, "/v1/occupancy", VISION, at=AT).json()
    # vision holds gpu-0 (train-0), gpu-2 + gpu-3 (pair-0) and gpu-7 (pick-seven) at 09:30.
    assert sorted(d["device"] for d in occupancy["devices"]) == ["gpu-0", "gpu-2", "gpu-3", "gpu-7"]
    assert {a["team"] for d in occupancy["devices"] for a in d["allocations"]} == {"vision"}
    assert occupancy["totals"] == {"devices": 4, "allocated": 4, "free": 0, "shared": 0}
    claims = get(guarded, "/v1/claims", VISION, at=AT).json()["claims"]
    assert {c["team"] for c in claims} == {"vision"} and len(claims) == 4
    usage = get(guarded, "/v1/usage", VISION, **{"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z",
                                                  "groupBy": "namespace"}).json()
    assert [r["namespace"] for r in usage["rows"]] == ["ml-train"]
    idle = get(guarded, "/v1/reports/idle-claims", VISION, at="2026-11-02T12:00:00Z").json()
    assert idle["claims"] == []  # the idle shared-gpu claim belongs to nlp
    assert get(guarded, "/v1/reports/idle-claims", ADMIN, at="2026-11-02T12:00:00Z").json()["claims"]


def test_a_team_limited_token_cannot_reach_other_teams_through_names(guarded: TestClient[Litestar]) -> None:
    assert get(guarded, "/v1/claims/ml-serve/shared-gpu/history", VISION).status_code == 404
    assert get(guarded, "/v1/claims/ml-train/big/history", VISION).status_code == 200
    assert get(guarded, "/v1/events", VISION).status_code == 403
    timeline = get(guarded, "/v1/devices/gpu.example.com/lab-node/gpu-1/timeline", VISION).json()
    assert [e["kind"] for e in timeline["entries"]] == ["inventory"]  # nlp's allocation is hidden
