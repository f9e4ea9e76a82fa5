"""Every expected value of seed-lab.expected.json through HTTP, plus timeline, history, pagination and CSV."""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy import event

from api.app import create_app
from api.parameters import query_names
from ledger import services
from ledger.config import DEFAULT
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from tests.api.test_parameter_edges import FOREIGN_TOKEN
from tests.paths import HISTORIES, REAL

EXPECTED: dict[str, Any] = json.loads((HISTORIES / "seed-lab.expected.json").read_text())
CHECKS = EXPECTED["checks"]
TIME_SLACK = timedelta(seconds=5)  # the history observes each change one second after the expected minute


def ok(client: TestClient[Litestar], path: str, **params: Any) -> Any:
    response = client.get(path, params=params)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("check", CHECKS, ids=[c["at"] for c in CHECKS])
def test_occupancy_over_http_matches_every_check(client: TestClient[Litestar], check: dict[str, Any]) -> None:
    body = ok(client, "/v1/occupancy", at=check["at"])
    assert body["nextPageToken"] is None
    totals = body["totals"]
    for field, key in (("devices_total", "devices"), ("devices_allocated", "allocated"),
                       ("devices_free", "free")):
        if field in check:
            assert totals[key] == check[field]
    held = {d["device"]: f"{a['namespace']}/{a['claim']}" for d in body["devices"] for a in d["allocations"]}
    if "allocated" in check:
        assert held == check["allocated"]
    if "team_devices" in check:
        assert dict(Counter(a["team"] for d in body["devices"] for a in d["allocations"])) == check["team_devices"]
    if "shared_devices" in check:
        shared = {d["device"]: sorted(c for a in d["allocations"] for c in a["consumers"]) for d in body["devices"]
                  if sum(len(a["consumers"]) for a in d["allocations"]) > 1}
        assert shared == check["shared_devices"]
    if "pending_claims" in check:
        pending = ok(client, "/v1/claims", state="pending", at=check["at"])
        assert {f"{c['namespace']}/{c['name']}": sum(c["requested"].values()) for c in pending["claims"]} \
            == check["pending_claims"]
    if "idle_claims" in check:
        idle = ok(client, "/v1/reports/idle-claims", at=check["at"])
        rows = {f"{c['namespace']}/{c['name']}": c for c in idle["claims"]}
        assert set(rows) == set(check["idle_claims"])
        for name, expected in check["idle_claims"].items():
            assert rows[name]["category"] == "unreserved"
            assert abs(parse_time(rows[name]["idleSince"]) - parse_time(expected["idle_since"])) <= TIME_SLACK


def test_usage_by_team_over_http_matches(client: TestClient[Litestar]) -> None:
    window = EXPECTED["device_hours"]
    body = ok(client, "/v1/usage", **{"from": window["from"], "to": window["to"], "groupBy": "team"})
    hours: dict[str, float] = defaultdict(float)
    for row in body["rows"]:
        hours[row["team"]] += row["deviceHours"]
    assert set(hours) == set(window["by_team"])
    for team, expected in window["by_team"].items():
        assert hours[team] == pytest.approx(expected, abs=window["tolerance_hours"])


def test_hourly_steps_add_up_to_the_whole_window(client: TestClient[Litestar]) -> None:
    window = EXPECTED["device_hours"]
    whole = ok(client, "/v1/usage", **{"from": window["from"], "to": window["to"]})
    steps = ok(client, "/v1/usage", **{"from": window["from"], "to": window["to"], "step": "PT1H"})
    assert {r["start"] for r in steps["rows"]} == {"2026-11-02T09:00:00Z", "2026-11-02T10:00:00Z",
                                                    "2026-11-02T11:00:00Z"}
    per_team: dict[str, float] = defaultdict(float)
    for row in steps["rows"]:
        per_team[row["team"]] += row["deviceHours"]
    assert per_team == pytest.approx({r["team"]: r["deviceHours"] for r in whole["rows"]}, abs=1e-5)
    # nlp holds gpu-1 (shared-gpu) and gpu-4 (ext-0) all through 11:00-12:00: 2 device-hours.
    assert next(r for r in steps["rows"] if r["team"] == "nlp" and r["start"].startswith("2026-11-02T11"))[
        "deviceHours"] == pytest.approx(2.0)


def test_csv_export_opens_as_a_table_with_the_documented_columns(client: TestClient[Litestar]) -> None:
    window = EXPECTED["device_hours"]
    response = client.get("/v1/usage", params={"from": window["from"], "to": window["to"]},
                          headers={"Accept": "text/csv"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(response.text)))
    assert list(table[0]) == ["group", "deviceClass", "driver", "start", "end", "deviceHours", "cost", "currency"]
    assert {r["group"]: float(r["deviceHours"]) for r in table} == pytest.approx(window["by_team"], abs=0.01)


@pytest.mark.parametrize(("accept", "csv_wanted"), [
    ("text/csv;q=0.1, application/json", False), ("application/json;q=0.5, text/csv", True), ("text/*", True),
    ("*/*", False), ("application/json", False),
    # q=0 means "not acceptable" (RFC 9110 §12.5.1); with nothing acceptable left the answer is JSON.
    ("text/csv;q=0", False), ("text/*, text/csv;q=0", False), ("text/csv;q=0.0, */*", False),
    ("application/json;q=0, text/csv;q=0", False), ("image/png", False), ("*/*;q=0, text/csv", True),
])
def test_usage_answers_csv_only_when_the_client_prefers_it(client: TestClient[Litestar], accept: str,
                                                          csv_wanted: bool) -> None:
    window = EXPECTED["device_hours"]
    response = client.get("/v1/usage", params={"from": window["from"], "to": window["to"]}, headers={"Accept": accept})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv" if csv_wanted else "application/json")


