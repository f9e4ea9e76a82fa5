"""The fake API server speaks the Kubernetes API as a client sees it (through the ``fake_apiserver`` fixture)."""

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


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_nothing_exists_until_the_history_is_played_forward(fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)
    status, body = _get(f"{server.url}/api/v1/namespaces")
    assert status == 200 and json.loads(body)["items"] == []
    played = server.advance(4)
    assert [p.kind for p in played] == ["Namespace", "Namespace", "DeviceClass", "ResourceSlice"]
    assert server.now.isoformat() == "2026-11-02T09:00:01+00:00"
    listed = json.loads(_get(f"{server.url}/api/v1/namespaces")[1])
    assert listed["kind"] == "NamespaceList" and listed["metadata"]["resourceVersion"] == "1004"
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["ml-serve", "ml-train"]


def test_a_watch_sends_the_events_after_its_resource_version_then_a_bookmark_when_it_times_out(
        fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)
    server.advance(4)
    status, body = _get(f"{server.url}/api/v1/namespaces?watch=true&resourceVersion=1001&allowWatchBookmarks=true"
                        "&timeoutSeconds=1")
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [("ADDED", "ml-serve"),
                                                                                ("BOOKMARK", None)]
    assert events[-1]["object"]["metadata"]["resourceVersion"] == "1004"


def test_an_expired_resource_version_answers_410_in_the_stream_and_faults_answer_as_told(
        fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB)
    server.advance(10)
    server.expire()
    _, body = _get(f"{server.url}/api/v1/pods?watch=1&resourceVersion=1005&timeoutSeconds=1")
    (event,) = [json.loads(line) for line in body.splitlines()]
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    server.inject(Fault(action="status", status=429, retry_after_s=3, kind="Pod", verb="list"))
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{server.url}/api/v1/pods", timeout=10)
    assert refused.value.code == 429 and refused.value.headers["Retry-After"] == "3"
    assert _get(f"{server.url}/api/v1/pods")[0] == 200  # one-shot


def test_only_the_served_versions_are_discoverable_and_answer(fake_apiserver: Start) -> None:
    server = fake_apiserver(SEED_LAB, served={"resource.k8s.io": ["v1beta1"]})
    server.advance(4)
    groups = json.loads(_get(f"{server.url}/apis")[1])["groups"]
    dra = next(g for g in groups if g["name"] == "resource.k8s.io")
    assert [v["version"] for v in dra["versions"]] == ["v1beta1"]
    assert _get(f"{server.url}/apis/resource.k8s.io/v1/resourceslices")[0] == 404
    (item,) = json.loads(_get(f"{server.url}/apis/resource.k8s.io/v1beta1/resourceslices")[1])["items"]
    assert all(set(d) == {"name", "basic"} for d in item["spec"]["devices"])  # the v1beta1 shape
