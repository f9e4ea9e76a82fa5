"""Edges of the ``/v1`` query parameters: what a problem body echoes, and which numbers are numbers."""

from __future__ import annotations

import base64
import gc
import json
from typing import Any
from urllib.parse import quote

import pytest
from litestar import Litestar
from litestar.handlers.http_handlers import HTTPRouteHandler
from litestar.testing import TestClient

from api.app import create_app
from ledger import services
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle
from ledger.translator.translate import TranslatorSettings
from tests.api.conftest import SEED
from tests.api.test_cli_bodies import run_cli

MAX_ECHO_CHARS = 100
FOREIGN_TOKEN = ("pageToken was issued for another list (another endpoint, or other parameters than this request's); "
                 "leave pageToken out to ask for the first page")
"""The refusal of a page token of another question: another endpoint's, or one asked with other parameters."""
"""The documented cut of echoed input (:data:`api.parameters.MAX_ECHO_CHARS`), spelled out so the tests state it."""


def problem(client: TestClient[Litestar], url: str, status: int) -> str:
    """GET ``url``, check it is a problem-details answer with ``status``, and return its detail."""
    response = client.get(url)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status
    detail = body["detail"]
    assert isinstance(detail, str)
    return detail


def test_an_instant_finer_than_a_microsecond_is_cut_to_the_microsecond(client: TestClient[Litestar]) -> None:
    # PostgreSQL keeps microseconds: the nanoseconds of `date --rfc-3339=ns` are cut (not rounded up into the
    # next microsecond), and the answer says which instant it is for.
    for path in ("/v1/occupancy", "/v1/claims", "/v1/pending"):
        answer = client.get(path, params={"at": "2026-11-02T09:30:00.123456999Z", "limit": 1})
        assert answer.status_code == 200, answer.text
        assert answer.json()["at"] == "2026-11-02T09:30:00.123456Z", path


def test_a_long_unknown_parameter_name_is_echoed_cut_to_100_characters_with_an_ellipsis(
        client: TestClient[Litestar]) -> None:
    detail = problem(client, "/v1/occupancy?" + "x" * 5000 + "=1", 400)
    assert detail.startswith("unknown query parameter " + "x" * (MAX_ECHO_CHARS - 1) + "…: this endpoint takes "), \
        detail[:300]
    assert "x" * MAX_ECHO_CHARS not in detail and len(detail) < 400


def test_many_unknown_parameters_are_listed_ten_at_most_and_the_rest_counted(client: TestClient[Litestar]) -> None:
    query = "&".join(f"p{n:03d}=1" for n in range(50))
    detail = problem(client, f"/v1/occupancy?{query}", 400)
    listed = ", ".join(f"p{n:03d}" for n in range(10))
    assert detail.startswith(f"unknown query parameters {listed} ... and 40 more: this endpoint takes "), detail


def test_a_parameter_without_a_name_is_shown_as_an_empty_name(client: TestClient[Litestar]) -> None:
    detail = problem(client, "/v1/occupancy?=x", 400)
    assert detail.startswith('unknown query parameter "": this endpoint takes '), detail


def test_a_long_event_type_is_echoed_cut(client: TestClient[Litestar]) -> None:
    detail = problem(client, "/v1/events?type=" + "T" * 5000, 422)
    assert detail.startswith("type: no event type '" + "T" * (MAX_ECHO_CHARS - 3) + "…'; the types are "), detail[:300]


@pytest.mark.parametrize("at", ["9999-12-31T23:59:59-14:00", "9999-12-31T23:00:00-01:00", "9999-06-01T00:00:00Z"])
def test_a_time_past_the_limit_is_refused_with_the_latest_time_accepted(client: TestClient[Litestar], at: str) -> None:
    # The first two are past year 9999 in UTC, which datetime cannot hold: the same answer as the third.
    assert problem(client, "/v1/occupancy?at=" + at.replace("+", "%2B"), 422) == (
        f"at: '{at}' is too far in the future; the latest time accepted is 9998-12-31T23:59:59.999999Z")