def test_shared_gpu_history_is_in_order_with_times(client: TestClient[Litestar]) -> None:
    body = ok(client, "/v1/claims/ml-serve/shared-gpu/history")
    seen = [(e["type"], e["occurredAt"]) for e in body["events"]]
    assert seen == [
        ("ClaimCreated", "2026-11-02T09:09:00Z"),
        ("ClaimAllocated", "2026-11-02T09:10:00Z"),  # status.allocation.allocationTimestamp
        ("ClaimReserved", "2026-11-02T09:10:01Z"),  # serve-a, dated when observed (no managedFields)
        ("ClaimReserved", "2026-11-02T09:11:01Z"),  # serve-b
        ("ClaimUnreserved", "2026-11-02T10:30:01Z"),  # serve-a gone
        ("ClaimUnreserved", "2026-11-02T11:00:01Z"),  # serve-b gone; the claim stays allocated
    ]
    assert [e["payload"]["consumer"]["name"] for e in body["events"] if "consumer" in e["payload"]] == \
        ["serve-a", "serve-b", "serve-a", "serve-b"]
    assert [e["streamPosition"] for e in body["events"]] == [1, 2, 3, 4, 5, 6]


def test_gpu_1_timeline_shows_its_publication_and_the_shared_claim(client: TestClient[Litestar],
                                                                   seeded: LedgerHandle) -> None:
    body = ok(client, "/v1/devices/gpu.example.com/lab-node/gpu-1/timeline",
              **{"from": "2026-11-02T08:00:00Z", "to": "2026-11-02T13:00:00Z"})
    assert {e["cluster"] for e in body["entries"]} == {seeded.cluster}
    assert [(e["kind"], e["from"], e["to"], e.get("claim")) for e in body["entries"]] == [
        ("inventory", "2026-11-02T08:50:00Z", None, None),  # the slice's creationTimestamp
        ("allocation", "2026-11-02T09:10:00Z", None, "shared-gpu"),
    ]
    missing = client.get("/v1/devices/gpu.example.com/lab-node/gpu-99/timeline")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    early = client.get("/v1/devices/gpu.example.com/lab-node/gpu-1/timeline", params={"to": "1960-01-01T00:00:00Z"})
    assert early.status_code == 422
    assert early.json()["detail"] == "from (by default 1970-01-01T00:00:00Z) must be before to"
    before = datetime.now(UTC).replace(microsecond=0)
    late = client.get("/v1/devices/gpu.example.com/lab-node/gpu-1/timeline", params={"from": "2999-01-01T00:00:00Z"})
    after = datetime.now(UTC)
    assert late.status_code == 422
    said = re.fullmatch(r"from must be before to \(by default now, (\S+)\)", late.json()["detail"])
    assert said is not None, late.json()["detail"]
    assert before <= parse_time(said.group(1)) <= after  # the default it used, so the user sees why


def walk(client: TestClient[Litestar], path: str, **params: Any) -> list[Any]:
    """Every page of a paged answer, from the first (``params``) by each ``nextPageToken`` in turn."""
    pages = [ok(client, path, **params)]
    while pages[-1]["nextPageToken"] is not None:
        pages.append(ok(client, path, **params, pageToken=pages[-1]["nextPageToken"]))
    return pages


def test_a_claim_history_is_paged_one_event_at_a_time_in_the_same_order(client: TestClient[Litestar]) -> None:
    whole = ok(client, "/v1/claims/ml-serve/shared-gpu/history")
    assert whole["nextPageToken"] is None and len(whole["events"]) == 6  # the six events worked out above

    pages = walk(client, "/v1/claims/ml-serve/shared-gpu/history", limit=1)

    assert [len(p["events"]) for p in pages] == [1] * 6
    assert [e for p in pages for e in p["events"]] == whole["events"]
    assert all(p["uids"] == whole["uids"] for p in pages)
    foreign = client.get("/v1/claims/ml-train/big/history", params={"limit": 1, "pageToken": pages[0]["nextPageToken"]})
    assert foreign.status_code == 422, foreign.text  # a token of another claim's history


def test_a_device_timeline_is_paged_and_without_to_keeps_the_first_page_window(client: TestClient[Litestar],
                                                                                seeded: LedgerHandle) -> None:
    path = "/v1/devices/gpu.example.com/lab-node/gpu-1/timeline"
    pages = walk(client, path, **{"from": "2026-11-02T08:00:00Z"}, limit=1)

    # The inventory interval, then the shared claim's allocation (as the unpaged test above worked out).
    assert [[(e["kind"], e["from"]) for e in p["entries"]] for p in pages] == [
        [("inventory", "2026-11-02T08:50:00Z")], [("allocation", "2026-11-02T09:10:00Z")]]
    assert pages[0]["to"] == pages[1]["to"]  # the default "now" of the first page, carried by the token
    other = client.get(path, params={"from": "2026-11-02T08:00:01Z", "limit": 1,
                                     "pageToken": pages[0]["nextPageToken"]})
    assert other.status_code == 422, other.text  # another window is another query


