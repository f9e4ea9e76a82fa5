"""Occupancy pages: every device once across pages, totals from SQL equal to totals counted by hand,
team-limited pages with the meaning a team-limited token always had.

The reference counts below are the rules of DESIGN §5 written out in Python over the full device list
(what ``queries.occupancy`` computed in Python before totals moved into SQL).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger.errors import Invalid
from ledger.projections import queries
from ledger.simulate import FleetSpec, write_history
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

FLEET = FleetSpec(nodes=6, gpus_per_node=4, hours=6, seed=11, mig_node_fraction=0.5, restarts_per_node_day=6.0,
                  idle_fraction=0.1, pending_fraction=0.05)
"""MIG counter sets, shared NICs, multi-consumer claims, restarts: a few hundred devices."""


def _instants() -> list[datetime]:
    return [FLEET.start + timedelta(minutes=m) for m in (0, 45, 130, 200, 290, 359)]


def _pages(ledger: LedgerHandle, at: datetime, *, limit: int, teams: frozenset[str] | None = None
           ) -> list[Any]:
    pages: list[Any] = []
    after: queries.DeviceSortKey | None = None
    with ledger.engine.connect() as conn:
        while True:
            page = queries.occupancy(conn, at=at, cluster=ledger.cluster, teams=teams, after=after, limit=limit)
            pages.append(page.body)
            assert len(page.body["devices"]) <= limit  # type: ignore[arg-type]  # a list
            if page.next_after is None:
                return pages
            after = page.next_after


def _units(ledger: LedgerHandle, at: datetime) -> dict[tuple[str, str, str, str], str]:
    """Counter set (or the device itself) of every device in the inventory at ``at``."""
    with ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT cluster, driver, pool, device, counter_set FROM device_inventory "
                                 "WHERE valid @> :at"), {"at": at}).all()
    return {(r.cluster, r.driver, r.pool, r.device): r.counter_set or f"device:{r.device}" for r in rows}


def _by_hand(devices: list[Any], units: dict[tuple[str, str, str, str], str]) -> dict[str, int]:
    """DESIGN §5 totals: a counter set is one unit; adminAccess never occupies (an off-slice device it alone
    holds is no unit); shared = more than one holding allocation, or more than one live consumer among them."""
    every, allocated, shared = set(), set(), set()
    for d in devices:
        key = (d["cluster"], d["driver"], d["pool"], d["device"])
        unit = (d["cluster"], d["driver"], d["pool"], f"device:{d['device']}" if d["offSlice"] else units[key])
        holding = [a for a in d["allocations"] if not a["adminAccess"]]
        if holding or not d["offSlice"]:
            every.add(unit)
        if holding:
            allocated.add(unit)
        if len(holding) > 1 or sum(len(a["consumers"]) for a in holding) > 1:
            shared.add(unit)
    return {"devices": len(every), "allocated": len(allocated), "free": len(every) - len(allocated),
            "shared": len(shared)}


def _scoped_by_hand(devices: list[Any], teams: frozenset[str]) -> tuple[list[Any], dict[str, int]]:
    """What a team-limited token sees: devices its teams hold, only their allocations, totals per device."""
    mine = []
    for d in devices:
        visible = [a for a in d["allocations"] if a["team"] in teams]
        if visible:
            mine.append({**d, "allocations": visible})
    allocated = [d for d in mine if any(not a["adminAccess"] for a in d["allocations"])]
    shared = [d for d in mine
              if len(h := [a for a in d["allocations"] if not a["adminAccess"]]) > 1
              or sum(len(a["consumers"]) for a in h) > 1]
    # An off-slice device counts only while a visible non-adminAccess allocation holds it.
    counted = [d for d in mine if not d["offSlice"] or any(not a["adminAccess"] for a in d["allocations"])]
    return mine, {"devices": len(counted), "allocated": len(allocated), "free": len(counted) - len(allocated),
                  "shared": len(shared)}


@pytest.fixture()
def fleet(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    path = tmp_path / "fleet.jsonl"
    write_history(FLEET, path)
    ledger.replay(path)
    ledger.occupancy(FLEET.start)  # catch up
    return ledger


def test_pages_list_every_device_exactly_once_in_order_with_the_same_totals(fleet: LedgerHandle) -> None:
    for at in _instants():
        whole: Any = fleet.occupancy(at)
        pages = _pages(fleet, at, limit=7)
        listed = [d for p in pages for d in p["devices"]]
        assert listed == whole["devices"]
        keys = [(d["cluster"], d["driver"], d["pool"], d["device"]) for d in listed]
        assert keys == sorted(set(keys))  # each once, in (cluster, driver, pool, device) order
        assert all(p["totals"] == whole["totals"] for p in pages)
        assert len(pages) == -(-len(listed) // 7)  # no empty trailing page


def test_totals_from_sql_equal_the_totals_counted_by_hand(fleet: LedgerHandle) -> None:
    counted = []
    for at in _instants():
        body: Any = fleet.occupancy(at)
        assert body["totals"] == _by_hand(body["devices"], _units(fleet, at)), at
        counted.append(body["totals"])
    # The fleet really exercises the rules: counter sets merge devices, some units are shared.
    assert any(t["shared"] > 0 for t in counted) and any(t["allocated"] > 0 for t in counted)
    assert any(t["devices"] < len(fleet.occupancy(at)["devices"]) for at, t in  # type: ignore[arg-type]
               zip(_instants(), counted, strict=True))


def test_seed_lab_totals_at_half_past_nine_are_the_ones_worked_out_by_hand(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    at = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
    # 8 GPUs; 6 held (gpu-0, gpu-2/3 pair, gpu-7, and the shared claim's gpu); the shared claim has two pods.
    with ledger.engine.connect() as conn:
        totals = queries.occupancy_totals(conn, at=at, scope=queries.OccupancyScope(cluster=ledger.cluster))
    assert totals == {"devices": 8, "allocated": 6, "free": 2, "shared": 1}
    first = _pages(ledger, at, limit=3)
    assert [len(p["devices"]) for p in first] == [3, 3, 2]


def test_team_limited_pages_show_the_teams_devices_and_their_totals(fleet: LedgerHandle) -> None:
    for at in _instants()[1:]:
        whole: Any = fleet.occupancy(at)
        teams_held = sorted({a["team"] for d in whole["devices"] for a in d["allocations"]})
        assert teams_held, at
        for teams in (frozenset(teams_held[:1]), frozenset(teams_held[1:3]), frozenset({"nobody"})):
            expected, totals = _scoped_by_hand(whole["devices"], teams)
            pages = _pages(fleet, at, limit=5, teams=teams)
            assert [d for p in pages for d in p["devices"]] == expected
            assert all(p["totals"] == totals for p in pages)
            with fleet.engine.connect() as conn:
                assert queries.occupancy_all(conn, at=at, cluster=fleet.cluster, teams=teams)["devices"] == expected


def test_a_page_limit_outside_one_to_a_thousand_is_invalid(ledger: LedgerHandle) -> None:
    with ledger.engine.connect() as conn, pytest.raises(Invalid):
        queries.occupancy(conn, at=FLEET.start, limit=0)
    with ledger.engine.connect() as conn, pytest.raises(Invalid):
        queries.occupancy(conn, at=FLEET.start, limit=queries.OCCUPANCY_MAX_LIMIT + 1)