def test_a_time_too_far_in_the_future_with_a_long_fraction_is_echoed_cut(client: TestClient[Litestar]) -> None:
    at = "9999-06-01T00:00:00." + "0" * 5000 + "Z"
    detail = problem(client, f"/v1/occupancy?at={at}", 422)
    assert detail == (f"at: {repr(at)[:MAX_ECHO_CHARS - 2]}…' is too far in the future; "
                      "the latest time accepted is 9998-12-31T23:59:59.999999Z")


LONG = "z" * 5000
"""A value far longer than any name or value the API takes."""
CUT = "z" * (MAX_ECHO_CHARS - 1) + "…"
"""``LONG`` as a problem body repeats it."""
QUOTED = "'" + "z" * (MAX_ECHO_CHARS - 3) + "…'"
"""``LONG`` as a problem body repeats it quoted (a cut string keeps its closing quote)."""
WINDOW = "from=2026-11-02T09:00:00Z&to=2026-11-02T12:00:00Z"


@pytest.mark.parametrize(("url", "status", "detail"), [
    (f"/v1/occupancy?deviceClass={LONG}", 404, f"DeviceClass {QUOTED} is not defined at "),
    (f"/v1/claims/{LONG}/x/history", 404, f"no ResourceClaim {CUT}/x was ever recorded"),
    (f"/v1/claims/x/{LONG}/history", 404, f"no ResourceClaim x/{CUT} was ever recorded"),
    (f"/v1/devices/{LONG}/p/d/timeline", 404, f"no device {CUT}/p/d was ever recorded"),
    (f"/v1/devices/d/p/{LONG}/timeline", 404, f"no device d/p/{CUT} was ever recorded"),
    (f"/v1/usage?{WINDOW}&groupBy={LONG}", 422,
     f"groupBy: Invalid enum value '{CUT}' (one of: team, namespace, deviceClass, model, node, cluster)"),
    (f"/v1/claims?state={LONG}", 422, f"state: Invalid enum value '{CUT}' (one of: pending, allocated, deleted, all)"),
    (f"/v1/claims?origin={LONG}", 422, f"origin: Invalid enum value '{CUT}' (one of: manual, template, extended)"),
    (f"/v1/occupancy?at={LONG}", 422, f"at: not an RFC 3339 time with a zone: {QUOTED}"),
    (f"/v1/usage?from={LONG}&to=2026-11-02T12:00:00Z", 422, f"from: not an RFC 3339 time with a zone: {QUOTED}"),
    (f"/v1/usage?{WINDOW}&step=P{'9' * 5000}D", 422, f"step: 'P{'9' * 96}…' is out of range; "),
])
def test_every_problem_repeats_client_input_cut_to_100_characters_ending_in_an_ellipsis(
        client: TestClient[Litestar], url: str, status: int, detail: str) -> None:
    got = problem(client, url, status)
    assert got.startswith(detail), got[:300]
    assert "z" * MAX_ECHO_CHARS not in got and "9" * MAX_ECHO_CHARS not in got and "..." not in got
    assert len(got) < 400


def test_an_unknown_device_class_in_a_long_cluster_cuts_both(client: TestClient[Litestar]) -> None:
    got = problem(client, f"/v1/occupancy?deviceClass={LONG}&cluster={'c' * 5000}", 404)
    assert got.startswith(f"DeviceClass {QUOTED} is not defined at "), got[:300]
    assert got.endswith(f" in cluster '{'c' * (MAX_ECHO_CHARS - 3)}…'"), got[-300:]


def test_the_cli_refuses_a_long_unknown_device_class_echoing_it_cut(seeded: LedgerHandle) -> None:
    code, output = run_cli(seeded, "occupancy", "--at", "2026-11-02T09:30:00Z", "--device-class", LONG)

    assert code == 2, output
    assert f"DeviceClass {QUOTED} is not defined at 2026-11-02T09:30:00Z" in output
    assert "z" * MAX_ECHO_CHARS not in output