def test_a_device_of_one_name_in_two_clusters_has_entries_that_name_their_cluster(
        client: TestClient[Litestar], seeded: LedgerHandle) -> None:
    services.replay_files(seeded.db, [HISTORIES / "seed-lab.jsonl"], cluster="lab-2")
    path, window = "/v1/devices/gpu.example.com/lab-node/gpu-1/timeline", {"from": "2026-11-02T08:00:00Z"}
    both = ok(client, path, **window, to="2026-11-02T13:00:00Z")["entries"]
    assert sorted((e["cluster"], e["kind"]) for e in both) == sorted(
        (c, k) for c in (seeded.cluster, "lab-2") for k in ("inventory", "allocation"))
    one = ok(client, path, **window, to="2026-11-02T13:00:00Z", cluster="lab-2")["entries"]
    assert [(e["cluster"], e["kind"]) for e in one] == [("lab-2", "inventory"), ("lab-2", "allocation")]


def test_an_api_served_for_one_cluster_answers_for_that_cluster_alone(seeded: LedgerHandle) -> None:
    # serve --cluster lab-2 over a ledger of two clusters: every answer is lab-2's, and asking for the other
    # cluster is refused (it was answered, and /v1/events mixed both clusters' events).
    services.replay_files(seeded.db, [HISTORIES / "seed-lab.jsonl"], cluster="lab-2")
    with TestClient(create_app(db=seeded.db, config=DEFAULT, cluster="lab-2")) as one, \
            TestClient(create_app(db=seeded.db, config=DEFAULT)) as every:
        at = {"at": "2026-11-02T12:00:00Z"}
        assert ok(one, "/v1/occupancy", **at) == ok(every, "/v1/occupancy", **at, cluster="lab-2")
        assert ok(one, "/v1/claims", **at) == ok(every, "/v1/claims", **at, cluster="lab-2")
        events = ok(one, "/v1/events", limit=1000)["events"]
        both = ok(every, "/v1/events", limit=1000)["events"]
        # The same history twice: half the events are lab-2's, in their global position order.
        assert len(both) == 2 * len(events) and events == [e for e in both if e["cluster"] == "lab-2"]
        assert ok(every, "/v1/events", limit=1000, cluster="lab-2")["events"] == events
        for path, params in [("/v1/occupancy", {}), ("/v1/claims", {}), ("/v1/events", {}),
                             ("/v1/usage", {"from": "2026-11-02T08:00:00Z", "to": "2026-11-02T12:00:00Z",
                                            "groupBy": "team"})]:
            refused = one.get(path, params={**params, "cluster": seeded.cluster})
            assert refused.status_code == 422, path
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["detail"] == ("cluster: this API answers for cluster 'lab-2' only "
                                                f"(serve --cluster), not {seeded.cluster!r}; leave cluster out")
        assert ok(one, "/v1/events", limit=1000, cluster="lab-2")["events"] == events


def test_walking_every_page_of_claims_and_events_returns_each_row_once(client: TestClient[Litestar]) -> None:
    everything = ok(client, "/v1/claims", at="2026-11-02T12:00:00Z", limit=1000)["claims"]
    assert len(everything) == 6  # every claim created in the history, the deleted train-0 claim included
    walked: list[str] = []
    token = None
    while True:
        params: dict[str, Any] = {"at": "2026-11-02T12:00:00Z", "limit": 2}
        if token:
            params["pageToken"] = token
        page = ok(client, "/v1/claims", **params)
        walked.extend(c["uid"] for c in page["claims"])
        token = page["nextPageToken"]
        if token is None:
            break
    assert walked == [c["uid"] for c in everything]
    positions: list[int] = []
    token = None
    while True:
        params = {"limit": 7} | ({"pageToken": token} if token else {})
        page = ok(client, "/v1/events", **params)
        positions.extend(e["globalPosition"] for e in page["events"])
        token = page["nextPageToken"]
        if token is None:
            break
    all_events = ok(client, "/v1/events", limit=1000)["events"]
    assert positions == [e["globalPosition"] for e in all_events] and len(set(positions)) == len(positions) == 51


def test_a_page_token_keeps_answering_the_first_pages_question(client: TestClient[Litestar]) -> None:
    first = ok(client, "/v1/occupancy", limit=3)
    second = ok(client, "/v1/occupancy", limit=3, pageToken=first["nextPageToken"])
    assert second["at"] == first["at"]
    foreign = client.get("/v1/occupancy", params={"limit": 3, "node": "other",
                                                  "pageToken": first["nextPageToken"]})
    assert foreign.status_code == 422
    assert foreign.json()["detail"] == FOREIGN_TOKEN


@pytest.mark.parametrize("path", ["/v1/occupancy", "/v1/claims", "/v1/events", "/v1/pending"])
@pytest.mark.parametrize("payload", [b"[" * 1000, b"{}" * 3000])
def test_a_forged_page_token_nested_deep_or_too_long_is_a_422_problem(client: TestClient[Litestar], path: str,
                                                                       payload: bytes) -> None:
    import base64

    token = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    response = client.get(path, params={"pageToken": token})

    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "pageToken" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/occupancy", "/v1/claims", "/v1/events"])
@pytest.mark.parametrize("offset", [True, -1, 1.5, "2"])
def test_a_page_token_whose_offset_is_not_a_count_is_a_422_problem(client: TestClient[Litestar], path: str,
                                                                   offset: object) -> None:
    # A real token of this very query, its offset replaced: JSON true passed an isinstance(int) check and
    # reached the SQL as a boolean (a 500 on /v1/events).
    import base64
    import json

    first = client.get(path, params={"limit": 1})
    assert first.status_code == 200
    token = first.json()["nextPageToken"]
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**body, "o": offset}).encode()).decode().rstrip("=")
    response = client.get(path, params={"limit": 1, "pageToken": forged})

    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["detail"] == "pageToken is not a token this API issued"  # not "parameters changed"


