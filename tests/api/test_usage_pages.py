"""``GET /v1/usage`` pages: pinned to the first page's instant, and the page token checked before the query.

The window ends in the future, so "now" decides how many hours have happened; the app's clock is a fake
that the tests move between pages, as time moves between a client's requests.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from api.app import create_app
from ledger import services
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle
from tests import factories as f

WINDOW = {"from": f.stamp(2), "to": f.stamp(24 * 60)}
"""From minute 2 (when every claim below is allocated) to a day after T0: past both clock readings."""
FIRST, LATER = f.at(62), f.at(122)
"""The clock when page 1 is asked for, and when the next pages are (an hour later)."""


class Clock:
    """A clock that reads ``now`` until a test sets it to another instant."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture()
def three_teams(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    """Teams a, b and c each hold one GPU from minute 2; a and b still hold it, c released it at minute 92."""
    pool = f.uid("pool")
    gpus = [f.gpu(f"gpu-{n}") for n in range(3)]
    lines: list[tuple[str, Any, float]] = [
        ("ADDED", f.resource_slice(name=f.uid("slice"), pool=pool, devices=list(gpus)), 1)]
    released: list[tuple[str, Any, float]] = []
    for n, team in enumerate("abc"):
        ns, claim_uid = f.uid(f"ns-{team}"), f.uid("claim")
        claim = f.claim(name="train", namespace=ns, claim_uid=claim_uid, results=[f"gpu-{n}"], allocated_at=2,
                        pool=pool)
        lines += [("ADDED", f.namespace(ns, team), 0), ("ADDED", claim, 2)]
        if team == "c":
            released.append(("DELETED", claim, 92))
    ledger.replay(f.history(tmp_path / "h.jsonl", lines + released))
    return ledger


@pytest.fixture()
def clock() -> Clock:
    return Clock(FIRST)


@pytest.fixture()
def api(three_teams: LedgerHandle, clock: Clock) -> Iterator[TestClient[Litestar]]:
    with TestClient(create_app(db=three_teams.db, config=DEFAULT, clock=clock)) as client:
        yield client


def get_ok(api: TestClient[Litestar], **params: Any) -> Any:
    response = api.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("question", [{"groupBy": "team"}, {"groupBy": "team", "step": "PT1H"}],
                         ids=["from-rollups", "hourly-steps"])
def test_later_pages_answer_at_the_first_pages_instant_while_time_moves_on(
        api: TestClient[Litestar], three_teams: LedgerHandle, clock: Clock, question: dict[str, str]) -> None:
    whole = get_ok(api, **WINDOW, **question)
    first = get_ok(api, **WINDOW, **question, limit=1)
    clock.now = LATER
    # The rollup job runs in between: hour 10:00-11:00 (minutes 60-120) is rolled, past the first instant.
    assert services.rollup_usage(three_teams.db, end=LATER) >= 1
    pages, token = [first], first["nextPageToken"]
    while token is not None:
        pages.append(get_ok(api, **WINDOW, **question, limit=1, pageToken=token))
        token = pages[-1]["nextPageToken"]

    # At minute 62 each team has held its GPU for the 60 minutes since minute 2: 1 device-hour each, all
    # in the first hourly bucket [minute 2, minute 62); at minute 122, a and b would have 2 and c 1.5.
    expected = [{"team": team, "deviceClass": "gpu.example.com", "driver": "gpu.example.com", "deviceHours": 1.0}
                | ({"start": f.stamp(2), "end": f.stamp(62)} if "step" in question else {}) for team in "abc"]
    assert whole["rows"] == expected
    assert [row for page in pages for row in page["rows"]] == expected
    assert [len(page["rows"]) for page in pages] == [1, 1, 1]


def test_a_page_token_whose_instant_is_not_a_time_is_a_422_problem(api: TestClient[Litestar]) -> None:
    token = get_ok(api, **WINDOW, limit=1)["nextPageToken"]
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**body, "at": "yesterday"}).encode()).decode().rstrip("=")
    response = api.get("/v1/usage", params={**WINDOW, "limit": 1, "pageToken": forged})
    assert response.status_code == 422, response.text
    # Refused as every edited token is (api.pagination.decode checks the instant it carries).
    assert response.json()["detail"] == "pageToken is not a token this API issued"


@pytest.mark.parametrize("accept", ["application/json", "text/csv"])
@pytest.mark.parametrize("token", ["abc", "e30", base64.urlsafe_b64encode(b'{"o":1,"at":null,"q":"x"}').decode()],
                         ids=["not-base64-json", "empty-object", "another-query"])
def test_a_bad_page_token_is_a_422_problem_for_csv_as_for_json(api: TestClient[Litestar], accept: str,
                                                               token: str) -> None:
    response = api.get("/v1/usage", params={**WINDOW, "pageToken": token}, headers={"Accept": accept})
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "pageToken" in response.json()["detail"]


def test_a_bad_page_token_is_refused_before_the_usage_query_runs(
        api: TestClient[Litestar], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []

    def usage(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return {"from": WINDOW["from"], "to": WINDOW["to"], "groupBy": "team", "step": None, "rows": []}

    monkeypatch.setattr(services, "usage", usage)
    for accept in ("application/json", "text/csv"):
        response = api.get("/v1/usage", params={**WINDOW, "pageToken": "abc"}, headers={"Accept": accept})
        assert response.status_code == 422
    assert calls == []


def test_a_valid_page_token_on_a_csv_request_answers_the_whole_result(api: TestClient[Litestar]) -> None:
    token = get_ok(api, **WINDOW, limit=1)["nextPageToken"]
    response = api.get("/v1/usage", params={**WINDOW, "limit": 1, "pageToken": token}, headers={"Accept": "text/csv"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    # A header and the three teams' rows of 1 device-hour each (the clock still reads minute 62).
    assert [line.split(",")[0::5] for line in response.text.splitlines()] == \
        [["group", "deviceHours"], ["a", "1.0"], ["b", "1.0"], ["c", "1.0"]]