@pytest.mark.parametrize(("path", "name", "value"), [
    ("/v1/occupancy", "limit", "1e3"), ("/v1/occupancy", "limit", "10.0"), ("/v1/occupancy", "limit", "1_0"),
    ("/v1/occupancy", "limit", "１０"), ("/v1/occupancy", "limit", "+10"), ("/v1/occupancy", "limit", " 10"),
    ("/v1/occupancy", "limit", "0x10"), ("/v1/claims", "limit", "٣"), ("/v1/events", "afterPosition", "1e1"),
    ("/v1/events", "limit", "5.0"),
    # A leading zero got Litestar's own words ("limit: Expected `int`, got `str`"), not the form.
    ("/v1/occupancy", "limit", "010"), ("/v1/occupancy", "limit", "00"), ("/v1/events", "afterPosition", "-01"),
])
def test_an_integer_in_another_form_than_ascii_digits_is_a_422_naming_the_parameter_and_the_form(
        client: TestClient[Litestar], path: str, name: str, value: str) -> None:
    detail = problem(client, f"{path}?{name}={quote(value)}", 422)
    assert detail == (f"{name}: expected a whole number in ASCII decimal digits without leading zeros (e.g. 100), "
                      f"got {value!r}")


LIMITS = "the largest accepted is 1000, the smallest 1"
POSITIONS = "the largest accepted is 9223372036854775807, the smallest 0"
"""How the range of ``limit`` and of ``afterPosition`` (a PostgreSQL bigint) is named when a value is outside it."""


@pytest.mark.parametrize(("url", "detail"), [
    ("/v1/occupancy?limit=0", f"limit: '0' is out of range; {LIMITS}"),
    ("/v1/occupancy?limit=-5", f"limit: '-5' is out of range; {LIMITS}"),
    ("/v1/occupancy?limit=1001", f"limit: '1001' is out of range; {LIMITS}"),
    ("/v1/occupancy?limit=" + "9" * 30, f"limit: '{'9' * 30}' is out of range; {LIMITS}"),
    # Longer than Python's int() reads by default (4300 digits); msgspec said "Integer value out of range".
    ("/v1/occupancy?limit=" + "9" * 5000, f"limit: '{'9' * (MAX_ECHO_CHARS - 3)}…' is out of range; {LIMITS}"),
    ("/v1/claims?limit=0", f"limit: '0' is out of range; {LIMITS}"),
    ("/v1/quotas?limit=1001", f"limit: '1001' is out of range; {LIMITS}"),
    ("/v1/pending?limit=-1", f"limit: '-1' is out of range; {LIMITS}"),
    ("/v1/reports/idle-claims?limit=1001", f"limit: '1001' is out of range; {LIMITS}"),
    (f"/v1/usage?{WINDOW}&limit=0", f"limit: '0' is out of range; {LIMITS}"),
    ("/v1/events?limit=1001", f"limit: '1001' is out of range; {LIMITS}"),
    # afterPosition said "Expected `int` <= 4611686018427387904" (2**62, below the largest position).
    ("/v1/events?afterPosition=9223372036854775808",
     f"afterPosition: '9223372036854775808' is out of range; {POSITIONS}"),
    ("/v1/events?afterPosition=" + "9" * 30, f"afterPosition: '{'9' * 30}' is out of range; {POSITIONS}"),
    ("/v1/events?afterPosition=-1", f"afterPosition: '-1' is out of range; {POSITIONS}"),
    ("/v1/events?afterPosition=-" + "9" * 5000,
     f"afterPosition: '-{'9' * (MAX_ECHO_CHARS - 4)}…' is out of range; {POSITIONS}"),
])
def test_an_integer_out_of_range_is_a_422_naming_the_largest_and_smallest_accepted(
        client: TestClient[Litestar], url: str, detail: str) -> None:
    assert problem(client, url, 422) == detail


@pytest.mark.parametrize("position", ["4611686018427387905", "9223372036854775807"])
def test_after_position_takes_every_bigint_up_to_the_largest(client: TestClient[Litestar], position: str) -> None:
    response = client.get(f"/v1/events?afterPosition={position}")
    assert response.status_code == 200, response.text
    assert response.json() == {"events": [], "nextPageToken": None}


def test_an_integer_in_ascii_digits_is_taken(client: TestClient[Litestar]) -> None:
    response = client.get("/v1/events?limit=2&afterPosition=3")
    assert response.status_code == 200, response.text
    assert [e["globalPosition"] for e in response.json()["events"]] == [4, 5]