@pytest.mark.parametrize(("path", "params", "status"), [
    ("/v1/occupancy", {"at": "yesterday"}, 422),
    ("/v1/occupancy", {"at": "2026-11-02T09:30:00"}, 422),
    ("/v1/occupancy", {"limit": "-1"}, 422),
    ("/v1/occupancy", {"limit": "abc"}, 422),
    ("/v1/occupancy", {"limit": "1001"}, 422),
    ("/v1/usage", {"from": "2026-11-02T12:00:00Z", "to": "2026-11-02T09:00:00Z"}, 422),
    ("/v1/usage", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "groupBy": "colour"}, 422),
    ("/v1/usage", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "step": "PT1S"}, 422),
    ("/v1/usage", {"to": "2026-11-02T12:00:00Z"}, 400),  # a required parameter missing
    ("/v1/reports/idle-claims", {"minIdle": "soon"}, 422),
    ("/v1/reports/idle-claims", {"minIdle": "PT1H1H"}, 422),  # pydantic alone adds the two hours
    ("/v1/usage", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "step": "PT30M30M"}, 422),
    ("/v1/claims", {"state": "sleeping"}, 422),
    ("/v1/claims", {"origin": "borrowed"}, 422),
    ("/v1/claims/ml-train/no-such-claim/history", {}, 404),
    ("/v1/events", {"afterPosition": "-3"}, 422),
    ("/v1/events", {"type": "claimallocated"}, 422),
    ("/v1/events", {"type": "Bogus"}, 422),
])
def test_bad_values_are_422_and_a_missing_parameter_400_problem_details(client: TestClient[Litestar], path: str,
                                                                        params: dict[str, str], status: int) -> None:
    response = client.get(path, params=params)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body["detail"]


@pytest.mark.parametrize(("path", "params", "name", "python_name"), [
    ("/v1/usage", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "groupBy": "colour"}, "groupBy",
     "group_by"),
    ("/v1/claims", {"state": "sleeping"}, "state", "claim_state"),
    ("/v1/events", {"afterPosition": "-3"}, "afterPosition", "after_position"),
])
def test_a_bad_parameter_is_named_as_the_client_spells_it(client: TestClient[Litestar], path: str,
                                                          params: dict[str, str], name: str, python_name: str) -> None:
    detail = client.get(path, params=params).json()["detail"]
    assert detail.startswith(f"{name}: "), detail
    assert python_name not in detail


@pytest.mark.parametrize(("path", "params"), [
    ("/v1/reports/idle-claims", {"minIdle": "P99999999999D"}),
    ("/v1/usage", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "step": "9" * 40}),
])
def test_a_duration_too_long_is_a_422_saying_out_of_range_and_the_longest(client: TestClient[Litestar], path: str,
                                                                          params: dict[str, str]) -> None:
    response = client.get(path, params=params)
    assert response.status_code == 422
    name, value = next((k, v) for k, v in params.items() if k in ("minIdle", "step"))
    shortest = ("PT0.000001S (0.000001 seconds; durations are counted in whole microseconds)" if name == "step"
                else "0")
    assert response.json()["detail"] == (f"{name}: {value!r} is out of range; the longest duration accepted is "
                                         f"P36500D (100 years, 3153600000 seconds), the shortest {shortest}")


HINT = "; a '+' in a URL query means a space: send the offset's '+' as %2B"


@pytest.mark.parametrize(("query", "detail"), [
    ("/v1/occupancy?at=2026-11-02T10:30:00+01:00",
     "at: not an RFC 3339 time with a zone: '2026-11-02T10:30:00 01:00'" + HINT),
    ("/v1/usage?from=2026-11-02T09:00:00.5+01:00&to=2026-11-02T12:00:00Z",
     "from: not an RFC 3339 time with a zone: '2026-11-02T09:00:00.5 01:00'" + HINT),
    ("/v1/occupancy?at=2026-11-02 10:30:00", "at: not an RFC 3339 time with a zone: '2026-11-02 10:30:00'"),
    ("/v1/occupancy?at=yesterday", "at: not an RFC 3339 time with a zone: 'yesterday'"),
])
def test_an_offset_whose_plus_arrived_as_a_space_gets_a_hint_to_encode_it(client: TestClient[Litestar], query: str,
                                                                          detail: str) -> None:
    response = client.get(query)  # the query string as written: '+' is not percent-encoded
    assert response.status_code == 422
    assert response.json()["detail"] == detail


@pytest.mark.parametrize("path", [
    "/v1/occupancy", "/v1/claims", "/v1/claims/ml-serve/shared-gpu/history", "/v1/quotas", "/v1/shared",
    "/v1/pending", "/v1/reports/idle-claims", "/v1/devices/gpu.example.com/lab-node/gpu-1/timeline",
    "/v1/usage?from=2026-11-02T09:00:00Z&to=2026-11-02T12:00:00Z",
])
def test_an_empty_cluster_is_a_422_saying_to_leave_it_out(client: TestClient[Litestar], path: str) -> None:
    # It used to mean every cluster, while an empty at= was refused.
    response = client.get(path + ("&" if "?" in path else "?") + "cluster=")
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == "cluster: empty; leave the parameter out to ask about every cluster"


