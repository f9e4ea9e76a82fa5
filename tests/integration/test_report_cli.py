"""``dra-ledger quotas | shared | pending | report idle-claims`` print the service bodies (and CSV)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import typer
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from ledger.cli import app
from tests.paths import HISTORIES
from workers.jobs_cli import register

CONFIG = """
[[deviceClassMappings]]
name = "example.com/gpu"
deviceClassNames = ["gpu.example.com"]

[[quotas]]
team = "vision"
resourceName = "example.com/gpu"
nominalQuota = 3

[idle]
unreservedSeconds = 7200
"""


def run(engine: Engine, *args: str, code: int = 0) -> str:
    url = engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(app, [*args, "--database-url", url])
    assert result.exit_code == code, result.output
    return result.stdout if code == 0 else result.output


@pytest.fixture()
def seeded(ledger_engine: Engine, tmp_path: Path) -> tuple[Engine, Path]:
    run(ledger_engine, "replay", str(HISTORIES / "seed-lab.jsonl"), "--cluster", "seed-lab")
    path = tmp_path / "ledger.toml"
    path.write_text(CONFIG)
    return ledger_engine, path


def test_quotas_prints_the_api_body_and_the_over_quota_interval(seeded: tuple[Engine, Path]) -> None:
    engine, config = seeded
    body: Any = json.loads(run(engine, "quotas", "--at", "2026-11-02T09:30:00Z", "--config", str(config),
                               "--output", "json"))
    rows = {r["team"]: r for r in body["rows"]}
    assert (rows["vision"]["used"], rows["vision"]["nominalQuota"], rows["vision"]["overQuota"]) == (4, 3, True)
    assert set(rows["vision"]) == {"cluster", "team", "resourceName", "used", "nominalQuota", "overQuota", "reasons",
                                   "claims"}
    assert rows["vision"]["cluster"] == "seed-lab"
    over: Any = json.loads(run(engine, "quotas", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z",
                               "--config", str(config), "--output", "json"))
    assert [(i["from"], i["to"]) for i in over["intervals"] if i["overQuota"]] == \
        [("2026-11-02T09:15:00Z", "2026-11-02T10:00:01Z")]
    table = run(engine, "quotas", "--at", "2026-11-02T09:30:00Z", "--config", str(config))
    assert "OVER" in table and "over quota" in table  # the column of OVER marks is named
    history = run(engine, "quotas", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z", "--config",
                  str(config))
    assert "OVER" in history and "over quota" in history


def test_a_bad_configuration_file_is_refused_with_its_location(seeded: tuple[Engine, Path]) -> None:
    engine, config = seeded
    config.write_text('[[quotas]]\nteam = "vision"\nresourceName = "x"\nnominalQuota = -1\n')
    output = run(engine, "quotas", "--config", str(config), code=2)
    assert "quotas.0.nominalQuota" in output


def test_shared_and_pending_print_their_bodies(seeded: tuple[Engine, Path]) -> None:
    engine, _ = seeded
    shared: Any = json.loads(run(engine, "shared", "--at", "2026-11-02T09:30:00Z", "--output", "json"))
    assert [c["name"] for c in shared["claims"]] == ["shared-gpu"]
    window: Any = json.loads(run(engine, "shared", "--from", "2026-11-02T09:00:00Z", "--to",
                                 "2026-11-02T12:00:00Z", "--output", "json"))
    assert window["rows"] == []  # the seed lab shares a claim between pods, never a device between claims
    pending: Any = json.loads(run(engine, "pending", "--at", "2026-11-02T09:30:00Z", "--output", "json"))
    assert pending["classes"] == [{"cluster": "seed-lab", "deviceClass": "gpu.example.com", "claims": 1,
                                   "requested": 4, "free": 2}]
    assert "requested" in run(engine, "pending", "--at", "2026-11-02T09:30:00Z")


def test_the_idle_claim_report_uses_the_configured_thresholds_in_every_format(seeded: tuple[Engine, Path]) -> None:
    engine, config = seeded
    # shared-gpu is unreserved since 11:00:01; at 12:00 that is under the configured 2 hours.
    quiet: Any = json.loads(run(engine, "report", "idle-claims", "--at", "2026-11-02T12:00:00Z", "--config",
                                str(config), "--format", "json"))
    assert quiet["claims"] == []
    text = run(engine, "report", "idle-claims", "--at", "2026-11-02T12:00:00Z", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["namespace"], r["name"], r["team"], r["category"], r["devices"]) for r in rows] == \
        [("ml-serve", "shared-gpu", "nlp", "unreserved", "gpu.example.com/lab-node/gpu-1")]
    assert float(rows[0]["wastedDeviceHours"]) == pytest.approx(1.0, abs=0.001)
    assert "unreserved" in run(engine, "report", "idle-claims", "--at", "2026-11-02T12:00:00Z")  # table (folded)


def test_jobs_once_rolls_up_and_snapshots(seeded: tuple[Engine, Path]) -> None:
    engine, config = seeded
    jobs_app = typer.Typer()

    @jobs_app.callback()
    def main() -> None:
        """A group, so that ``jobs`` stays a subcommand."""

    register(jobs_app)
    url = engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(jobs_app, ["jobs", "--once", "--config", str(config), "--database-url", url,
                                           "--rollup-from", "2026-11-02T09:00:00Z"])
    assert result.exit_code == 0, result.output
    assert "quota rows" in result.output
    with engine.connect() as conn:
        hours = conn.execute(text("SELECT count(DISTINCT hour) FROM usage_rollups")).scalar_one()
        assert hours >= 3
        assert conn.execute(text("SELECT count(*) FROM quota_usage_snapshots")).scalar_one() >= 1
    bad = CliRunner().invoke(jobs_app, ["jobs", "--once", "--database-url", url, "--rollup-from", "yesterday"])
    assert bad.exit_code == 2
    # Year 9999 is refused as every query time is (the latest accepted is 9998-12-31T23:59:59.999999Z), not rolled
    # up as zero hours.
    late = CliRunner().invoke(jobs_app, ["jobs", "--once", "--database-url", url,
                                         "--rollup-from", "9999-01-01T00:00:00Z"])
    assert late.exit_code == 2
    assert "--rollup-from" in late.output and "9998-12-31T23:59:59.999999Z" in late.output
