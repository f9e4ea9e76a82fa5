"""Access: team-limited tokens never reach another team's rows, through any endpoint or parameter.

A two-team cluster (``red`` and ``azure-team``) holds every kind of row an endpoint can show: allocations,
a double booking, a shared device, a multi-consumer claim, an idle claim, a pending claim, quotas, and a
namespace that moved from azure to red after an azure claim in it was deleted. Every operation of the
app's own OpenAPI document is called with a red token, with each parameter in turn set to values that
name azure's objects; no answer may carry an azure name the request did not itself contain, and every
answer is a 2xx or a clean 4xx. An admin token making the same calls does see azure's rows (the check
is not vacuous). Tokens are compared with ``hmac.compare_digest`` against every configured token and
never appear in any log, and SQL is built only from bound parameters (fuzzed values change nothing).
"""

from __future__ import annotations

import hmac
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote

import httpx
import pytest
from litestar import Litestar
from litestar.testing import TestClient

from ledger.config import LedgerConfig
from ledger.testing.handle import LedgerHandle
from tests import factories as f
from tests.reliability.world import client, line

ADMIN = "admin-0f3c9d1e2b7a4c58a9e1"
RED = "red-7d2e5a9c1f0b4e36b8d2"
CONFIG = LedgerConfig.model_validate({
    "api": {"tokens": [{"name": "admin", "token": ADMIN}, {"name": "red", "token": RED, "teams": ["red"]}]},
    "deviceClassMappings": [{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]}],
    "quotas": [{"team": "red", "resourceName": "example.com/gpu", "nominalQuota": 2},
               {"team": "azure-team", "resourceName": "example.com/gpu", "nominalQuota": 1}],
    "prices": [{"deviceClass": "gpu.example.com", "perDeviceHour": 2.0, "currency": "EUR"}],
})
POOL = "access-pool"
SECRETS = ("azure-team", "azure-ns", "azure-claim", "azure-idle", "azure-pending", "azure-moved", "azure-uid",
           "azure-pod")
"""Strings that only azure's rows contain."""
AT = f.stamp(20)
MOVED_AT = f.stamp(40)


def _claim(name: str, ns: str, uid: str, devices: list[str] | None, pods: list[tuple[str, str]] | None = None,
           share: bool = False) -> dict[str, Any]:
    obj = f.claim(name=name, namespace=ns, claim_uid=uid, results=devices, allocated_at=2 if devices else None,
                  reserved=pods, pool=POOL)
    if share and devices:
        for n, result in enumerate(cast(Any, obj)["status"]["allocation"]["devices"]["results"]):
            result["shareID"] = f"{uid}-share-{n}"
    return obj


def two_teams(path: Path) -> Path:
    moved = f.namespace("moved-ns", "azure-team")
    cast(Any, moved)["metadata"]["uid"] = "moved-ns-uid"
    relabeled = json.loads(json.dumps(moved).replace("azure-team", "red"))
    lines = [
        line("ADDED", f.namespace("red-ns", "red"), 0),
        line("ADDED", f.namespace("azure-ns", "azure-team"), 0),
        line("ADDED", moved, 0),
        line("ADDED", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                       "metadata": {"name": "gpu.example.com", "uid": "dc"}, "spec": {}}, 0),
        line("ADDED", f.resource_slice(name="access", pool=POOL, devices=[
            *[f.gpu(f"gpu-{i}") for i in range(6)], f.gpu("shared-0", multi=True)]), 0),
        line("ADDED", f.pod(name="red-pod", pod_uid="red-pod-uid", namespace="red-ns", claim_name="red-claim"), 1),
        line("ADDED", f.pod(name="azure-pod-1", pod_uid="azure-pod-uid-1", namespace="azure-ns",
                            claim_name="azure-claim"), 1),
        line("ADDED", f.pod(name="azure-pod-2", pod_uid="azure-pod-uid-2", namespace="azure-ns",
                            claim_name="azure-claim"), 1),
        line("ADDED", _claim("red-claim", "red-ns", "red-uid-1", ["gpu-0", "gpu-3"], [("red-pod", "red-pod-uid")]), 3),
        line("ADDED", _claim("azure-claim", "azure-ns", "azure-uid-1", ["gpu-1", "gpu-3"],
                             [("azure-pod-1", "azure-pod-uid-1"), ("azure-pod-2", "azure-pod-uid-2")]), 3),
        line("ADDED", _claim("azure-idle", "azure-ns", "azure-uid-idle", ["gpu-2"]), 3),
        line("ADDED", _claim("azure-pending", "azure-ns", "azure-uid-pending", None), 3),
        line("ADDED", _claim("red-shared", "red-ns", "red-uid-shared", ["shared-0"], share=True), 3),
        line("ADDED", _claim("azure-shared", "azure-ns", "azure-uid-shared", ["shared-0"], share=True), 3),
        line("ADDED", _claim("azure-moved", "moved-ns", "azure-uid-moved", ["gpu-4"]), 3),
        line("DELETED", _claim("azure-moved", "moved-ns", "azure-uid-moved", ["gpu-4"]), 30),
        line("MODIFIED", relabeled, 40),
        line("ADDED", _claim("red-later", "moved-ns", "red-uid-later", ["gpu-5"]), 45),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture()