def test_an_app_for_an_empty_cluster_is_refused(seeded: LedgerHandle) -> None:
    from api.app import create_app
    from ledger.config import DEFAULT
    from ledger.errors import Invalid

    with pytest.raises(Invalid, match=r"^cluster: empty; leave it out to answer for every cluster$"):
        create_app(db=seeded.db, config=DEFAULT, cluster="")


def test_too_fine_a_step_says_how_many_buckets_and_the_smallest_step(client: TestClient[Litestar]) -> None:
    # 09:00-12:00 is 10,800 s: one-second steps give 10,800 buckets; 10,000 at most means 1.08 s, and 1.08 s
    # is answered (10,000 buckets) while one microsecond less is not.
    window = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}
    response = client.get("/v1/usage", params={**window, "step": "1"})
    assert response.status_code == 422
    assert response.json()["detail"] == ("step 1 s gives 10800 buckets over this window; at most 10000 are "
                                         "answered, so the step must be at least 1.08 s here")
    assert client.get("/v1/usage", params={**window, "step": "1.08"}).status_code == 200
    assert client.get("/v1/usage", params={**window, "step": "1.079999"}).status_code == 422


def test_step_lengths_in_the_too_fine_message_are_plain_decimals(client: TestClient[Litestar]) -> None:
    # 0001-01-01 to 9998-12-31T23:59:59 is 315,506,361,599 s: a 365-day step (31,536,000 s) gives 10,005 buckets,
    # and 10,000 at most means a step of 31,550,636.1599 s at least. `:g` wrote those as 3.1536e+07 and 3.15506e+07.
    wide = {"from": "0001-01-01T00:00:00Z", "to": "9998-12-31T23:59:59Z"}
    detail = client.get("/v1/usage", params={**wide, "step": "P365D"}).json()["detail"]
    assert detail.startswith("step 31536000 s gives 10005 buckets")
    assert detail.endswith("so the step must be at least 31550636.1599 s here")
    short = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T09:00:01Z"}
    assert client.get("/v1/usage", params={**short, "step": "PT0.000001S"}).json()["detail"] == (
        "step 0.000001 s gives 1000000 buckets over this window; at most 10000 are answered, so the step must be "
        "at least 0.0001 s here")


def test_a_step_near_the_last_datetime_cuts_its_last_bucket_at_to(client: TestClient[Litestar]) -> None:
    # from + step is past 9999-12-31: the bucket ends at ``to`` instead of overflowing (was a 500).
    response = client.get("/v1/usage", params={"from": "9998-01-01T00:00:00Z", "to": "9998-12-31T00:00:00Z",
                                               "step": "P3650D"})
    assert response.status_code == 200, response.text
    assert response.json()["rows"] == []  # nothing was allocated in 9998
    early = client.get("/v1/usage", params={"from": "2026-11-02T09:00:00Z", "to": "9998-12-31T00:00:00Z",
                                            "step": "P3650D", "limit": "1"})
    assert early.status_code == 200, early.text
    first = early.json()["rows"][0]
    assert (first["start"], first["end"]) == ("2026-11-02T09:00:00Z", "2036-10-30T09:00:00Z")


@pytest.mark.parametrize(("path", "params", "choices"), [
    ("/v1/usage", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "groupBy": "colour"},
     "team, namespace, deviceClass, model, node, cluster"),
    ("/v1/claims", {"state": "sleeping"}, "pending, allocated, deleted, all"),
    ("/v1/claims", {"origin": "borrowed"}, "manual, template, extended"),
])
def test_a_value_outside_a_fixed_set_is_answered_with_the_set(client: TestClient[Litestar], path: str,
                                                              params: dict[str, str], choices: str) -> None:
    detail = client.get(path, params=params).json()["detail"]
    assert detail.endswith(f"(one of: {choices})"), detail


@pytest.mark.parametrize(("path", "params", "prefix"), [
    ("/v1/shared", {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}, "unknown query parameters from, to"),
    ("/v1/occupancy", {"at": "2026-11-02T09:30:00Z", "deviceclass": "gpu.example.com"},
     "unknown query parameter deviceclass"),
    ("/v1/claims", {"group_by": "team"}, "unknown query parameter group_by"),
])
def test_an_unknown_query_parameter_is_a_400_naming_it_and_the_known_ones(
        client: TestClient[Litestar], path: str, params: dict[str, str], prefix: str) -> None:
    response = client.get(path, params=params)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert detail.startswith(f"{prefix}: this endpoint takes "), detail
    assert "at" in detail.split("takes ", 1)[1].split(", ")


@pytest.mark.parametrize("query", ["at=2026-11-02T09:30:00Z&at=2026-11-02T12:00:00Z", "limit=1&limit=2"])
def test_a_repeated_query_parameter_is_a_400_not_one_of_the_values(client: TestClient[Litestar], query: str) -> None:
    response = client.get(f"/v1/occupancy?{query}")
    assert response.status_code == 400, response.text
    assert "given more than once" in response.json()["detail"]


@pytest.mark.parametrize("query", ["at=2026-11-02T09:30:00Z", "deviceclass=gpu", "limit=1&limit=2"])
def test_options_with_a_query_answers_as_options_without_one(client: TestClient[Litestar], query: str) -> None:
    # A CORS preflight is sent for the URL of the real request, query included.
    preflight = {"Origin": "https://dashboard.example", "Access-Control-Request-Method": "GET"}
    bare = client.options("/v1/occupancy", headers=preflight)
    queried = client.options(f"/v1/occupancy?{query}", headers=preflight)
    assert (bare.status_code, bare.headers["allow"]) == (204, "GET, HEAD, OPTIONS")
    assert (queried.status_code, dict(queried.headers), queried.content) == \
        (bare.status_code, dict(bare.headers), bare.content)


