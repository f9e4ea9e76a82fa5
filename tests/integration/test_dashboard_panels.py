"""The dashboard's panels answer what the API answers, run as Grafana runs them.

Each test takes a panel's SQL from the shipped dashboard JSON, expands Grafana's macros as Grafana's SQL
data sources expand them (:func:`tests.integration.test_reporting.grafana_sql`), runs it as ``ledger_reader``
and compares the rows with the service's answer and with values worked out by hand or taken from
``seed-lab.expected.json``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger import services
from ledger.projections import queries
from ledger.recorded import parse_time
from ledger.simulate import write_history
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests.factories import at, claim, dig, gpu, history, namespace, resource_slice, uid
from tests.integration.test_reporting import dashboard, grafana_sql
from tests.integration.test_simulate import SMALL
from tests.paths import HISTORIES

OCCUPANCY_PANEL = "Devices and allocated devices"
TEAM_PANEL = "Allocated devices per team"
USAGE_PANELS = ("Device-hours per team per hour", "Device-hours per team and DeviceClass")


def panel_sql(title: str) -> str:
    """The one query of the dashboard panel titled ``title``."""
    [panel] = [p for p in dashboard()["panels"] if p["title"] == title]
    [target] = panel["targets"]
    sql = target["rawSql"]
    assert isinstance(sql, str)
    return sql


def run_as_reader(ledger: LedgerHandle, sql: str, *, start: datetime, end: datetime, interval: str = "5m",
                  time_zone: str = "UTC") -> list[Any]:
    """Rows of a panel's SQL over the dashboard range ``[start, end]`` at ``interval`` (Grafana's ``$__interval``),
    run as role ``ledger_reader`` in a session of ``time_zone``."""
    with ledger.engine.connect() as conn:
        conn.begin()
        conn.execute(text("SET ROLE ledger_reader"))
        conn.execute(text("SELECT set_config('TimeZone', :tz, true)"), {"tz": time_zone})
        rows = conn.execute(text(grafana_sql(sql, start=start, end=end, interval=interval).replace(":", r"\:"))).all()
        conn.rollback()
    return list(rows)


# --- occupancy: a GPU and its MIG partitions are one piece of hardware ----------------------------

COUNTERS = "gpu-0-counters"


def mig(name: str, memory: str) -> JSONObject:
    """A device of pool node-a that consumes ``memory`` of counter set ``gpu-0-counters``."""
    return gpu(name, counters=[{"counterSet": COUNTERS, "counters": {"memory": {"value": memory}}}])


@pytest.fixture()
def mig_fleet(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    """Pool node-a: gpu-0 (80Gi) and gpu-0-mig-0..3 (20Gi each) consume counter set gpu-0-counters (80Gi, in a
    slice of its own); gpu-1 and gpu-3 consume nothing. Pool node-b: gpu-2, whose slice is deleted at minute 40.

    Minutes after 09:00: claim a holds gpu-0-mig-0 from 10, b gpu-0-mig-1 from 20, c gpu-1 from 30 and e gpu-2
    (node-b) from 15 on; none is ever released, so gpu-2 is held off-slice from 40 on.
    """
    counters = resource_slice(name="node-a-counters", count=2, devices=[])
    spec = dig(counters, "spec")
    del spec["devices"], spec["nodeName"]
    spec["sharedCounters"] = [{"name": COUNTERS, "counters": {"memory": {"value": "80Gi"}}}]
    devices = resource_slice(name="node-a-gpus", count=2, devices=[
        mig("gpu-0", "80Gi"), *(mig(f"gpu-0-mig-{i}", "20Gi") for i in range(4)), gpu("gpu-1"), gpu("gpu-3")])
    node_b = resource_slice(name="node-b-gpus", pool="node-b", node="node-b", devices=[gpu("gpu-2")])
    held = [("a", "gpu-0-mig-0", "node-a", 10), ("b", "gpu-0-mig-1", "node-a", 20), ("e", "gpu-2", "node-b", 15),
            ("c", "gpu-1", "node-a", 30)]
    lines: list[tuple[str, JSONObject, float]] = [
        ("ADDED", namespace("ml", "vision"), 0), ("ADDED", counters, 0), ("ADDED", devices, 0),
        ("ADDED", node_b, 0)]
    lines += sorted(((("ADDED", claim(name=name, claim_uid=uid("claim"), results=[device], allocated_at=minute,
                                      pool=pool), minute)) for name, device, pool, minute in held),
                    key=lambda line: line[2])
    lines.append(("DELETED", node_b, 40))
    assert not ledger.replay(history(tmp_path / "mig.jsonl", lines)).rejected
    return ledger


# By hand, at minutes after 09:00. Hardware: the counter set (gpu-0 and its 4 partitions), gpu-1, gpu-3, gpu-2.
# 05: all four published, nothing held -> 4 / 0. 25: a and b hold two partitions of the one set, e holds gpu-2
# -> 4 / 2. 45: c holds gpu-1 too; gpu-2's slice is gone but e still holds it (off-slice, counted) -> 4 / 3.
# Counting devices one by one gave 8 / 0, 8 / 3 and 7 / 4.
BY_HAND = {at(5): (4, 0), at(25): (4, 2), at(45): (4, 3)}


def test_the_occupancy_panel_counts_a_gpu_and_its_partitions_once_as_the_api_does(mig_fleet: LedgerHandle) -> None:
    for t, (devices, allocated) in BY_HAND.items():
        totals = mig_fleet.occupancy(t)["totals"]
        assert isinstance(totals, dict)
        assert (totals["devices"], totals["allocated"]) == (devices, allocated), t
        [(time, panel_devices, panel_allocated)] = run_as_reader(mig_fleet, panel_sql(OCCUPANCY_PANEL), start=t, end=t)
        assert (time, panel_devices, panel_allocated) == (t, devices, allocated)


def test_every_point_of_the_occupancy_panel_is_the_apis_totals_at_that_instant(mig_fleet: LedgerHandle) -> None:
    start, end = at(0), at(60)
    rows = run_as_reader(mig_fleet, panel_sql(OCCUPANCY_PANEL), start=start, end=end)
    assert [r[0] for r in rows] == [start + timedelta(minutes=5 * i) for i in range(13)]  # every 5m, both ends
    for time, devices, allocated in rows:  # the series: devices, allocated
        totals = mig_fleet.occupancy(time)["totals"]
        assert isinstance(totals, dict)
        assert (devices, allocated) == (totals["devices"], totals["allocated"]), time


def test_day_points_stay_24_hours_apart_across_a_daylight_saving_change(mig_fleet: LedgerHandle) -> None:
    # New York leaves daylight saving time on 2026-11-01: a day added in that session's calendar is 25 hours, and
    # a point labelled so was counted for another instant than the one it was drawn at.
    start = at(-3 * 24 * 60 + 45)
    rows = run_as_reader(mig_fleet, panel_sql(OCCUPANCY_PANEL), start=start, end=at(45), interval="1d",
                         time_zone="America/New_York")
    assert [r[0] for r in rows] == [start + timedelta(days=i) for i in range(4)]
    assert rows[-1][1:] == BY_HAND[at(45)]
    for time, devices, allocated in rows:
        totals: Any = mig_fleet.occupancy(time)["totals"]
        assert (devices, allocated) == (totals["devices"], totals["allocated"]), time
    teams = run_as_reader(mig_fleet, panel_sql(TEAM_PANEL), start=start, end=at(45), interval="1d",
                          time_zone="America/New_York")
    # One by one at minute 45: a and b's two partitions, c's gpu-1 and e's gpu-2, all of namespace ml (vision).
    assert [(r[0], r[1], r[2]) for r in teams] == [(at(45), "vision", 4)]


def test_the_occupancy_panel_follows_a_simulated_fleet_as_the_api_does(ledger: LedgerHandle, tmp_path: Path) -> None:
    # MIG counter sets, driver restarts (slices republished), shared and multi-consumer claims, idle claims.
    write_history(SMALL, tmp_path / "fleet.jsonl")
    assert not ledger.replay(tmp_path / "fleet.jsonl").rejected
    start, end = SMALL.start, SMALL.start + timedelta(hours=SMALL.hours)
    rows = run_as_reader(ledger, panel_sql(OCCUPANCY_PANEL), start=start, end=end)  # every 5 minutes
    assert len(rows) == SMALL.hours * 12 + 1
    with ledger.engine.connect() as conn:
        for time, devices, allocated in rows:
            totals = queries.occupancy_totals(conn, at=time, scope=queries.OccupancyScope(cluster=ledger.cluster))
            assert (devices, allocated) == (totals["devices"], totals["allocated"]), time
    assert any(allocated for _, _, allocated in rows)
    # At the start nothing is held: the devices are the published ones, each counter set's GPU and partitions once.
    [(plain, sets, partitions)] = run_as_reader(ledger, (
        "SELECT count(*) FILTER (WHERE counter_set IS NULL), count(DISTINCT (driver, pool, counter_set)) "
        "FILTER (WHERE counter_set IS NOT NULL), "
        "count(*) FILTER (WHERE counter_set IS NOT NULL) FROM reporting.device_inventory "
        "WHERE cluster IN ($cluster) AND published_from <= $__timeFrom() "
        "AND (published_to IS NULL OR published_to > $__timeFrom())"), start=start, end=end)
    assert partitions > sets > 0 and rows[0][1:] == (plain + sets, 0)


def test_every_point_of_the_team_panel_is_what_a_team_limited_token_is_told(ledger: LedgerHandle,
                                                                            tmp_path: Path) -> None:
    write_history(SMALL, tmp_path / "fleet.jsonl")
    assert not ledger.replay(tmp_path / "fleet.jsonl").rejected
    start, end = SMALL.start, SMALL.start + timedelta(hours=SMALL.hours)
    rows = run_as_reader(ledger, panel_sql(TEAM_PANEL), start=start, end=end)  # every 5 minutes
    panel = {(time, team): value for time, team, value in rows}
    assert len(panel) == len(rows) and all(value > 0 for value in panel.values())  # a point is left out at 0
    with ledger.engine.connect() as conn:  # every team that ever held a device, whether the panel shows it or not
        teams = set(conn.execute(text("SELECT DISTINCT team FROM reporting.device_occupancy WHERE team IS NOT NULL "
                                      "AND NOT admin_access")).scalars())
    assert len(teams) > 1 and {team for _, team in panel} <= teams
    with ledger.engine.connect() as conn:
        for time in (start + timedelta(minutes=5 * i) for i in range(int(SMALL.hours * 12) + 1)):
            for team in teams:
                scope = queries.OccupancyScope(cluster=ledger.cluster, teams=frozenset({team}))
                allocated = queries.occupancy_totals(conn, at=time, scope=scope)["allocated"]
                assert panel.get((time, team), 0) == allocated, (time, team)


# --- usage: the hour that starts at the range's end is not in the range ---------------------------

EXPECTED = json.loads((HISTORIES / "seed-lab.expected.json").read_text())["device_hours"]


@pytest.fixture()
def rolled_past_the_window(ledger: LedgerHandle) -> LedgerHandle:
    """The seed lab, rolled up over 09:00-13:00: one rolled hour more than the fixture's window [09:00, 12:00)."""
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    assert services.rollup_usage(ledger.db, start=parse_time("2026-11-02T09:00:00Z"),
                                 end=parse_time("2026-11-02T13:00:00Z")) == 4
    return ledger


