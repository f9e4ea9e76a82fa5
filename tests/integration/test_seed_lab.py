"""Every check of ``seed-lab.expected.json`` through the CLI's JSON output, on a real PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from ledger.cli import app
from ledger.recorded import parse_time
from tests.paths import HISTORIES

SEED = HISTORIES / "seed-lab.jsonl"
EXPECTED: dict[str, Any] = json.loads((HISTORIES / "seed-lab.expected.json").read_text())
CHECKS = EXPECTED["checks"]
# The expected file gives times to the minute; the history observes each change one second after the
# minute (e.g. reservedFor emptied at 11:00:01 for an expected idle_since of 11:00:00).
TIME_SLACK = timedelta(seconds=5)


def cli(engine: Engine, *args: str) -> Any:
    """Run ``dra-ledger ARGS --database-url URL`` in-process; return parsed JSON output."""
    url = engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(app, [*args, "--database-url", url])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if "json" in args else result.output


@pytest.fixture()
def seeded(ledger_engine: Engine) -> Engine:
    cli(ledger_engine, "replay", str(SEED), "--cluster", "seed-lab")
    return ledger_engine


@pytest.mark.parametrize("check", CHECKS, ids=[c["at"] for c in CHECKS])
def test_occupancy_totals_and_holders_match(seeded: Engine, check: dict[str, Any]) -> None:
    body = cli(seeded, "occupancy", "--at", check["at"], "--output", "json")
    totals = body["totals"]
    for field, key in (("devices_total", "devices"), ("devices_allocated", "allocated"), ("devices_free", "free")):
        if field in check:
            assert totals[key] == check[field], field
    assert totals["free"] >= 0 and totals["allocated"] <= totals["devices"]
    held = {d["device"]: f"{a['namespace']}/{a['claim']}" for d in body["devices"] for a in d["allocations"]
            if not a["adminAccess"]}
    if "allocated" in check:
        assert held == check["allocated"]
    if "team_devices" in check:
        teams = Counter(a["team"] for d in body["devices"] for a in d["allocations"] if not a["adminAccess"])
        assert dict(teams) == check["team_devices"]
    if "shared_devices" in check:
        shared = {d["device"]: sorted(c for a in d["allocations"] for c in a["consumers"])
                  for d in body["devices"]
                  if sum(len(a["consumers"]) for a in d["allocations"]) > 1}
        assert shared == check["shared_devices"]
        assert totals["shared"] == len(check["shared_devices"])


@pytest.mark.parametrize("check", [c for c in CHECKS if "pending_claims" in c], ids=lambda c: c["at"])
def test_pending_claims_and_requested_devices_match(seeded: Engine, check: dict[str, Any]) -> None:
    body = cli(seeded, "claims", "--state", "pending", "--at", check["at"], "--output", "json")
    pending = {f"{c['namespace']}/{c['name']}": sum(c["requested"].values()) for c in body["claims"]}
    assert pending == check["pending_claims"]


@pytest.mark.parametrize("check", [c for c in CHECKS if "idle_claims" in c], ids=lambda c: c["at"])
def test_idle_claims_match(seeded: Engine, check: dict[str, Any]) -> None:
    body = cli(seeded, "idle-claims", "--at", check["at"], "--output", "json")
    rows = {f"{c['namespace']}/{c['name']}": c for c in body["claims"]}
    assert set(rows) == set(check["idle_claims"])
    for name, expected in check["idle_claims"].items():
        row = rows[name]
        assert abs(parse_time(row["idleSince"]) - parse_time(expected["idle_since"])) <= TIME_SLACK
        assert expected["reason"] == "allocated, reservedFor empty" and row["category"] == "unreserved"
        hours = (parse_time(check["at"]) - parse_time(row["idleSince"])).total_seconds() / 3600
        assert row["wastedDeviceHours"] == pytest.approx(hours * len(row["devices"]), abs=1e-6)


def test_device_hours_by_team_match_within_tolerance(seeded: Engine) -> None:
    window = EXPECTED["device_hours"]
    body = cli(seeded, "usage", "--from", window["from"], "--to", window["to"], "--group-by", "team",
               "--output", "json")
    by_team: dict[str, float] = defaultdict(float)
    for row in body["rows"]:
        assert row["deviceClass"] == "gpu.example.com"  # one class in this history: one row per team
        by_team[row["team"]] += row["deviceHours"]
    assert set(by_team) == set(window["by_team"])
    for team, hours in window["by_team"].items():
        assert by_team[team] == pytest.approx(hours, abs=window["tolerance_hours"])


def test_at_least_the_expected_events_are_recorded(seeded: Engine) -> None:
    from sqlalchemy import text

    with seeded.connect() as conn:
        counts: dict[str, int] = dict(conn.execute(text("SELECT type, count(*) FROM events GROUP BY type")).all())
    for event_type, minimum in EXPECTED["events_expected_min"].items():
        assert counts.get(event_type, 0) >= minimum, event_type


def test_the_pair_claim_counts_two_devices_for_its_team(seeded: Engine) -> None:
    at = parse_time(CHECKS[0]["at"]) + timedelta(minutes=1)
    body = cli(seeded, "claims", "--state", "allocated", "--at", at.isoformat(), "--output", "json")
    pair = next(c for c in body["claims"] if c["name"].startswith("pair-0"))
    assert (pair["origin"], pair["team"], [d["device"] for d in pair["devices"]]) == (
        "template", "vision", ["gpu-2", "gpu-3"])
    ext = next(c for c in body["claims"] if c["name"].startswith("ext-0"))
    assert ext["origin"] == "extended" and isinstance(at, datetime)


def test_an_idle_claim_is_listed_once_idle_for_exactly_its_threshold(seeded: Engine) -> None:
    # shared-gpu: reservedFor emptied at 11:00:01 (the history's line for serve-b's deletion); threshold 30 min.
    def listed(at: str) -> set[str]:
        body = cli(seeded, "idle-claims", "--at", at, "--output", "json")
        return {f"{c['namespace']}/{c['name']}" for c in body["claims"]}

    assert "ml-serve/shared-gpu" not in listed("2026-11-02T11:30:00.999999Z")
    assert "ml-serve/shared-gpu" in listed("2026-11-02T11:30:01Z")