def test_every_time_parameter_is_documented_as_an_rfc_3339_date_time(client: TestClient[Litestar]) -> None:
    paths = client.get("/schema/openapi.json").json()["paths"]
    times = {(path, p["name"]): p["schema"] for path, item in paths.items()
             for p in item.get("get", {}).get("parameters", []) if p["name"] in ("at", "from", "to")}
    # at: occupancy, claims, idle claims, pending, quotas, shared; from/to: usage and a device's timeline. Each a
    # plain string of format date-time: generators read no format beside a oneOf of string and null.
    assert len(times) == 10
    assert {(s["type"], s["format"], "oneOf" in s) for s in times.values()} == {("string", "date-time", False)}, times
    # origin is left out for every origin; `null` is not one of its values (a 422).
    [origin] = [p["schema"] for p in paths["/v1/claims"]["get"]["parameters"] if p["name"] == "origin"]
    assert (origin["type"], origin["enum"]) == ("string", ["manual", "template", "extended"])


def test_every_endpoint_takes_exactly_the_query_parameters_its_openapi_document_lists(
        client: TestClient[Litestar]) -> None:
    documented = {path: {p["name"] for p in item["get"].get("parameters", []) if p["in"] == "query"}
                  for path, item in client.get("/schema/openapi.json").json()["paths"].items() if "get" in item}
    checked = 0
    for route in client.app.routes:
        for handler in getattr(route, "route_handlers", []):
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
            if path.startswith("/v1/") and "GET" in handler.http_methods:
                in_path = frozenset(re.findall(r"\{(\w+)\}", path))
                assert query_names(handler, in_path) == documented[path], path
                checked += 1
    assert checked == 10


def test_events_of_one_type_and_an_unknown_type_named_with_the_known_ones(client: TestClient[Litestar]) -> None:
    expected = json.loads((HISTORIES / "seed-lab.expected.json").read_text())
    allocated = ok(client, "/v1/events", type="ClaimAllocated", limit="1000")["events"]
    assert {e["type"] for e in allocated} == {"ClaimAllocated"}
    assert len(allocated) >= expected["events_expected_min"]["ClaimAllocated"] == 5
    detail = client.get("/v1/events", params={"type": "claimallocated"}).json()["detail"]
    assert "no event type 'claimallocated'" in detail and "ClaimAllocated" in detail


def test_a_missing_parameter_is_named_without_the_query_string(client: TestClient[Litestar]) -> None:
    response = client.get("/v1/usage", params={"to": "2026-11-02T12:00:00Z"})
    assert response.status_code == 400
    assert response.json()["detail"] == "Missing required query parameter 'from'"


def test_probes_and_metrics(client: TestClient[Litestar]) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready" and ready.json()["rebuilding"] is False
    metrics = client.get("/metrics").text
    assert "dra_ledger_database_up 1.0" in metrics
    assert "dra_ledger_read_models_rebuilding 0.0" in metrics
    assert 'dra_ledger_projection_lag_events{projection="device_allocations"} 0.0' in metrics


@pytest.mark.parametrize("path", ["/readyz", "/metrics"])
def test_a_probe_borrows_one_pooled_connection(client: TestClient[Litestar], seeded: LedgerHandle, path: str) -> None:
    # A probe every few seconds per replica; it borrowed three connections (ping, lag, pg_locks) from a pool of 15.
    client.get(path)  # the app's start-up work is done by the first request
    checkouts: list[object] = []

    def checked_out(*args: object) -> None:
        checkouts.append(args[0])

    event.listen(seeded.db.engine, "checkout", checked_out)
    try:
        assert client.get(path).status_code == 200
    finally:
        event.remove(seeded.db.engine, "checkout", checked_out)
    assert len(checkouts) == 1


def test_a_real_fixture_shows_share_ids_through_http(client: TestClient[Litestar], seeded: Any) -> None:
    for name in ("devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml",
                 "devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml",
                 "devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml"):
        seeded.replay(REAL / name, at=parse_time("2027-01-01T00:00:00Z"))
    body = ok(client, "/v1/occupancy", at="2027-01-01T00:00:00Z", pool="kind-worker")
    shares = [a["shareID"] for d in body["devices"] for a in d["allocations"]]
    assert len(shares) == 1 and shares[0]


@pytest.mark.parametrize("check", [c for c in CHECKS if "shared_devices" in c], ids=lambda c: c["at"])
def test_shared_devices_over_http_match(client: TestClient[Litestar], check: dict[str, Any]) -> None:
    body = ok(client, "/v1/shared", at=check["at"])
    shared = {device.rsplit("/", 1)[-1]: sorted(x["name"] for x in claim["consumers"])
              for claim in body["claims"] for device in claim["devices"]}
    assert shared == check["shared_devices"]
    assert body["totals"]["sharedClaims"] == len(check["shared_devices"])