def world(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    ledger.replay(two_teams(tmp_path / "two-teams.jsonl"))
    return ledger


@pytest.fixture()
def api(world: LedgerHandle) -> Iterator[TestClient[Litestar]]:
    with client(world, CONFIG) as test_client:
        yield test_client


def operations(api: TestClient[Litestar]) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """operationId -> (path template, parameters) of every GET under /v1 in the app's OpenAPI document."""
    schema = api.get("/schema/openapi.json").json()
    out: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    for path, methods in schema["paths"].items():
        for method, op in methods.items():
            assert method in ("get", "head"), (path, method)  # the API is read-only; HEAD runs GET's handler
            if method == "get" and path.startswith("/v1"):
                out[op["operationId"]] = (path, op.get("parameters", []))
    return out


PATH_VALUES: dict[str, list[str]] = {
    "namespace": ["azure-ns", "moved-ns", "red-ns"],
    "name": ["azure-claim", "azure-moved", "azure-idle", "red-claim", "red-later"],
    "driver": ["gpu.example.com"],
    "pool": [POOL],
    "device": ["gpu-1", "gpu-2", "gpu-3", "gpu-4", "shared-0", "gpu-0"],
}
QUERY_VALUES: dict[str, list[str]] = {
    "team": ["azure-team", "red"], "namespace": ["azure-ns", "moved-ns", "red-ns"], "cluster": ["default"],
    "at": [f.stamp(5), AT, MOVED_AT, f.stamp(50)], "from": [f.stamp(0)], "to": [f.stamp(60)],
    "stream": ["claim:azure-uid-1"], "type": ["ClaimAllocated"], "node": ["node-a"], "driver": ["gpu.example.com"],
    "pool": [POOL], "minIdle": ["0", "PT1M"], "step": ["PT10M"], "limit": ["1", "1000"], "afterPosition": ["0"],
    "pageToken": [], "deviceClass": ["gpu.example.com", "no-such-class"],
}
REQUIRED_DEFAULTS = {"from": f.stamp(0), "to": f.stamp(60)}
OPERATION_IDS = ["getOccupancy", "listClaims", "getClaimHistory", "getUsage", "getQuotas", "getShared", "getPending",
                 "getIdleClaims", "listEvents", "getDeviceTimeline"]


def requests_for(path: str, params: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, str]]]:
    """(url path, query) pairs: defaults, then each query parameter through its values (enums included)."""
    path_params = [p["name"] for p in params if p["in"] == "path"]
    query = [p for p in params if p["in"] == "query"]
    base = {p["name"]: REQUIRED_DEFAULTS[p["name"]] for p in query if p.get("required")}
    for combo in itertools.product(*(PATH_VALUES[n] for n in path_params)):
        url = path
        for name, value in zip(path_params, combo, strict=True):
            url = url.replace("{" + name + "}", value)
        yield url, dict(base)
        for p in query:
            schema = p.get("schema", {})
            enum = schema.get("enum") or [v for o in schema.get("oneOf", []) for v in o.get("enum", [])]
            values = QUERY_VALUES.get(p["name"])
            assert values is not None or enum, f"no test values for parameter {p['name']!r} of {path}"
            for value in [*(values or []), *(str(v) for v in enum if v is not None)]:
                yield url, {**base, p["name"]: value}


def leaked(response_text: str, url: str, query: dict[str, str]) -> list[str]:
    asked = unquote(url) + " " + " ".join(query.values())
    return [s for s in SECRETS if s in response_text and s not in asked]


