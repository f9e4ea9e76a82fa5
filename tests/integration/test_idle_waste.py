"""Wasted device-hours of idle claims on shared devices follow usage's split (DESIGN §5, §11.5, §11.7).

A claim's ``wastedDeviceHours`` are the device-hours ``usage`` bills it over its idle period: a device held
by several allocations at once (shares of an ``allowMultipleAllocations`` device, or a double booking)
is split among them as usage splits it, and ``adminAccess`` allocations take no part. Counting
"idle hours x allocation results" instead billed a single shared NIC three times over.

Every history here: a device ``eth0`` published at minute 0, claims allocated at minute 0 with an empty
``reservedFor`` (category ``unreserved``, idle from minute 0), and the report asked for at minute 120:
two idle hours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger import services
from ledger.config import DEFAULT
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject, JSONValue
from tests.factories import at, claim, history, namespace, resource_slice, uid

NIC = "nic.example.com"
REPORT_AT = at(120)


def nic(*, multi: bool) -> JSONObject:
    """A slice with one NIC ``eth0`` of 100G bandwidth (``allowMultipleAllocations`` when ``multi``)."""
    device: JSONObject = {"name": "eth0", "attributes": {"model": {"string": "NIC-100G"}},
                          "capacity": {"bandwidth": {"value": "100G"}}}
    if multi:
        device["allowMultipleAllocations"] = True
    return resource_slice(name=uid("nic-slice"), driver=NIC, devices=[device])


def nic_claim(name: str, ns: str, results: list[JSONObject]) -> JSONObject:
    """An unreserved claim in ``ns`` allocated at minute 0 with ``results`` (each merged into a result of eth0)."""
    obj = claim(name=name, namespace=ns, claim_uid=uid("claim"), count=len(results), device_class="nic.example.com",
                results=["eth0"] * len(results), allocated_at=0, driver=NIC)
    status = obj["status"]
    assert isinstance(status, dict)
    allocation = status["allocation"]
    assert isinstance(allocation, dict)
    devices = allocation["devices"]
    assert isinstance(devices, dict)
    listed = devices["results"]
    assert isinstance(listed, list)
    for result, extra in zip(listed, results, strict=True):
        assert isinstance(result, dict)
        result.update(extra)
    return obj


def replay(ledger: LedgerHandle, tmp_path: Path, objects: list[JSONObject]) -> None:
    """Replay ``objects`` (namespaces first) as ADDED at minute 0."""
    path = history(tmp_path / "idle.jsonl", [("ADDED", o, 0) for o in objects])
    assert not ledger.replay(path).rejected


def wasted(ledger: LedgerHandle) -> dict[str, float]:
    """``wastedDeviceHours`` per claim name in the idle report at :data:`REPORT_AT` (service body = API = CLI)."""
    body: Any = services.idle_report(ledger.db, at=REPORT_AT, config=DEFAULT, cluster=ledger.cluster)
    return {row["name"]: row["wastedDeviceHours"] for row in body["claims"]}


def billed(ledger: LedgerHandle) -> dict[str, float]:
    """Device-hours ``usage`` bills per namespace over the same two idle hours (one claim per namespace)."""
    body: Any = ledger.usage(at(0), REPORT_AT, group_by="namespace")
    out: dict[str, float] = {}
    for row in body["rows"]:
        out[row["namespace"]] = out.get(row["namespace"], 0.0) + row["deviceHours"]
    return out


def share(share_id: str, bandwidth: str | None, *, admin: bool = False) -> JSONObject:
    """Extra fields of one allocation result: a ``shareID``, what it consumed, ``adminAccess``."""
    extra: dict[str, JSONValue] = {"shareID": share_id}
    if bandwidth is not None:
        extra["consumedCapacity"] = {"bandwidth": bandwidth}
    if admin:
        extra["adminAccess"] = True
    return extra


def test_shares_of_one_nic_waste_no_more_than_the_nic_and_no_more_than_usage_bills(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # eth0 held over [0, 120 min) by three allocations that usage bills: "other" (one 50G share) and
    # "two-shares" (two 25G shares). "monitor" looks at it with adminAccess, which is never billed.
    # usage splits each device-second equally among the allocations holding it (DESIGN §11.5), so every
    # allocation gets 1/3 of the NIC:
    #   other      = 1 allocation  x 1/3 x 2 h = 0.666667 device-hours
    #   two-shares = 2 allocations x 1/3 x 2 h = 1.333333 device-hours
    #   monitor    = adminAccess             = 0
    # 2.0 device-hours together, the NIC's own two hours; the old report said 2.0 + 4.0 = 6.0.
    # (The consumedCapacity fractions of ``shared`` would give 0.5 x 2 h = 1.0 and 2 x 0.25 x 2 h = 1.0,
    # but usage does not bill by them: "other" would then waste more than it is billed.)
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), namespace("ops", "ops"), nic(multi=True),
        nic_claim("other", "net-a", [share("5d0c4c39-0000-4000-8000-000000000001", "50G")]),
        nic_claim("two-shares", "net-b", [share("5d0c4c39-0000-4000-8000-000000000002", "25G"),
                                          share("5d0c4c39-0000-4000-8000-000000000003", "25G")]),
        nic_claim("monitor", "ops", [share("5d0c4c39-0000-4000-8000-000000000004", None, admin=True)])])

    hours = wasted(ledger)
    assert hours == {"other": round(2 / 3, 6), "two-shares": round(4 / 3, 6), "monitor": 0.0}
    assert sum(hours.values()) == pytest.approx(2.0, abs=1e-6)
    usage = billed(ledger)
    assert usage == {"net-a": round(2 / 3, 6), "net-b": round(4 / 3, 6)}
    for name, ns in (("other", "net-a"), ("two-shares", "net-b")):
        assert hours[name] <= usage[ns] + 1e-6


def test_a_device_listed_twice_without_share_id_is_wasted_once(ledger: LedgerHandle, tmp_path: Path) -> None:
    # A malformed claim lists eth0 (no allowMultipleAllocations) twice with no shareID: two allocations of
    # one device, a conflict (DESIGN §11.5). usage bills each of them half the device: 2 x 1/2 x 2 h = 2.0
    # device-hours for the claim, the device's own two hours; the old report said 2 x 2 h = 4.0.
    replay(ledger, tmp_path, [namespace("net-a", "a"), nic(multi=False),
                              nic_claim("doubled", "net-a", [{}, {}])])

    assert wasted(ledger) == {"doubled": 2.0}
    assert billed(ledger) == {"net-a": 2.0}


def test_a_double_booked_device_is_wasted_by_halves(ledger: LedgerHandle, tmp_path: Path) -> None:
    # Two claims hold eth0 (no allowMultipleAllocations) at once, a scheduler or driver bug (DESIGN §11.5):
    # usage bills each half the device, 1/2 x 2 h = 1.0; the old report said 2.0 each.
    replay(ledger, tmp_path, [namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=False),
                              nic_claim("first", "net-a", [{}]), nic_claim("second", "net-b", [{}])])

    hours = wasted(ledger)
    assert hours == {"first": 1.0, "second": 1.0}
    usage = billed(ledger)
    assert hours["first"] <= usage["net-a"] and hours["second"] <= usage["net-b"]