def test_shared_is_paged_as_one_list_of_devices_then_counter_sets_then_claims(client: TestClient[Litestar],
                                                                               seeded: Any) -> None:
    # Real partitionable devices (KEP-4815's GPU and four partitions; DeviceNetwork's two devices of one counter
    # set) make two counter sets; the seed lab's claim shared by two pods (09:30) is one shared claim.
    for name in ("kep4815_resourceslice_counter-slice-sharedcounters-only_v1.yaml",
                 "kep4815_resourceslice_device-slice-gpu0-plus-4-partitions-consumescounters_v1.yaml",
                 "devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml",
                 "devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml"):
        seeded.replay(REAL / name, at=parse_time("2026-11-02T09:00:00Z"))
    whole = ok(client, "/v1/shared", at="2026-11-02T09:30:00Z", limit=1000)
    entries = [(n, e) for n in ("devices", "counterSets", "claims") for e in whole[n]]
    assert [n for n, _ in entries].count("counterSets") == 2 and [n for n, _ in entries].count("claims") == 1
    assert whole["nextPageToken"] is None

    pages, token = [], None
    while True:
        params: dict[str, Any] = {"at": "2026-11-02T09:30:00Z", "limit": 1}
        if token is not None:
            params["pageToken"] = token
        page = ok(client, "/v1/shared", **params)
        pages.append(page)
        token = page["nextPageToken"]
        if token is None:
            break

    # One entry a page, in the order devices, counterSets, claims, with every page's totals over all of them.
    assert len(pages) == len(entries)
    assert [(n, e) for p in pages for n in ("devices", "counterSets", "claims") for e in p[n]] == entries
    assert all(p["totals"] == whole["totals"] for p in pages)
    first = ok(client, "/v1/shared", at="2026-11-02T09:30:00Z", limit=1)
    response = client.get("/v1/shared", params={"at": "2026-11-02T10:40:00Z", "limit": 1,
                                                "pageToken": first["nextPageToken"]})
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("check", [c for c in CHECKS if "pending_claims" in c], ids=lambda c: c["at"])
def test_pending_demand_over_http_shows_requested_against_free(client: TestClient[Litestar],
                                                               check: dict[str, Any]) -> None:
    body = ok(client, "/v1/pending", at=check["at"])
    assert {f"{c['namespace']}/{c['name']}": sum(r["count"] for r in c["requests"]) for c in body["claims"]} \
        == check["pending_claims"]
    # One class; what is free at T is what the occupancy check says is free.
    assert [(c["deviceClass"], c["requested"], c["free"]) for c in body["classes"]] == [
        ("gpu.example.com", sum(check["pending_claims"].values()), check.get("devices_free", 3))]


def test_quotas_over_http_show_vision_over_a_quota_of_three(
        make_client: Any) -> None:
    from ledger.config import LedgerConfig

    config = LedgerConfig.model_validate({
        "deviceClassMappings": [{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]}],
        "quotas": [{"team": "vision", "resourceName": "example.com/gpu", "nominalQuota": 3}]})
    client = make_client(config)
    rows = {r["team"]: r for r in ok(client, "/v1/quotas", at="2026-11-02T09:30:00Z")["rows"]}
    # 09:30: vision counts train-0 (1) + pick-seven (1) + pair-0 (2) = 4 > 3; nlp shared-gpu + ext-0 = 2.
    assert (rows["vision"]["used"], rows["vision"]["overQuota"]) == (4, True)
    assert (rows["nlp"]["used"], rows["nlp"]["overQuota"]) == (2, False)
    later = {r["team"]: r for r in ok(client, "/v1/quotas", at="2026-11-02T10:40:00Z")["rows"]}
    assert (later["vision"]["used"], later["vision"]["overQuota"]) == (3, False)  # train-0 ended at 10:00