def call(api: TestClient[Litestar], token: str, url: str, query: dict[str, str]) -> list[Any]:
    """Every page of one request (following nextPageToken); returns the responses."""
    headers = {"Authorization": f"Bearer {token}"}
    responses = [api.get(url, params=query, headers=headers)]
    while responses[-1].status_code == 200 and len(responses) < 50:
        body = responses[-1].json() if "json" in responses[-1].headers.get("content-type", "") else {}
        token_next = body.get("nextPageToken") if isinstance(body, dict) else None
        if not token_next:
            break
        responses.append(api.get(url, params={**query, "pageToken": token_next}, headers=headers))
    if url.startswith("/v1/usage"):  # the CSV export is scoped like the JSON
        responses.append(api.get(url, params=query, headers={**headers, "Accept": "text/csv"}))
    return responses


def test_every_operation_of_the_openapi_document_is_covered(api: TestClient[Litestar]) -> None:
    assert sorted(operations(api)) == sorted(OPERATION_IDS)


@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_a_team_limited_token_never_sees_another_teams_rows(api: TestClient[Litestar], operation_id: str) -> None:
    path, params = operations(api)[operation_id]
    problems: list[str] = []
    admin_saw = 0
    red_ok = 0
    for url, query in requests_for(path, params):
        for response in call(api, RED, url, query):
            if response.status_code >= 500 or response.status_code not in (200, 403, 404, 422):
                problems.append(f"{url} {query}: {response.status_code} {response.text[:200]}")
            elif found := leaked(response.text, url, query):
                problems.append(f"{url} {query}: shows {found}: {response.text[:300]}")
            red_ok += response.status_code == 200
        admin_saw += any(leaked(r.text, url, query) for r in call(api, ADMIN, url, query))
    assert not problems, "\n".join(problems[:20])
    if operation_id == "listEvents":
        assert red_ok == 0  # the audit log is refused (403) to team-limited tokens
    else:
        assert red_ok > 0
    assert admin_saw > 0, "the admin token should see azure's rows here: the world lacks them"


