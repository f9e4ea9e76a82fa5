"""Edges of HTTP itself on the API: q-values in ``Accept``, ``HEAD``, ``OPTIONS``."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from ledger.config import LedgerConfig
from tests.api.test_parameter_edges import FOREIGN_TOKEN

TOKEN = "head-token-0123456789abcdef"
WINDOW = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}


@pytest.mark.parametrize(("accept", "media_type"), [
    # A q-value outside 0..1, not a number, or with four decimals: the range is ignored.
    ("text/csv;q=-1", "application/json"), ("text/csv;q=abc", "application/json"),
    ("text/csv;q=1.5", "application/json"), ("text/csv;q=0.5000", "application/json"),
    ("text/csv;q=-1, application/json;q=0.5", "application/json"),
    ("application/json;q=2, text/csv;q=0.5", "text/csv"), ("application/json;q=nan, text/csv;q=0.1", "text/csv"),
    # Valid ranges keep counting next to an ignored one.
    ("text/csv;q=-1, text/*", "text/csv"), ("text/csv;q=1.000, application/json;q=0.999", "text/csv"),
    # Infinity was a 500 (OverflowError while Litestar ranked the ranges); an empty or bare q, or full-width
    # digits, were read as q=1 (CSV).
    ("text/csv;q=inf", "application/json"), ("text/csv;q=-inf", "application/json"),
    ("*/*;q=inf, text/csv;q=0.5", "text/csv"), ("text/csv;q=1e999", "application/json"),
    ("text/csv;q=", "application/json"), ("text/csv;q", "application/json"),
    ("text/csv;q=\uff10.5".encode(), "application/json"),  # as UTF-8 bytes: header strings are ASCII
    # A tie is no preference for CSV: the default representation.
    ("text/csv;q=0.5, application/json;q=0.5", "application/json"), ("*/*", "application/json"),
    ("text/*;q=0.5, text/csv", "text/csv"),
])
def test_a_media_range_with_an_invalid_q_value_is_ignored(client: TestClient[Litestar], accept: str | bytes,
                                                          media_type: str) -> None:
    response = client.get("/v1/usage", params=WINDOW, headers={b"Accept": accept if isinstance(accept, bytes)
                                                               else accept.encode("ascii")})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].split(";")[0] == media_type
    assert response.headers["vary"] == "Accept"  # either way: a cache must keep JSON and CSV apart


AT = "2026-11-02T09:30:00Z"
READS = [
    # Every GET endpoint, with its instant fixed so that GET and HEAD compute the same answer.
    f"/v1/occupancy?at={AT}", f"/v1/claims?at={AT}", "/v1/claims/ml-serve/shared-gpu/history",
    f"/v1/usage?from={WINDOW['from']}&to={WINDOW['to']}", f"/v1/quotas?at={AT}", f"/v1/shared?at={AT}",
    f"/v1/reports/idle-claims?at={AT}", f"/v1/pending?at={AT}", "/v1/events?limit=5",
    f"/v1/devices/gpu.example.com/lab-node/gpu-1/timeline?to={AT}", "/healthz", "/readyz", "/metrics",
    # Refusals: a problem answer's status and headers, without its body.
    "/v1/occupancy?limit=0", "/v1/occupancy?bogus=1", "/v1/claims/ml-serve/no-such-claim/history",
]


@pytest.mark.parametrize("path", READS)
def test_head_answers_with_the_status_and_headers_of_get_and_no_body(client: TestClient[Litestar], path: str) -> None:
    got = client.get(path)
    head = client.head(path)
    assert head.status_code == got.status_code, head.text
    assert head.content == b""
    assert dict(head.headers) == dict(got.headers)
    assert int(head.headers["content-length"]) == len(got.content) > 0


def test_head_without_a_token_is_a_401_like_get(make_client: Callable[[LedgerConfig], TestClient[Litestar]]) -> None:
    guarded = make_client(LedgerConfig.model_validate({"api": {"tokens": [{"name": "a", "token": TOKEN}]}}))
    got, head = guarded.get("/v1/occupancy"), guarded.head("/v1/occupancy")
    assert (head.status_code, head.content, dict(head.headers)) == (401, b"", dict(got.headers))
    assert head.headers["www-authenticate"] == "Bearer"
    authorized = guarded.head("/v1/occupancy", headers={"Authorization": f"Bearer {TOKEN}"})
    assert (authorized.status_code, authorized.content) == (200, b"")


def test_the_openapi_document_lists_head_next_to_get_with_its_own_operation_id(client: TestClient[Litestar]) -> None:
    paths = client.get("/schema/openapi.json").json()["paths"]
    assert paths["/v1/occupancy"]["get"]["operationId"] == "getOccupancy"
    assert paths["/v1/occupancy"]["head"]["operationId"] == "headOccupancy"
    assert paths["/v1/events"]["head"]["operationId"] == "headListEvents"
    reads = [path for path in paths if path.startswith("/v1/") or path in ("/healthz", "/readyz", "/metrics")]
    assert len(reads) == 13
    assert all(set(paths[path]) >= {"get", "head"} for path in reads)


def test_the_openapi_document_gives_after_position_the_exact_bigint_bounds(client: TestClient[Litestar]) -> None:
    parameters = client.get("/schema/openapi.json").json()["paths"]["/v1/events"]["get"]["parameters"]
    schema = next(p["schema"] for p in parameters if p["name"] == "afterPosition")
    # Written as a float, 2**63 - 1 read back as 2**63: one past what the endpoint takes.
    assert (schema["minimum"], schema["maximum"]) == (0, 2**63 - 1)
    assert client.get(f"/v1/events?afterPosition={2**63 - 1}").status_code == 200
    assert client.get(f"/v1/events?afterPosition={2**63}").status_code == 422


SCHEMA_PAGES = [
    # Litestar's default OpenAPI pages (Redoc at /schema itself), and a 404 for any other name: problem details, as
    # every error (Litestar's own answer there is an HTML page).
    ("/schema", 200, "text/html; charset=utf-8"), ("/schema/redoc", 200, "text/html; charset=utf-8"),
    ("/schema/openapi.json", 200, "application/vnd.oai.openapi+json"),
    ("/schema/openapi.yaml", 200, "application/vnd.oai.openapi"),
    ("/schema/openapi.yml", 200, "application/vnd.oai.openapi"),
    ("/schema/swagger", 200, "text/html; charset=utf-8"), ("/schema/elements", 200, "text/html; charset=utf-8"),
    ("/schema/rapidoc", 200, "text/html; charset=utf-8"),
    ("/schema/oauth2-redirect.html", 200, "text/html; charset=utf-8"),
    ("/schema/no-such-page", 404, "application/problem+json"),
]


@pytest.mark.parametrize("path", ["/schema/no-such-page", "/schema/nope/deeper", "/schema/missing.json"])
def test_an_unknown_schema_page_is_a_problem_details_404(client: TestClient[Litestar], path: str) -> None:
    got = client.get(path)
    assert (got.status_code, got.headers["content-type"]) == (404, "application/problem+json")
    body = got.json()
    assert (body["status"], body["title"]) == (404, "Not Found")


@pytest.mark.parametrize(("path", "status", "media_type"), SCHEMA_PAGES)
def test_head_on_a_schema_page_answers_like_get_without_the_body(client: TestClient[Litestar], path: str, status: int,
                                                                 media_type: str) -> None:
    got = client.get(path)
    head = client.head(path)  # was a 405: Litestar registers the OpenAPI pages for GET only
    assert (got.status_code, got.headers["content-type"]) == (status, media_type)
    assert (head.status_code, head.content, dict(head.headers)) == (status, b"", dict(got.headers))
    assert int(head.headers["content-length"]) == len(got.content) > 0


def test_the_openapi_document_does_not_list_its_own_pages(client: TestClient[Litestar]) -> None:
    assert not [path for path in client.get("/schema/openapi.json").json()["paths"] if path.startswith("/schema")]


@pytest.mark.parametrize("headers", [
    {}, {"Origin": "https://dashboard.example", "Access-Control-Request-Method": "GET",
         "Access-Control-Request-Headers": "authorization"},
])
@pytest.mark.parametrize("path", ["/v1/occupancy?at=2026-11-02T09:30:00Z", "/v1/claims/ml-serve/shared-gpu/history"])
def test_options_needs_no_token_and_answers_only_the_allowed_methods(
        make_client: Callable[[LedgerConfig], TestClient[Litestar]], path: str, headers: dict[str, str]) -> None:
    guarded = make_client(LedgerConfig.model_validate({"api": {"tokens": [{"name": "a", "token": TOKEN}]}}))
    response = guarded.options(path, headers=headers)
    assert (response.status_code, dict(response.headers), response.content) == \
        (204, {"allow": "GET, HEAD, OPTIONS"}, b"")  # no CORS headers: the API does not offer CORS
    assert guarded.get(path).status_code == 401  # the request a preflight announces still needs the token


def _token(body: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


def test_a_page_token_of_one_list_is_refused_by_another_taking_the_same_parameters(
        client: TestClient[Litestar]) -> None:
    # /v1/quotas and /v1/pending both take at, cluster and limit: a quotas token read by pending skipped its
    # only pending claim (200, "claims": []) instead of being refused.
    quotas = client.get("/v1/quotas", params={"at": AT, "limit": 1}).json()
    assert quotas["nextPageToken"] is not None
    pending = client.get("/v1/pending", params={"at": AT, "limit": 1, "pageToken": quotas["nextPageToken"]})
    assert pending.status_code == 422, pending.text
    assert pending.json()["detail"] == FOREIGN_TOKEN
    # Its own token still pages.
    again = client.get("/v1/quotas", params={"at": AT, "limit": 1, "pageToken": quotas["nextPageToken"]})
    assert again.status_code == 200, again.text


def test_a_page_token_holding_a_lone_surrogate_is_a_422_not_a_500(client: TestClient[Litestar]) -> None:
    first = client.get("/v1/occupancy", params={"at": AT, "limit": 1}).json()
    token = json.loads(base64.urlsafe_b64decode(first["nextPageToken"] + "=" * (-len(first["nextPageToken"]) % 4)))
    token["k"][1] = "\ud800"  # json.dumps writes it as the escape \ud800, which json.loads reads back
    response = client.get("/v1/occupancy", params={"at": AT, "limit": 1, "pageToken": _token(token)})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "pageToken is not a token this API issued"


@pytest.mark.parametrize(("method", "path", "status", "title"), [
    ("GET", "/v1/occupancy?at=yesterday", 422, "Unprocessable Content"),       # a value Litestar cannot take
    ("GET", "/v1/occupancy?deviceClass=no.such.class", 404, "Not Found"),     # a ledger error
    ("GET", "/v1/usage?from=2026-11-02T10:00:00Z&to=2026-11-02T09:00:00Z", 422, "Unprocessable Content"),
    ("DELETE", "/v1/occupancy", 405, "Method Not Allowed"),
])
def test_a_problems_title_is_the_status_phrase_as_rfc_9457_asks_for_type_about_blank(
        client: TestClient[Litestar], method: str, path: str, status: int, title: str) -> None:
    got = client.request(method, path)

    body = got.json()
    assert (got.status_code, body["type"], body["status"], body["title"]) == (status, "about:blank", status, title)
    assert body["detail"]  # what was wrong is said in the detail


@pytest.mark.parametrize(("method", "path"), [("DELETE", "/v1/occupancy"), ("POST", "/v1/usage"),
                                              ("PUT", "/v1/claims/ml-serve/shared-gpu/history"), ("POST", "/healthz"),
                                              ("DELETE", "/schema"), ("POST", "/schema/openapi.json"),
                                              ("DELETE", "/schema/swagger"), ("PATCH", "/schema/openapi.yaml")])
def test_a_405_lists_the_allowed_methods_in_the_order_options_gives_them(
        client: TestClient[Litestar], method: str, path: str) -> None:
    refused = client.request(method, path)
    options = client.options(path)
    assert refused.status_code == 405
    assert refused.headers["allow"] == options.headers["allow"] == "GET, HEAD, OPTIONS"
