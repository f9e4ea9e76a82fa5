"""Wasted device-hours of idle claims on shared devices follow usage's split (DESIGN §5, §11.5, §11.7).

A claim's ``wastedDeviceHours`` are the device-hours ``usage`` bills it over its idle period: a device held
by several allocations at once (shares of an ``allowMultipleAllocations`` device, or a double booking)
is split among them as usage splits it, and ``adminAccess`` allocations take no part. Counting
"idle hours x allocation results" instead billed a single shared NIC three times over.

The shared-device histories here: a device ``eth0`` published at minute 0, claims allocated at minute 0 with an
empty ``reservedFor`` (category ``unreserved``, idle from minute 0), and the report asked for at minute 120:
two idle hours. The last tests check every category's ``idleSince`` and that the report's statements do not grow
with the number of live claims.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from ledger import services
from ledger.config import DEFAULT
from ledger.projections import runner
from ledger.projections.queries import rfc3339
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject, JSONValue
from tests.factories import at, claim, gpu, history, namespace, pod, resource_slice, stamp, uid

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
    # eth0 (100G) held over [0, 120 min) by three allocations that usage bills: "other" (one 50G share) and
    # "two-shares" (two 25G shares). "monitor" looks at it with adminAccess, which is never billed.
    # Every billed share states its consumedCapacity, so usage bills each its fraction of the NIC (DESIGN §5):
    #   other      = 50G / 100G x 2 h                = 1.0 device-hours
    #   two-shares = 2 x 25G / 100G x 2 h            = 1.0 device-hours
    #   monitor    = adminAccess                     = 0
    # 2.0 device-hours together, the NIC's own two hours; the old report said 2.0 + 4.0 = 6.0, and the equal
    # split once gave 2/3 and 4/3.
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), namespace("ops", "ops"), nic(multi=True),
        nic_claim("other", "net-a", [share("5d0c4c39-0000-4000-8000-000000000001", "50G")]),
        nic_claim("two-shares", "net-b", [share("5d0c4c39-0000-4000-8000-000000000002", "25G"),
                                          share("5d0c4c39-0000-4000-8000-000000000003", "25G")]),
        nic_claim("monitor", "ops", [share("5d0c4c39-0000-4000-8000-000000000004", None, admin=True)])])

    hours = wasted(ledger)
    assert hours == {"other": 1.0, "two-shares": 1.0, "monitor": 0.0}
    assert sum(hours.values()) == pytest.approx(2.0, abs=1e-6)
    usage = billed(ledger)
    assert usage == {"net-a": 1.0, "net-b": 1.0}
    for name, ns in (("other", "net-a"), ("two-shares", "net-b")):
        assert hours[name] <= usage[ns] + 1e-6


def test_usage_its_rollups_and_the_shared_report_bill_consumable_shares_alike(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # eth0 (100G) held over [0, 120 min) by "big" (a 50G share, team a) and "small" (a 25G share, team b). Each is
    # billed its consumedCapacity fraction of the NIC, and the 25G nobody consumed is nobody's (DESIGN §5):
    #   big   = 50G / 100G x 2 h = 1.0 device-hours
    #   small = 25G / 100G x 2 h = 0.5 device-hours
    # At minute 60 the driver republishes eth0 with 200G. Each allocation keeps the capacity in force when it
    # began, so an hour costs the same whichever window asks: [60, 120) bills 0.5 and 0.25.
    device: JSONObject = {"name": "eth0", "attributes": {"model": {"string": "NIC-100G"}},
                          "allowMultipleAllocations": True, "capacity": {"bandwidth": {"value": "100G"}}}
    name, slice_uid = uid("nic-slice"), uid("slice")
    first = resource_slice(name=name, driver=NIC, devices=[device], slice_uid=slice_uid)
    wider = resource_slice(name=name, driver=NIC, slice_uid=slice_uid,
                           devices=[device | {"capacity": {"bandwidth": {"value": "200G"}}}])
    # GPU slices before and after the NIC's: the NIC's capacity must be found by its own key, never theirs.
    gpus = [resource_slice(name=uid("gpu-slice"), node=node, pool=node, devices=[gpu(f"gpu-{i}") for i in range(4)])
            for node in ("node-a", "node-b")]
    path = history(tmp_path / "shares.jsonl", [
        ("ADDED", namespace("net-a", "a"), 0), ("ADDED", namespace("net-b", "b"), 0), ("ADDED", gpus[0], 0),
        ("ADDED", first, 0), ("ADDED", gpus[1], 0),
        ("ADDED", nic_claim("big", "net-a", [share("5d0c4c39-0000-4000-8000-000000000011", "50G")]), 0),
        ("ADDED", nic_claim("small", "net-b", [share("5d0c4c39-0000-4000-8000-000000000012", "25G")]), 0),
        ("MODIFIED", wider, 60)])
    assert not ledger.replay(path).rejected

    def by_team(body: Any) -> dict[str, float]:
        return {row["team"]: row["deviceHours"] for row in body["rows"]}

    assert by_team(ledger.usage(at(0), REPORT_AT)) == {"a": 1.0, "b": 0.5}
    assert by_team(ledger.usage(at(60), REPORT_AT)) == {"a": 0.5, "b": 0.25}
    assert wasted(ledger) == {"big": 1.0, "small": 0.5}
    assert by_team(services.shared_usage(ledger.db, start=at(0), end=REPORT_AT, cluster=ledger.cluster)) == \
        {"a": 1.0, "b": 0.5}
    instant: Any = services.shared(ledger.db, at=at(90), cluster=ledger.cluster)
    [held] = instant["devices"]
    assert (held["split"], sorted(x["fraction"] for x in held["allocations"])) == ("consumedCapacity", [0.25, 0.5])
    # The hourly rollups (one per hour of the window, both whole) give the same hours as the live intervals.
    assert [chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)] == [2]
    for start in (at(0), at(30), at(60)):
        rolled: Any = services.usage_from_rollups(ledger.db, start=start, end=REPORT_AT, group_by="team",
                                                  cluster=ledger.cluster)
        assert by_team(rolled) == by_team(ledger.usage(start, REPORT_AT))
    with ledger.db.reading() as conn:
        hourly = conn.execute(text("SELECT team, hour, device_seconds FROM usage_rollups ORDER BY team, hour")).all()
    assert [(team, hour, seconds) for team, hour, seconds in hourly] == [
        ("a", at(0), 1800.0), ("a", at(60), 1800.0), ("b", at(0), 900.0), ("b", at(60), 900.0)]


def test_a_claim_alone_on_a_device_through_two_shares_is_billed_the_whole_device_everywhere(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # "pair" (team b) holds eth0 (100G) over [0, 120 min) through two 30G shares, and no other claim holds it: the
    # claim alone holds the device, as one 60G share would, so it is billed the NIC's two hours, an hour to each
    # share. The rule billed 2 x 30G / 100G x 2 h = 1.2 device-hours, where one 60G share was billed 2.0.
    replay(ledger, tmp_path, [
        namespace("net-b", "b"), nic(multi=True),
        nic_claim("pair", "net-b", [share("5d0c4c39-0000-4000-8000-000000000041", "30G"),
                                    share("5d0c4c39-0000-4000-8000-000000000042", "30G")])])

    assert billed(ledger) == {"net-b": 2.0}
    assert wasted(ledger) == {"pair": 2.0}
    assert [chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)] == [2]
    with ledger.db.reading() as conn:
        hourly = conn.execute(text("SELECT team, hour, device_seconds FROM usage_rollups ORDER BY hour")).all()
    assert [tuple(row) for row in hourly] == [("b", at(0), 3600.0), ("b", at(60), 3600.0)]
    window: Any = services.shared_usage(ledger.db, start=at(0), end=REPORT_AT, cluster=ledger.cluster)
    assert [(row["team"], row["deviceHours"]) for row in window["rows"]] == [("b", 2.0)]
    instant: Any = services.shared(ledger.db, at=at(90), cluster=ledger.cluster)
    [held] = instant["devices"]
    assert (held["split"], [x["fraction"] for x in held["allocations"]]) == ("whole", [0.5, 0.5])


def test_shared_device_hours_of_a_window_reaching_past_now_stop_at_now_as_usage_does(ledger: LedgerHandle,
                                                                                      tmp_path: Path) -> None:
    # Two claims of teams a and b hold eth0 (100G) from minute 0 on, never released, 50G each. Asked at minute 90
    # for [0, 240 min), shared_usage billed each 0.5 x 4 h = 2.0 device-hours, two hours of them not yet happened;
    # usage bills each 0.5 x 1.5 h = 0.75.
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=True),
        nic_claim("left-a", "net-a", [share("5d0c4c39-0000-4000-8000-000000000071", "50G")]),
        nic_claim("left-b", "net-b", [share("5d0c4c39-0000-4000-8000-000000000072", "50G")])])

    window: Any = services.shared_usage(ledger.db, start=at(0), end=at(240), cluster=ledger.cluster, now=at(90))
    assert [(row["team"], row["deviceHours"]) for row in window["rows"]] == [("a", 0.75), ("b", 0.75)]
    assert [(d["sharedHours"], d["billedDeviceHours"]) for d in window["devices"]] == [(1.5, 1.5)]
    usage: Any = services.usage(ledger.db, start=at(0), end=at(240), group_by="team", cluster=ledger.cluster,
                                now=at(90))
    assert [(row["team"], row["deviceHours"]) for row in usage["rows"]] == [("a", 0.75), ("b", 0.75)]


def test_shares_that_all_consume_nothing_split_the_device_equally(ledger: LedgerHandle, tmp_path: Path) -> None:
    # Two claims each state "0" of eth0's bandwidth: no fraction to weigh them by, so each is billed half of the
    # NIC's two hours (1.0), where both were billed nothing.
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=True),
        nic_claim("none-a", "net-a", [share("5d0c4c39-0000-4000-8000-000000000051", "0")]),
        nic_claim("none-b", "net-b", [share("5d0c4c39-0000-4000-8000-000000000052", "0")])])

    assert billed(ledger) == {"net-a": 1.0, "net-b": 1.0}
    assert wasted(ledger) == {"none-a": 1.0, "none-b": 1.0}


def test_a_team_whose_shares_consumed_nothing_beside_others_has_no_row_in_any_usage_answer(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # "idle" (team a) states 0 of eth0's bandwidth beside "half" (team b, 50G): team a is billed nothing, team b
    # 0.5 x 2 h = 1.0. Usage from the rollups left team a out, while the stepped series, a team-limited token's
    # usage and the shared report listed it with 0.0.
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=True),
        nic_claim("idle", "net-a", [share("5d0c4c39-0000-4000-8000-000000000061", "0")]),
        nic_claim("half", "net-b", [share("5d0c4c39-0000-4000-8000-000000000062", "50G")])])

    def rows(body: Any) -> list[tuple[str, float]]:
        return [(row["team"], row["deviceHours"]) for row in body["rows"]]

    plain = services.usage(ledger.db, start=at(0), end=REPORT_AT, group_by="team", cluster=ledger.cluster)
    stepped = services.usage(ledger.db, start=at(0), end=REPORT_AT, group_by="team", cluster=ledger.cluster,
                             step=timedelta(hours=1))
    limited = services.usage(ledger.db, start=at(0), end=REPORT_AT, group_by="team", cluster=ledger.cluster,
                             teams=["a", "b"])
    window = services.shared_usage(ledger.db, start=at(0), end=REPORT_AT, cluster=ledger.cluster)
    assert rows(plain) == rows(limited) == rows(window) == [("b", 1.0)]
    assert rows(stepped) == [("b", 0.5), ("b", 0.5)]
    assert wasted(ledger) == {"idle": 0.0, "half": 1.0}  # each idle claim keeps its row, with what it wasted
    # The hourly rollups (and so reporting.team_usage_hourly, Grafana's) held a 0-second row for team a.
    assert [chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)] == [2]
    with ledger.db.reading() as conn:
        for table in ("usage_rollups", "usage_rollups_by_team"):
            hourly = conn.execute(text(f"SELECT team, hour, device_seconds FROM {table} ORDER BY hour")).all()
            assert [tuple(row) for row in hourly] == [("b", at(0), 1800.0), ("b", at(60), 1800.0)]
        assert conn.execute(text("SELECT count(*) FROM reporting.team_usage_hourly WHERE team = 'a'")).scalar() == 0
    rolled = services.usage_from_rollups(ledger.db, start=at(0), end=REPORT_AT, group_by="team",
                                         cluster=ledger.cluster)
    assert rows(rolled) == [("b", 1.0)]


def test_a_share_stating_more_than_any_float_is_billed_as_the_whole_device_not_a_crash(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # "1e400" of the NIC's 100G was a ratio past any float: usage, the idle report and the rollups failed with
    # decimal.InvalidOperation (the API with 500s). It now counts as the whole device; with the other share's 100G
    # (also the whole device) the two add up to twice the NIC and are scaled down to half each: 1/2 x 2 h.
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=True),
        nic_claim("huge", "net-a", [share("5d0c4c39-0000-4000-8000-000000000031", "1e400")]),
        nic_claim("whole", "net-b", [share("5d0c4c39-0000-4000-8000-000000000032", "100G")])])

    assert billed(ledger) == {"net-a": 1.0, "net-b": 1.0}
    assert wasted(ledger) == {"huge": 1.0, "whole": 1.0}
    assert [chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)] == [2]


def test_a_slice_recorded_after_its_shares_were_rolled_up_makes_those_hours_roll_up_again(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # Two shares of eth0 (10G and 20G) over [0, 120 min), rolled up while the ledger knew no slice for eth0: no
    # capacity, so each hour split equally (1.0 each over the two hours). Then the slice arrives, created and seen at
    # minute 210: its 100G is the first capacity after the shares began, so they cost 0.1 and 0.2 of the NIC. The
    # rolled hours summed the old split and must be forgotten; they were kept (usage said 1.0 / 1.0 over the window,
    # 0.1 / 0.2 inside one hour, and a second rollup left them stale).
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"),
        nic_claim("ten", "net-a", [share("5d0c4c39-0000-4000-8000-000000000041", "10G")]),
        nic_claim("twenty", "net-b", [share("5d0c4c39-0000-4000-8000-000000000042", "20G")])])

    def usage_by_team() -> dict[str, float]:
        body: Any = services.usage(ledger.db, start=at(0), end=REPORT_AT, group_by="team", cluster=ledger.cluster)
        return {row["team"]: row["deviceHours"] for row in body["rows"]}

    assert [chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)] == [2]
    assert usage_by_team() == {"a": 1.0, "b": 1.0}
    late = nic(multi=True)
    meta = late["metadata"]
    assert isinstance(meta, dict)
    meta["creationTimestamp"] = stamp(210)
    assert not ledger.replay(history(tmp_path / "late.jsonl", [("ADDED", late, 210)])).rejected

    assert usage_by_team() == {"a": 0.2, "b": 0.4}
    assert sum(chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)) >= 2
    assert usage_by_team() == {"a": 0.2, "b": 0.4}
    with ledger.db.reading() as conn:
        rolled = conn.execute(text("SELECT team, sum(device_seconds) FROM usage_rollups GROUP BY team ORDER BY team"))
        assert [tuple(r) for r in rolled] == [("a", 720.0), ("b", 1440.0)]


def test_a_later_change_of_a_shared_device_keeps_the_hours_its_shares_rolled_up_before_it(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # eth0 published at minute 0 (100G), shares of 10G and 20G over [0, 120), rolled up: 0.2 and 0.4. At minute 200
    # the driver republishes eth0 with 200G. The shares began under the first row, so nothing rolled changes: the
    # hours stay (forgetting every rolled hour back to a device's first share on each republish would send a
    # year-old ledger's rollups back a year).
    device: JSONObject = {"name": "eth0", "attributes": {"model": {"string": "NIC-100G"}},
                          "allowMultipleAllocations": True, "capacity": {"bandwidth": {"value": "100G"}}}
    name, slice_uid = uid("nic-slice"), uid("slice")
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"),
        resource_slice(name=name, driver=NIC, devices=[device], slice_uid=slice_uid),
        nic_claim("ten", "net-a", [share("5d0c4c39-0000-4000-8000-000000000051", "10G")]),
        nic_claim("twenty", "net-b", [share("5d0c4c39-0000-4000-8000-000000000052", "20G")])])
    assert [chunk.hours for chunk in services.rollup_chunks(ledger.db, end=REPORT_AT)] == [2]
    rolled = ledger.rows("usage_rollups")
    assert sorted((r[2], r[-2]) for r in rolled) == [("a", 360.0), ("a", 360.0), ("b", 720.0), ("b", 720.0)]  # per hour

    wider = resource_slice(name=name, driver=NIC, slice_uid=slice_uid,
                           devices=[device | {"capacity": {"bandwidth": {"value": "200G"}}}])
    assert not ledger.replay(history(tmp_path / "wider.jsonl", [("MODIFIED", wider, 200)])).rejected
    assert [e.type for e in ledger.events(["DeviceUpdated"])] == ["DeviceUpdated"]

    assert ledger.rows("usage_rollups") == rolled


def test_a_consumed_capacity_named_with_the_drivers_domain_is_the_devices_capacity(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # eth0 publishes "bandwidth" (no domain: the driver's, nic.example.com). One share states
    # "nic.example.com/bandwidth": 25G, the other "bandwidth": 50G; both name the NIC's 100G, so they cost 0.25 and
    # 0.5 of its two hours. The qualified name was not matched, and the device fell back to the equal split.
    qualified = share("5d0c4c39-0000-4000-8000-000000000061", None) | {"consumedCapacity": {f"{NIC}/bandwidth": "25G"}}
    replay(ledger, tmp_path, [
        namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=True),
        nic_claim("quarter", "net-a", [qualified]),
        nic_claim("half", "net-b", [share("5d0c4c39-0000-4000-8000-000000000062", "50G")])])

    assert billed(ledger) == {"net-a": 0.5, "net-b": 1.0}
    assert wasted(ledger) == {"quarter": 0.5, "half": 1.0}


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


def test_a_double_booking_is_split_equally_even_when_its_results_state_consumed_capacity(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # eth0 does not allow multiple allocations, yet two claims hold it with results that state 25G of its 100G
    # (a scheduler or driver bug). The consumedCapacity split is for devices shared by design; a double booking is
    # split equally so that the teams' hours still add up to the device's own (DESIGN §11.5): 1/2 x 2 h each, where
    # the fractions would have billed 0.25 x 2 h = 0.5 each and lost an hour.
    replay(ledger, tmp_path, [namespace("net-a", "a"), namespace("net-b", "b"), nic(multi=False),
                              nic_claim("first", "net-a", [share("5d0c4c39-0000-4000-8000-000000000021", "25G")]),
                              nic_claim("second", "net-b", [share("5d0c4c39-0000-4000-8000-000000000022", "25G")])])

    assert billed(ledger) == {"net-a": 1.0, "net-b": 1.0}
    assert wasted(ledger) == {"first": 1.0, "second": 1.0}
    body: Any = services.shared_usage(ledger.db, start=at(0), end=REPORT_AT, cluster=ledger.cluster)
    assert {row["team"]: row["deviceHours"] for row in body["rows"]} == {"a": 1.0, "b": 1.0}
    instant: Any = services.shared(ledger.db, at=at(60), cluster=ledger.cluster)
    [device] = instant["devices"]
    assert (device["split"], device["conflict"]) == ("equal", True)


def busy_and_idle_claims(n: int) -> list[JSONObject]:
    """``n`` claims of each kind on ``n * 3`` GPUs of one slice, all made at minute 0:

    ``busy-i`` reserved by a Running pod (not listed), ``loose-i`` allocated and unreserved (``unreserved``),
    ``done-i`` reserved by a Succeeded pod (``inactive-consumers``), and ``wait-i``, a manual claim left pending
    that no pod references (``unreferenced``).
    """
    objects: list[JSONObject] = [namespace("ml", "vision"),
                                 resource_slice(name=uid("slice"), devices=[gpu(f"gpu-{i}") for i in range(3 * n)])]
    for i in range(n):
        busy_pod, done_pod = uid("pod"), uid("pod")
        objects += [pod(name=f"run-{i}", pod_uid=busy_pod, claim_name=f"busy-{i}"),
                    pod(name=f"fin-{i}", pod_uid=done_pod, phase="Succeeded", claim_name=f"done-{i}"),
                    claim(name=f"busy-{i}", claim_uid=uid("claim"), results=[f"gpu-{3 * i}"], allocated_at=0,
                          reserved=[(f"run-{i}", busy_pod)]),
                    claim(name=f"loose-{i}", claim_uid=uid("claim"), results=[f"gpu-{3 * i + 1}"], allocated_at=0),
                    claim(name=f"done-{i}", claim_uid=uid("claim"), results=[f"gpu-{3 * i + 2}"], allocated_at=0,
                          reserved=[(f"fin-{i}", done_pod)]),
                    claim(name=f"wait-{i}", claim_uid=uid("claim"))]
    return objects


def test_the_idle_report_reads_the_same_few_statements_however_many_claims_are_live(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    # The report used to ask the database once per live claim (when its reservedFor last ended), and three
    # more times per listed claim: its time grew with the cluster. Now each kind of evidence is one query.
    statements: dict[int, int] = {}
    for n in (2, 6):
        ledger = ledger_factory()
        (tmp_path / str(n)).mkdir()
        replay(ledger, tmp_path / str(n), busy_and_idle_claims(n))
        runner.catch_up(ledger.engine)
        body, statements[n] = report_and_statements(ledger)
        rows = {row["name"]: (row["category"], row["devices"], row["wastedDeviceHours"]) for row in body["claims"]}
        expected = {}
        for i in range(n):
            expected[f"loose-{i}"] = ("unreserved", [f"gpu.example.com/node-a/gpu-{3 * i + 1}"], 2.0)
            expected[f"done-{i}"] = ("inactive-consumers", [f"gpu.example.com/node-a/gpu-{3 * i + 2}"], 2.0)
            expected[f"wait-{i}"] = ("unreferenced", [], 0.0)
        assert rows == expected
    assert statements[2] == statements[6]


def report_and_statements(ledger: LedgerHandle) -> tuple[Any, int]:
    """The idle report at :data:`REPORT_AT` and how many SQL statements it sent."""
    seen: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen.append(statement)

    event.listen(ledger.engine, "before_cursor_execute", count)
    try:
        body: Any = services.idle_report(ledger.db, at=REPORT_AT, config=DEFAULT, cluster=ledger.cluster)
    finally:
        event.remove(ledger.engine, "before_cursor_execute", count)
    return body, len(seen)


def test_idle_since_follows_the_last_reservation_and_the_last_pod_reference(
        ledger: LedgerHandle, tmp_path: Path) -> None:
    # freed: reserved by a pod from minute 0 to 45, then its reservedFor emptied: unreserved since minute 45.
    # left: a pending manual claim a pod referenced until the pod went at minute 30: unreferenced since 30.
    # used: a pending manual claim a Running pod still references at minute 120: not listed.
    # never: a pending manual claim made at minute 10 that no pod referenced: unreferenced since 10.
    pod_a, pod_b, pod_c, freed_uid = uid("pod"), uid("pod"), uid("pod"), uid("claim")
    left_pod = pod(name="b", pod_uid=pod_b, claim_name="left")
    path = history(tmp_path / "since.jsonl", [
        ("ADDED", namespace("ml", "vision"), 0),
        ("ADDED", resource_slice(name=uid("slice"), devices=[gpu("gpu-0")]), 0),
        ("ADDED", pod(name="a", pod_uid=pod_a, claim_name="freed"), 0),
        ("ADDED", left_pod, 0),
        ("ADDED", pod(name="c", pod_uid=pod_c, claim_name="used"), 0),
        ("ADDED", claim(name="freed", claim_uid=freed_uid, results=["gpu-0"], allocated_at=0,
                        reserved=[("a", pod_a)]), 0),
        ("ADDED", claim(name="left", claim_uid=uid("claim")), 0),
        ("ADDED", claim(name="used", claim_uid=uid("claim")), 0),
        ("ADDED", claim(name="never", claim_uid=uid("claim"), created_at=10), 10),
        ("DELETED", left_pod, 30),
        ("MODIFIED", claim(name="freed", claim_uid=freed_uid, results=["gpu-0"], allocated_at=0), 45),
    ])
    assert not ledger.replay(path).rejected
    body: Any = services.idle_report(ledger.db, at=REPORT_AT, config=DEFAULT, cluster=ledger.cluster,
                                     min_idle=timedelta(0))
    rows = {row["name"]: (row["category"], row["idleSince"], row["wastedDeviceHours"]) for row in body["claims"]}
    assert rows == {"freed": ("unreserved", rfc3339(at(45)), 1.25),
                    "left": ("unreferenced", rfc3339(at(30)), 0.0),
                    "never": ("unreferenced", rfc3339(at(10)), 0.0)}