@pytest.mark.parametrize(("path", "name"), [("/v1/reports/idle-claims", "minIdle"), ("/v1/usage", "step")])
@pytest.mark.parametrize("value", ["1e3", "1_800", "１０", "PT１H", "+10", " 10", "inf", "nan", "0x10", "1800\n",
                                   "PT1H\n", ".5", "5."])
def test_seconds_in_another_form_than_ascii_decimals_are_a_422_naming_the_parameter_and_the_form(
        client: TestClient[Litestar], path: str, name: str, value: str) -> None:
    window = "from=2026-11-02T09:00:00Z&to=2026-11-02T12:00:00Z&" if path == "/v1/usage" else ""
    detail = problem(client, f"{path}?{window}{name}={quote(value)}", 422)
    assert detail == (f"{name}: expected an ISO 8601 duration (PT30M) or seconds in ASCII decimal digits "
                      f"(1800, 0.5), got {value!r}")


@pytest.mark.parametrize("value", ["1800", "0.5", "PT30M", "P1DT0,5H"])
def test_seconds_in_ascii_decimals_and_iso_durations_are_taken(client: TestClient[Litestar], value: str) -> None:
    response = client.get(f"/v1/reports/idle-claims?minIdle={quote(value)}")
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("query", "detail"), [
    ("", "Missing required query parameters 'from' and 'to'"),
    ("?to=2026-11-02T12:00:00Z", "Missing required query parameter 'from'"),
    ("?from=2026-11-02T09:00:00Z&groupBy=node", "Missing required query parameter 'to'"),
])
def test_a_usage_request_names_every_required_parameter_it_lacks(client: TestClient[Litestar], query: str,
                                                                 detail: str) -> None:
    # Litestar stops at the first missing one it meets (its own set order): with neither, it named only 'to'.
    assert problem(client, f"/v1/usage{query}", 400) == detail


def test_every_missing_required_parameter_is_named_in_declaration_order_by_its_client_name() -> None:
    # No /v1 endpoint has three required parameters: a small app with one, declared as the controllers declare
    # theirs, answering through the same mapping. fourth takes None and fifth has a default: neither is required.
    from typing import Annotated

    from litestar import get
    from litestar.params import QueryParameter

    from api.errors import EXCEPTION_HANDLERS

    @get("/three", sync_to_thread=False)
    def three(first: Annotated[str, QueryParameter()], second: Annotated[int, QueryParameter(name="secondName")],
              third: Annotated[str, QueryParameter()], fourth: Annotated[str | None, QueryParameter()] = None,
              fifth: Annotated[str, QueryParameter()] = "x") -> str:
        return first + str(second) + third + (fourth or "") + fifth

    with TestClient(Litestar([three], exception_handlers=dict(EXCEPTION_HANDLERS))) as small:
        assert problem(small, "/three", 400) == "Missing required query parameters 'first', 'secondName' and 'third'"
        assert problem(small, "/three?secondName=2&fourth=4", 400) == \
            "Missing required query parameters 'first' and 'third'"
        assert problem(small, "/three?first=a&third=c&fifth=f", 400) == "Missing required query parameter 'secondName'"


SHORTEST_STEP_TEXT = "the shortest PT0.000001S (0.000001 seconds; durations are counted in whole microseconds)"
"""How the range message of ``step`` names its lower bound."""


@pytest.mark.parametrize("step", ["0.0000001", "PT0.0000001S", "0", "PT0S", "0.0000004"])
def test_a_step_under_one_microsecond_is_refused_naming_the_shortest_step_accepted(
        client: TestClient[Litestar], step: str) -> None:
    detail = problem(client, f"/v1/usage?{WINDOW}&step={step}", 422)
    assert detail == (f"step: {step!r} is out of range; the longest duration accepted is P36500D (100 years, "
                      f"3153600000 seconds), {SHORTEST_STEP_TEXT}")


def test_a_step_of_one_microsecond_is_in_range_and_refused_only_for_its_bucket_count(
        client: TestClient[Litestar]) -> None:
    detail = problem(client, f"/v1/usage?{WINDOW}&step=0.000001", 422)
    assert detail.endswith("so the step must be at least 1.08 s here"), detail


