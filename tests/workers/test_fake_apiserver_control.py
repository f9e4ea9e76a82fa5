"""The fake API server's control endpoints (``POST /fake/advance``, ``POST /fake/faults``) refuse bad input
with a 400 that names the parameter or field and what it accepts, and change nothing: never a 500, never a
line played or a fault queued that would crash a later request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from tests.workers.harness import SEED_LAB
from workers.fake_apiserver import Fault
from workers.testing import ThreadedFakeApiServer

Start = Callable[..., ThreadedFakeApiServer]


def _post(url: str, body: bytes | None = None) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=body if body is not None else b"", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    answer = json.loads(text)
    assert isinstance(answer, dict)
    return status, answer


def _list_pods(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/pods", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize(("query", "said"), [
    ("until=notatime", "until: not an RFC 3339 time with a zone: 'notatime'"),
    ("until=2026-11-02T09:00:00", "until: not an RFC 3339 time with a zone"),  # no zone
    ("until=", "until: not an RFC 3339 time with a zone"),
    ("count=abc", "count must be a whole number, 1 or more; got 'abc'"),
    ("count=-1", "count must be a whole number, 1 or more; got '-1'"),
    ("count=0", "count must be a whole number, 1 or more; got '0'"),
    ("count=1.5", "count must be a whole number, 1 or more; got '1.5'"),
    ("count=%C2%B2", "count must be a whole number, 1 or more; got '\u00b2'"),  # a digit to str.isdigit only
])
def test_advance_with_a_bad_count_or_until_is_a_400_naming_it_and_plays_nothing(
        fake_apiserver: Start, query: str, said: str) -> None:
    server = fake_apiserver(SEED_LAB)

    status, answer = _post(f"{server.url}/fake/advance?{query}")

    assert status == 400, answer
    assert answer["code"] == 400 and answer["reason"] == "BadRequest"
    assert said in str(answer["message"])
    assert server.server.remaining == len(server.server._pending)  # nothing played


def test_a_bad_until_says_the_form_it_takes(fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)

    _, answer = _post(f"{server.url}/fake/advance?until=notatime")

    assert "e.g. 2026-11-02T09:00:00Z" in str(answer["message"])


def test_advance_with_a_good_count_or_until_still_plays(fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)

    assert [len(_post(f"{server.url}/fake/advance?{q}")[1]["played"])  # type: ignore[arg-type] # a JSON list
            for q in ("count=2", "", "until=2026-11-02T09:00:01Z")] == [2, 1, 1]


@pytest.mark.parametrize("body", [b"garbage", b"", b"{\"action\": ", b"\xff"])
def test_faults_that_are_not_json_are_a_400_and_queue_nothing(fake_apiserver: Start, body: bytes) -> None:
    server = fake_apiserver(SEED_LAB)

    status, answer = _post(f"{server.url}/fake/faults", body)

    assert status == 400, answer
    assert "the body must be a JSON fault object or a list of them" in str(answer["message"])
    assert server.server.faults == []


@pytest.mark.parametrize(("fault", "said"), [
    ({"action": "status", "status": "x"}, "status must be an HTTP status code, an integer from 200 to 599"),
    ({"action": "status", "status": 42}, "status must be an HTTP status code, an integer from 200 to 599"),
    ({"action": "status", "status": True}, "status must be an HTTP status code"),
    ({"action": "explode"}, "action must be one of status, drop, expire, line"),
    ({"status": 500}, "action must be one of status, drop, expire, line"),
    ({"action": "status", "verb": "delete"}, "verb must be null or one of list, watch, get, update, create"),
    ({"action": "status", "kind": "Pods"}, "kind must be null or one of Namespace, DeviceClass, ResourceSlice"),
    ({"action": "status", "retry_after_s": -1}, "retry_after_s must be null or an integer, 0 or more"),
    ({"action": "drop", "after_events": "3"}, "after_events must be an integer, 0 or more"),
    ({"action": "drop", "partial": "yes"}, "partial must be true or false"),
    ({"action": "line", "line": 7}, "line must be a string"),
    ({"action": "line", "line": "two\nlines"}, "line must be a single line"),
    ({"action": "line", "line": "\ud800"}, "line must be encodable as UTF-8"),
    ({"action": "status", "page": ["<html>"]}, "page must be null or a string"),
    ({"action": "status", "times": 0}, "times must be an integer, 1 or more"),
    ({"action": "status", "retry": 2}, "fault 1: unknown field 'retry'; the fields are action, status"),
    ("status", "fault 1: must be a JSON object; got 'status'"),
])
def test_a_bad_fault_is_a_400_naming_the_field_and_nothing_is_queued(
        fake_apiserver: Start, fault: object, said: str) -> None:
    server = fake_apiserver(SEED_LAB)
    good = {"action": "status", "status": 503, "kind": "Pod", "verb": "list"}

    status, answer = _post(f"{server.url}/fake/faults", json.dumps([good, fault]).encode())

    assert status == 400, answer
    assert said in str(answer["message"])
    assert server.server.faults == []  # not even the good one before it
    assert _list_pods(server.url) == 200


def test_a_fault_with_a_status_that_is_not_a_number_is_refused_and_the_next_list_is_served(
        fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)

    status, answer = _post(f"{server.url}/fake/faults", b'{"action":"status","status":"x"}')

    assert status == 400 and "status must be" in str(answer["message"])
    assert _list_pods(server.url) == 200


def test_good_faults_posted_as_json_are_queued_as_given(fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)
    page = {"action": "status", "status": 200, "page": "<html>login</html>", "kind": "Lease", "verb": "get"}

    status, answer = _post(f"{server.url}/fake/faults", json.dumps(
        [{"action": "status", "status": 429, "retry_after_s": 2, "kind": "Pod", "verb": "list"}, page,
         {"action": "line", "line": "\udcff{}", "after_events": 1, "times": 2}]).encode())

    assert (status, answer) == (200, {"queued": 3})
    assert server.server.faults == [
        Fault(action="status", status=429, retry_after_s=2, kind="Pod", verb="list"),
        Fault(action="status", status=200, page="<html>login</html>", kind="Lease", verb="get"),
        Fault(action="line", line="\udcff{}", after_events=1, times=2)]
    assert _list_pods(server.url) == 429