def test_a_team_limited_token_sees_its_own_rows_as_the_admin_sees_them(api: TestClient[Litestar]) -> None:
    def get(token: str, url: str, **query: str) -> Any:
        response = api.get(url, params=query, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
        return response.json()

    red_claims = get(RED, "/v1/claims", at=AT)["claims"]
    admin_claims = [c for c in get(ADMIN, "/v1/claims", at=AT)["claims"] if c["team"] == "red"]
    assert red_claims == admin_claims and {c["name"] for c in red_claims} >= {"red-claim", "red-shared"}
    window = {"from": f.stamp(0), "to": f.stamp(60)}
    red_usage = get(RED, "/v1/usage", **window)["rows"]
    admin_usage = [r for r in get(ADMIN, "/v1/usage", **window)["rows"] if r["team"] == "red"]
    # gpu-3 is double-booked (red and azure) and shared-0 is shared: red is billed half of each, whoever asks.
    assert red_usage == admin_usage


def test_a_claim_in_a_namespace_that_moved_to_another_team_stays_its_old_teams(api: TestClient[Litestar]) -> None:
    headers = {"Authorization": f"Bearer {RED}"}
    assert api.get("/v1/claims/moved-ns/red-later/history", headers=headers).status_code == 200
    assert api.get("/v1/claims/moved-ns/azure-moved/history", headers=headers).status_code == 404
    admin = api.get("/v1/claims/moved-ns/azure-moved/history", headers={"Authorization": f"Bearer {ADMIN}"})
    assert admin.status_code == 200 and admin.json()["events"]


def test_tokens_are_compared_in_constant_time_against_every_configured_token(
        api: TestClient[Litestar], monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        assert isinstance(a, bytes) and isinstance(b, bytes) and len(a) == len(b) == 32  # SHA-256 digests
        compared.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", counting)  # what api.auth calls
    for token in (ADMIN, RED, "wrong", ADMIN[:-1], ADMIN + "x", ""):
        compared.clear()
        status = api.get("/v1/occupancy", headers={"Authorization": f"Bearer {token}"}).status_code
        assert status == (200 if token in (ADMIN, RED) else 401)
        # Either no comparison (an empty token is refused before) or one per configured token, whatever matches.
        assert len(compared) == (0 if not token else 2), token


def test_tokens_never_appear_in_logs(world: LedgerHandle, caplog: pytest.LogCaptureFixture,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level("DEBUG")
    with client(world, CONFIG) as test_client:
        for token in (ADMIN, RED, ADMIN + "-wrong", f"{RED} extra"):
            for url in ("/v1/occupancy", "/v1/events", "/v1/claims/azure-ns/azure-claim/history", "/v1/nope",
                        "/v1/usage?from=bad", "/readyz"):
                test_client.get(url, headers={"Authorization": f"Bearer {token}"})
        test_client.get("/v1/occupancy", headers={"Authorization": ADMIN})  # no scheme
    captured = capsys.readouterr()
    text = caplog.text + captured.out + captured.err
    assert "GET" in text or caplog.records  # something was logged
    for secret in (ADMIN, RED, ADMIN[:12], RED[:12]):
        assert secret not in text


FUZZ = ["' OR '1'='1", "'; DROP TABLE events; --", '" OR 1=1 --', "azure-ns' --", "%", "_", "\\", "$$; SELECT 1; $$",
        "1); SELECT pg_sleep(5); --", "red' UNION SELECT * FROM observations --", "*/ SELECT /*", "ns\u2019name",
        ":namespace", "%(namespace)s", "{namespace}", "NULL"]


def test_quotes_and_sql_fragments_in_any_parameter_change_nothing(world: LedgerHandle) -> None:
    before = world.snapshot()
    with client(world, CONFIG) as test_client:
        ops = operations(test_client)
        headers = {"Authorization": f"Bearer {ADMIN}"}
        for operation_id, (path, params) in ops.items():
            strings = [p for p in params if p.get("schema", {}).get("type") == "string"
                       or any(o.get("type") == "string" for o in p.get("schema", {}).get("oneOf", []))]
            for p in strings:
                for value in FUZZ:
                    url, query = path, dict(REQUIRED_DEFAULTS) if operation_id == "getUsage" else {}
                    reference_url, reference_query = url, dict(query)
                    for other in (q for q in params if q["in"] == "path"):
                        fill = value if other["name"] == p["name"] else PATH_VALUES[other["name"]][0]
                        url = url.replace("{" + other["name"] + "}", fill)
                        reference_url = reference_url.replace(
                            "{" + other["name"] + "}", "zz-none" if other["name"] == p["name"] else fill)
                    if p["in"] == "query":
                        query[p["name"]], reference_query[p["name"]] = value, "zz-none"
                    if "at" not in query and any(q["name"] == "at" for q in params) and p["name"] != "at":
                        query["at"] = reference_query["at"] = AT
                    response = test_client.get(url, params=query, headers=headers)
                    reference = test_client.get(reference_url, params=reference_query, headers=headers)
                    where = f"{operation_id} {p['name']}={value!r}"
                    assert response.status_code < 500, (where, response.text)
                    assert response.status_code == reference.status_code, (where, response.text, reference.text)
                    if response.status_code == 200:
                        assert _comparable(response.json()) == _comparable(reference.json()), where
    assert world.snapshot() == before


def _comparable(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: _comparable(v) for k, v in body.items() if k not in ("nextPageToken",)}
    if isinstance(body, list):
        return [_comparable(v) for v in body]
    return "<echo>" if isinstance(body, str) and ("zz-none" in body or any(x in body for x in FUZZ)) else body


def test_a_served_api_never_writes_a_token_to_its_output(world: LedgerHandle, tmp_path: Path) -> None:
    config = tmp_path / "ledger.toml"
    config.write_text(f'[[api.tokens]]\nname = "admin"\ntoken = "{ADMIN}"\n\n'
                      f'[[api.tokens]]\nname = "red"\ntoken = "{RED}"\nteams = ["red"]\n')
    with f.served_api("--config", str(config), database_url=world.db.url) as server:
        for token in (ADMIN, RED, RED + "x"):
            for url in ("/v1/occupancy", "/v1/events", "/v1/claims/azure-ns/azure-claim/history", "/v1/usage?to=x"):
                httpx.get(server.base + url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    output = server.output
    assert "GET /v1/occupancy" in output  # the access log is there ...
    for secret in (ADMIN, RED, ADMIN[:12], RED[:12]):
        assert secret not in output  # ... and no token in it