def test_a_min_idle_under_one_microsecond_is_zero_as_the_readme_says(client: TestClient[Litestar]) -> None:
    response = client.get("/v1/reports/idle-claims?minIdle=0.0000001&at=2026-11-02T12:00:00Z")
    assert response.status_code == 200, response.text
    assert response.json() == client.get("/v1/reports/idle-claims?minIdle=0&at=2026-11-02T12:00:00Z").json()


@pytest.mark.parametrize("value", ["P36500DT0.0000001S", "3153600000.0000004"])
def test_a_min_idle_a_fraction_of_a_microsecond_past_100_years_is_100_years_in_either_form(
        client: TestClient[Litestar], value: str) -> None:
    # The same duration; the seconds form was a 422 (out of range) while the ISO 8601 form was a 200.
    response = client.get(f"/v1/reports/idle-claims?minIdle={value}&at=2026-11-02T12:00:00Z")
    assert response.status_code == 200, response.text
    assert response.json() == client.get("/v1/reports/idle-claims?minIdle=P36500D&at=2026-11-02T12:00:00Z").json()


@pytest.mark.parametrize("value", ["P36500DT0.0000001S", "3153600000.0000004"])
def test_the_cli_takes_a_min_idle_a_fraction_of_a_microsecond_past_100_years_in_either_form(
        seeded: LedgerHandle, value: str) -> None:
    code, output = run_cli(seeded, "idle-claims", "--at", "2026-11-02T12:00:00Z", "--min-idle", value,
                           "--output", "json")

    assert code == 0, output
    assert output == run_cli(seeded, "idle-claims", "--at", "2026-11-02T12:00:00Z", "--min-idle", "P36500D",
                             "--output", "json")[1]


def test_the_cli_refuses_a_step_under_one_microsecond_with_the_same_words(seeded: LedgerHandle) -> None:
    code, output = run_cli(seeded, "usage", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z",
                           "--step", "0.0000001")

    assert code == 2, output
    assert "'0.0000001' is out of range; the longest duration accepted is P36500D" in output
    assert SHORTEST_STEP_TEXT in output


NUL_WORDS = ("holds a NUL character (\\u0000), which no parameter takes (PostgreSQL text cannot hold it, "
             "so no recorded name does)")
"""How a value holding U+0000 is refused, after its name and its value (``repr``)."""


@pytest.mark.parametrize(("url", "detail"), [
    # A filter the database compared: refused by the driver with words naming no parameter.
    ("/v1/claims?team=a%00b", "team: 'a\\x00b' "), ("/v1/occupancy?node=a%00b", "node: 'a\\x00b' "),
    ("/v1/occupancy?cluster=c%00", "cluster: 'c\\x00' "), ("/v1/events?stream=claim:%00", "stream: 'claim:\\x00' "),
    ("/v1/occupancy?deviceClass=%00", "deviceClass: '\\x00' "),
    # A time: now refused in the same words as any other value.
    ("/v1/occupancy?at=2026%00", "at: '2026\\x00' "),
    # Path segments, named as in the route's path.
    ("/v1/claims/a%00b/x/history", "namespace: 'a\\x00b' "), ("/v1/claims/ml-serve/x%00/history", "name: 'x\\x00' "),
    ("/v1/devices/gpu.example.com/lab%00/gpu-1/timeline", "pool: 'lab\\x00' "),
    # Several: the first path parameter, else the first query parameter by name.
    ("/v1/occupancy?node=a%00&driver=b%00", "driver: 'b\\x00' "),
    ("/v1/devices/d%00/p/x%00/timeline?from=%00", "device: 'x\\x00' "),
])
def test_a_nul_character_in_a_value_is_a_422_naming_the_parameter(client: TestClient[Litestar], url: str,
                                                                  detail: str) -> None:
    assert problem(client, url, 422) == detail + NUL_WORDS


def test_a_nul_character_in_a_long_value_is_echoed_cut(client: TestClient[Litestar]) -> None:
    assert problem(client, f"/v1/claims?team={'t' * 5000}%00", 422) == \
        f"team: '{'t' * (MAX_ECHO_CHARS - 3)}…' {NUL_WORDS}"