def hours_by_team(title: str, rows: list[Any]) -> dict[str, float]:
    """Device-hours per team in a usage panel's rows (every row is of one DeviceClass in the seed lab)."""
    out: dict[str, float] = defaultdict(float)
    for row in rows:
        team = row.team if title == "Device-hours per team and DeviceClass" else row.metric.split(" / ")[0]
        out[team] += float(row.device_hours if title == "Device-hours per team and DeviceClass" else row.value)
    return dict(out)


@pytest.mark.parametrize("title", USAGE_PANELS)
def test_a_usage_panel_over_whole_hours_is_the_usage_of_that_window(rolled_past_the_window: LedgerHandle,
                                                                     title: str) -> None:
    start, end = parse_time(EXPECTED["from"]), parse_time(EXPECTED["to"])
    rows = run_as_reader(rolled_past_the_window, panel_sql(title), start=start, end=end)
    if title == "Device-hours per team per hour":
        assert sorted({r.time for r in rows}) == [start + timedelta(hours=h) for h in range(3)]  # not 12:00
    assert hours_by_team(title, rows) == pytest.approx(EXPECTED["by_team"], abs=EXPECTED["tolerance_hours"])
    # The API's answer for the same window, from the same rollups.
    body: Any = services.usage(rolled_past_the_window.db, start=start, end=end, group_by="team")
    api = {r["team"]: r["deviceHours"] for r in body["rows"]}
    assert hours_by_team(title, rows) == pytest.approx(api, abs=0.0005)  # the table rounds to 3 decimals