def test_quotas_and_pending_over_two_clusters_answer_per_cluster_and_a_team_token_sees_its_own(
        make_client: Any, seeded: LedgerHandle) -> None:
    from ledger.config import LedgerConfig

    services.replay_files(seeded.db, [HISTORIES / "seed-lab.jsonl"], cluster="lab-2")
    config = LedgerConfig.model_validate({
        "deviceClassMappings": [{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]}],
        "quotas": [{"team": "vision", "resourceName": "example.com/gpu", "nominalQuota": 3},
                   {"cluster": "lab-2", "team": "vision", "resourceName": "example.com/gpu", "nominalQuota": 4}],
        "api": {"tokens": [{"name": "admin", "token": "admin-token-0123456789"},
                           {"name": "vision", "token": "vision-token-0123456789", "teams": ["vision"]},
                           {"name": "nlp", "token": "nlp-token-0123456789", "teams": ["nlp"]}]}})
    client = make_client(config)
    at = {"at": "2026-11-02T09:30:00Z"}

    def get(path: str, token: str) -> Any:
        response = client.get(path, params=at, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 200, response.text
        return response.json()

    # 09:30 in each cluster: vision holds 4 devices (over 3 here, at 4 in lab-2), nlp 2; ml-train/big waits for 4
    # with 2 free.
    rows = [(r["cluster"], r["team"], r["used"], r["nominalQuota"], r["overQuota"])
            for r in get("/v1/quotas", "admin-token-0123456789")["rows"]]
    assert rows == sorted([("lab-2", "nlp", 2, None, False), ("lab-2", "vision", 4, 4, False),
                           (seeded.cluster, "nlp", 2, None, False), (seeded.cluster, "vision", 4, 3, True)])
    assert [(r["cluster"], r["team"]) for r in get("/v1/quotas", "vision-token-0123456789")["rows"]] == sorted([
        ("lab-2", "vision"), (seeded.cluster, "vision")])
    pending = get("/v1/pending", "vision-token-0123456789")  # ml-train is vision's: the token sees both claims
    assert [(c["cluster"], c["deviceClass"], c["claims"], c["requested"], c["free"]) for c in pending["classes"]] \
        == sorted([("lab-2", "gpu.example.com", 1, 4, 2), (seeded.cluster, "gpu.example.com", 1, 4, 2)])
    assert get("/v1/pending", "admin-token-0123456789")["classes"] == pending["classes"]
    assert get("/v1/pending", "nlp-token-0123456789")["classes"] == []  # nlp waits for nothing


def test_usage_grouped_by_cluster_gives_each_cluster_its_own_device_hours(
        client: TestClient[Litestar], seeded: LedgerHandle) -> None:
    services.replay_files(seeded.db, [HISTORIES / "seed-lab.jsonl"], cluster="lab-2")
    hours = EXPECTED["device_hours"]
    window = {"from": hours["from"], "to": hours["to"]}
    one_cluster = sum(hours["by_team"].values())  # vision 9.382 + nlp 5.5: the seed lab's device-hours

    # Both paths: the hourly rollups (no step) and the live intervals (a step of the whole window).
    for params in (window, {**window, "step": "PT3H"}):
        rows = ok(client, "/v1/usage", **params, groupBy="cluster")["rows"]
        per_cluster: dict[str, float] = defaultdict(float)
        for row in rows:
            per_cluster[row["cluster"]] += row["deviceHours"]
        assert sorted(per_cluster) == sorted(["lab-2", seeded.cluster])
        for total in per_cluster.values():
            assert total == pytest.approx(one_cluster, abs=hours["tolerance_hours"])
        # Each cluster's rows are that cluster's usage by DeviceClass, as a cluster filter answers it.
        mine = ok(client, "/v1/usage", **params, groupBy="deviceClass", cluster="lab-2")["rows"]
        assert [(r["deviceClass"], r["driver"], r["deviceHours"]) for r in rows if r["cluster"] == "lab-2"] \
            == [(r["deviceClass"], r["driver"], r["deviceHours"]) for r in mine]
    # Grouped by team, the two clusters' hours add up (the documented default for chargeback).
    teams = {r["team"]: r["deviceHours"] for r in ok(client, "/v1/usage", **window)["rows"]}
    assert teams["vision"] == pytest.approx(2 * hours["by_team"]["vision"], abs=2 * hours["tolerance_hours"])
    csv_text = client.get("/v1/usage", params={**window, "groupBy": "cluster"}, headers={"Accept": "text/csv"}).text
    assert sorted({line.split(",")[0] for line in csv_text.splitlines()[1:]}) == sorted(["lab-2", seeded.cluster])


def test_calendar_steps_and_mixed_paging_are_refused_with_reasons(client: TestClient[Litestar]) -> None:
    window = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}
    for step in ("P1M", "P1Y", "P1Y2D"):
        response = client.get("/v1/usage", params={**window, "step": step})
        assert response.status_code == 422 and "months and years" in response.json()["detail"]
    first = ok(client, "/v1/events", limit=2)
    both = client.get("/v1/events", params={"pageToken": first["nextPageToken"], "afterPosition": 10})
    assert both.status_code == 422


def test_metrics_content_type_names_the_prometheus_format_once(client: TestClient[Litestar]) -> None:
    response = client.get("/metrics")
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_the_openapi_document_carries_the_release_of_the_package(client: TestClient[Litestar]) -> None:
    # Read from pyproject.toml, not from the metadata the app reads: a release bump reaches the document.
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert client.get("/schema/openapi.json").json()["info"]["version"] == project["version"]


@pytest.mark.parametrize(("path", "name", "meaning"), [
    ("/v1/occupancy", "node", "for every node"), ("/v1/occupancy", "driver", "for every driver"),
    ("/v1/occupancy", "pool", "for every pool"), ("/v1/claims", "namespace", "for every namespace"),
    ("/v1/claims", "team", "for every team"), ("/v1/events", "stream", "for every stream"),
    ("/v1/occupancy", "cluster", "to ask about every cluster"), ("/v1/occupancy", "limit", "for its default"),
])
def test_an_empty_filter_is_refused_like_an_empty_cluster(client: TestClient[Litestar], path: str, name: str,
                                                          meaning: str) -> None:
    # ?node= matched no node (200, nothing) while ?cluster= was a 422: a filter left empty is refused alike.
    response = client.get(path, params={name: ""})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == f"{name}: empty; leave the parameter out {meaning}"
    assert client.get(path).status_code == 200


@pytest.mark.parametrize("name", ["from", "to"])
def test_an_empty_required_parameter_is_refused_as_required_not_as_one_to_leave_out(
        client: TestClient[Litestar], name: str) -> None:
    # It said "leave the parameter out for its default", and leaving it out is a 400 for a missing parameter.
    window = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}
    response = client.get("/v1/usage", params={**window, name: ""})
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == f"{name}: empty; this parameter is required, give it a value"
    assert client.get("/v1/usage", params=window).status_code == 200


def test_a_claim_recorded_in_two_clusters_lists_its_uid_once_and_its_events_once_a_cluster(
        client: TestClient[Litestar], seeded: LedgerHandle) -> None:
    services.replay_files(seeded.db, [HISTORIES / "seed-lab.jsonl"], cluster="lab-2")

    body = ok(client, "/v1/claims/ml-serve/shared-gpu/history", limit=1000)

    [uid] = body["uids"]  # was listed once a cluster
    # The six events worked out above, once from each cluster.
    assert Counter(e["cluster"] for e in body["events"]) == {seeded.cluster: 6, "lab-2": 6}
    assert {e["stream"] for e in body["events"]} == {f"claim:{uid}"}