def test_a_page_token_edited_to_hold_a_nul_character_is_refused_as_not_issued(client: TestClient[Litestar]) -> None:
    url = "/v1/occupancy?at=2026-11-02T09:30:00Z&limit=1"
    token = client.get(url).json()["nextPageToken"]
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    body["k"][0] += "\x00"  # the sort key of the last device returned
    edited = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    assert problem(client, f"{url}&pageToken={edited}", 422) == "pageToken is not a token this API issued"


@pytest.mark.parametrize(("url", "field", "value"), [
    # The instant the first page answered for, edited: it is the token's fault, not the at parameter's.
    ("/v1/occupancy?at=2026-11-02T09:30:00Z&limit=1", "at", "2026-13-45T09:30:00Z"),
    ("/v1/claims?at=2026-11-02T09:30:00Z&limit=1", "at", "yesterday"),
    # An offset past the bigint range: on /v1/events it is the global position the next page starts after.
    ("/v1/events?limit=1", "o", 2**63),
    ("/v1/claims?at=2026-11-02T09:30:00Z&limit=1", "o", 2**63),
])
def test_a_page_token_edited_to_an_impossible_instant_or_offset_is_refused_as_not_issued(
        client: TestClient[Litestar], url: str, field: str, value: object) -> None:
    token = client.get(url).json()["nextPageToken"]
    assert token is not None
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert field in body
    body[field] = value
    edited = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    assert problem(client, f"{url}&pageToken={edited}", 422) == "pageToken is not a token this API issued"


def _token_body(token: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


def _token(body: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


def test_a_claims_page_token_holds_the_last_claims_key_and_one_holding_an_offset_is_refused(
        client: TestClient[Litestar]) -> None:
    url = "/v1/claims?at=2026-11-02T12:00:00Z&limit=2"
    everything = client.get("/v1/claims?at=2026-11-02T12:00:00Z&limit=1000").json()["claims"]
    assert len(everything) == 6
    body = _token_body(client.get(url).json()["nextPageToken"])
    second = everything[1]
    assert (body["o"], body["k"]) == (0, [second["cluster"], second["namespace"], second["name"], second["uid"]])
    page = client.get(f"{url}&pageToken={_token(body)}").json()
    assert [c["uid"] for c in page["claims"]] == [c["uid"] for c in everything[2:4]]
    # Offsets are what this list's tokens held before it was paged by key; none such is issued now.
    del body["k"]
    body["o"] = 2
    assert problem(client, f"{url}&pageToken={_token(body)}", 422) == "pageToken is not a token this API issued"


def test_every_page_token_of_a_cluster_named_with_253_emoji_is_read_back(ledger: LedgerHandle) -> None:
    # The longest cluster name accepted, each character 4 bytes of UTF-8: written as \u escapes, a claim token
    # grew to 4,248 characters, past the limit its own reader kept (4,096).
    cluster = "\U0001f680" * 253
    services.replay_files(ledger.db, [SEED], cluster=cluster,
                          settings=TranslatorSettings(team_label=ledger.team_label))
    with TestClient(create_app(db=ledger.db, config=DEFAULT)) as client:
        for path, rows in (("/v1/claims", "claims"), ("/v1/occupancy", "devices")):
            whole = client.get(path, params={"at": "2026-11-02T12:00:00Z", "limit": 1000}).json()[rows]
            assert len(whole) > 2 and {r["cluster"] for r in whole} == {cluster}
            walked: list[Any] = []
            token = None
            while True:
                params: dict[str, Any] = {"at": "2026-11-02T12:00:00Z", "limit": 1}
                if token is not None:
                    params["pageToken"] = token
                response = client.get(path, params=params)
                assert response.status_code == 200, response.text
                walked += response.json()[rows]
                token = response.json()["nextPageToken"]
                if token is None:
                    break
                assert len(token) < 2500
            assert walked == whole, path


def test_an_occupancy_page_token_given_an_offset_is_refused_as_not_issued(client: TestClient[Litestar]) -> None:
    # Occupancy pages by device key, as the claims listing does by claim key: neither token holds an offset.
    url = "/v1/occupancy?at=2026-11-02T09:30:00Z&limit=1"
    body = _token_body(client.get(url).json()["nextPageToken"])
    assert body["o"] == 0 and len(body["k"]) == 4
    body["o"] = 1
    assert problem(client, f"{url}&pageToken={_token(body)}", 422) == "pageToken is not a token this API issued"


def test_a_claims_page_token_whose_key_lost_a_part_is_refused_as_not_issued(client: TestClient[Litestar]) -> None:
    url = "/v1/claims?at=2026-11-02T12:00:00Z&limit=2"
    body = _token_body(client.get(url).json()["nextPageToken"])
    body["k"] = body["k"][1:]
    assert problem(client, f"{url}&pageToken={_token(body)}", 422) == "pageToken is not a token this API issued"


@pytest.mark.parametrize("path", ["/v1/occupancy", "/v1/claims", "/v1/quotas"])
def test_a_page_token_edited_to_another_valid_instant_is_refused_when_at_is_given(client: TestClient[Litestar],
                                                                                  path: str) -> None:
    url = f"{path}?at=2026-11-02T09:30:00Z&limit=1"
    first = client.get(url).json()
    token = first["nextPageToken"]
    assert token is not None, first
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert body["at"] == "2026-11-02T09:30:00Z" == first["at"]
    body["at"] = "0001-01-01T00:00:00Z"  # a real instant, but not the one the request asks about
    edited = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")

    assert problem(client, f"{url}&pageToken={edited}", 422) == \
        "pageToken was issued for another at; leave pageToken out to ask for the first page"
    second = client.get(f"{url}&pageToken={token}").json()
    assert second["at"] == "2026-11-02T09:30:00Z"
    # The same instant written with another offset is the same query: the token answers the same second page.
    assert client.get(f"{path}?at=2026-11-02T10:30:00%2B01:00&limit=1&pageToken={token}").json() == second
    # Another instant is refused, whatever the token carries.
    assert problem(client, f"{path}?at=2026-11-02T09:30:01Z&limit=1&pageToken={token}", 422) == \
        "pageToken was issued for another at; leave pageToken out to ask for the first page"


@pytest.mark.parametrize("path", ["/v1/occupancy", "/v1/claims?state=all", "/v1/quotas"])
def test_a_page_token_of_a_first_page_asked_for_now_answers_a_request_naming_its_instant(
        client: TestClient[Litestar], path: str) -> None:
    # The first page, asked without `at`, answered for now and says which instant; naming that instant on the next
    # request, as a careful client does, was refused as "issued for another list".
    sep = "&" if "?" in path else "?"
    first = client.get(f"{path}{sep}limit=1").json()
    token = first["nextPageToken"]
    assert token is not None, first  # the seed lab has two rows at least in each of these lists now
    named = client.get(f"{path}{sep}limit=1&at={quote(first['at'])}&pageToken={token}")
    unnamed = client.get(f"{path}{sep}limit=1&pageToken={token}")

    assert named.status_code == 200, named.text
    assert named.json() == unnamed.json()
    assert named.json()["at"] == first["at"]
    other = client.get(f"{path}{sep}limit=1&at=2026-11-02T09:30:00Z&pageToken={token}")
    assert other.status_code == 422
    assert other.json()["detail"] == ("pageToken was issued for another at; leave pageToken out to ask for the "
                                      "first page")


def test_a_page_token_answers_the_same_window_and_durations_written_another_way(client: TestClient[Litestar]) -> None:
    usage = "/v1/usage?from=2026-11-02T08:00:00Z&to=2026-11-02T10:00:00Z&groupBy=namespace&step=PT30M&limit=1"
    first = client.get(usage).json()
    assert first["nextPageToken"] is not None, first
    second = client.get(f"{usage}&pageToken={first['nextPageToken']}").json()
    assert second["rows"] != first["rows"]
    same = ("/v1/usage?from=2026-11-02T09:00:00%2B01:00&to=2026-11-02T10:00:00.000Z&groupBy=namespace&step=1800"
            f"&limit=1&pageToken={first['nextPageToken']}")
    assert client.get(same).json() == second
    other_step = usage.replace("PT30M", "PT31M") + f"&pageToken={first['nextPageToken']}"
    assert problem(client, other_step, 422) == FOREIGN_TOKEN



def test_an_idle_claims_page_token_answers_min_idle_written_another_way(seeded: LedgerHandle,
                                                                        client: TestClient[Litestar]) -> None:
    # The seed lab holds one idle claim; recorded into a second cluster too, the report has two rows to page.
    services.replay_files(seeded.db, [SEED], cluster="second")
    idle = "/v1/reports/idle-claims?at=2026-11-02T12:00:00Z&minIdle=PT30M&limit=1"
    page = client.get(idle).json()
    assert page["nextPageToken"] is not None, page
    expected = client.get(f"{idle}&pageToken={page['nextPageToken']}").json()
    assert [c["cluster"] for c in (*page["claims"], *expected["claims"])] == ["default", "second"]
    assert client.get(idle.replace("PT30M", "1800") + f"&pageToken={page['nextPageToken']}").json() == expected
    assert problem(client, idle.replace("PT30M", "1801") + f"&pageToken={page['nextPageToken']}", 422) == \
        FOREIGN_TOKEN


def test_requests_leave_no_copy_of_the_route_handler_behind(client: TestClient[Litestar]) -> None:
    # Litestar hands each guard a copy of the route handler; a guard that cached by that copy kept one per
    # request for good. Twenty requests, each with other parameters, must leave as many handlers alive as one.
    def live_handlers() -> int:
        gc.collect()
        return sum(isinstance(o, HTTPRouteHandler) for o in gc.get_objects())

    assert client.get("/v1/occupancy?limit=1").status_code == 200
    before = live_handlers()
    for n in range(1, 21):
        assert client.get(f"/v1/occupancy?limit={n}").status_code == 200
        assert client.get(f"/v1/events?limit={n}").status_code == 200
    assert live_handlers() == before


@pytest.mark.parametrize("url", ["/v1/claims?origin=null", "/v1/claims?state=null",
                                 f"/v1/usage?{WINDOW}&groupBy=null"])
def test_the_word_null_is_not_taken_for_a_fixed_choice_left_out(client: TestClient[Litestar], url: str) -> None:
    # origin is optional: Litestar read `null` as no origin and listed claims of every origin.
    name = url.split("?")[1].split("&")[-1].split("=")[0]
    assert problem(client, url, 422).startswith(f"{name}: Invalid enum value 'null' (one of: ")


@pytest.mark.parametrize(("url", "name"), [
    ("/v1/occupancy?node=%20", "node"), ("/v1/claims?team=%20%20", "team"), ("/v1/claims?namespace=%09", "namespace"),
])
def test_a_filter_of_only_blanks_is_refused_as_an_empty_one_is(client: TestClient[Litestar], url: str,
                                                               name: str) -> None:
    assert problem(client, url, 422) == (f"{name}: only blanks, which no name holds; leave the parameter out "
                                         f"for every {name}")


def test_a_cluster_of_only_blanks_is_still_asked_for(client: TestClient[Litestar]) -> None:
    response = client.get("/v1/occupancy?cluster=%20")
    assert response.status_code == 200, response.text
    assert response.json()["totals"]["devices"] == 0


@pytest.mark.parametrize(("url", "detail"), [
    ("/v1/occupancy?at=%20", "at: not an RFC 3339 time with a zone: ' '"),
    ("/v1/claims?state=%20", "state: Invalid enum value ' ' (one of: pending, allocated, deleted, all)"),
])
def test_other_parameters_of_only_blanks_are_refused_saying_what_they_take(client: TestClient[Litestar], url: str,
                                                                          detail: str) -> None:
    assert problem(client, url, 422).startswith(detail)


def test_a_bidirectional_override_in_an_echoed_name_is_written_as_an_escape(client: TestClient[Litestar]) -> None:
    # U+202E would make a terminal showing the answer (curl) draw the rest of the line right to left.
    detail = problem(client, "/v1/claims/%E2%80%AEml/%F0%9F%98%80/history", 404)
    assert detail == "no ResourceClaim \\u202eml/\U0001f600 was ever recorded"
