"""``[teams] overrides`` reach every answer that names a team, on the API and the CLI alike.

The seed-lab history (tests/api/conftest.py) records two namespaces: ``ml-train`` labelled ``vision`` and
``ml-serve`` labelled ``nlp``. The configuration below moves ``ml-serve`` to team ``ops``; a token limited
to ``ops`` must then see exactly what ``nlp`` saw without the override, and a token limited to ``nlp``
nothing. Hours are the hand-worked ones of seed-lab.expected.json and tests/api/test_cli_bodies.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from typer.testing import CliRunner

from ledger import cli, services
from ledger.config import LedgerConfig, load_config
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle

ADMIN = "admin-token-0123456789abcdef"
OPS = "ops-token-0123456789abcdef"
NLP = "nlp-token-0123456789abcdef"
TOML = f"""
[teams]
overrides = {{ "ml-serve" = "ops" }}

[[api.tokens]]
name = "admin"
token = "{ADMIN}"

[[api.tokens]]
name = "ops"
token = "{OPS}"
teams = ["ops"]

[[api.tokens]]
name = "nlp"
token = "{NLP}"
teams = ["nlp"]
"""
WINDOW = {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z"}
# Seconds over WINDOW, from tests/api/test_cli_bodies.py HOURLY: ml-train (vision) 12176 + 10801 + 10800,
# ml-serve (nlp, here ops) 5400 + 7200 + 7200.
VISION_S, SERVE_S = 33777, 19800


@pytest.fixture()
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "ledger.toml"
    path.write_text(TOML)
    return path


@pytest.fixture()
def config(config_file: Path) -> LedgerConfig:
    return load_config(config_file)


@pytest.fixture()
def api(make_client: Callable[[LedgerConfig], TestClient[Litestar]], config: LedgerConfig) -> TestClient[Litestar]:
    return make_client(config)


def get(client: TestClient[Litestar], path: str, token: str, **params: Any) -> Any:
    response = client.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()


def run_cli(ledger: LedgerHandle, config_file: Path, *args: str) -> Any:
    url = ledger.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(cli.app, [*args, "--config", str(config_file), "--database-url", url],
                                env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def hours_by_team(body: Any) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for row in body["rows"]:
        out[row["team"]] += row["deviceHours"]
    return dict(out)


def test_the_idle_claims_endpoint_answers_the_cli_report_with_the_overridden_team(
        api: TestClient[Litestar], seeded: LedgerHandle, config_file: Path) -> None:
    at = "2026-11-02T12:00:00Z"
    body = get(api, "/v1/reports/idle-claims", ADMIN, at=at)
    report = run_cli(seeded, config_file, "report", "idle-claims", "--at", at, "-f", "json")
    plain = run_cli(seeded, config_file, "idle-claims", "--at", at, "-o", "json")

    assert body == report == plain
    teams = {f"{c['namespace']}/{c['name']}": c["team"] for c in body["claims"]}
    assert teams["ml-serve/shared-gpu"] == "ops"  # recorded as nlp; idle since 11:00 (expected.json)


def test_a_team_limited_token_sees_idle_claims_by_the_overridden_team(api: TestClient[Litestar]) -> None:
    at = "2026-11-02T12:00:00Z"
    everyone = get(api, "/v1/reports/idle-claims", ADMIN, at=at)["claims"]
    ops = get(api, "/v1/reports/idle-claims", OPS, at=at)["claims"]
    nlp = get(api, "/v1/reports/idle-claims", NLP, at=at)["claims"]

    assert ops == [c for c in everyone if c["namespace"] == "ml-serve"]
    assert "ml-serve/shared-gpu" in {f"{c['namespace']}/{c['name']}" for c in ops}
    assert nlp == []


def test_usage_by_team_bills_an_overridden_namespace_to_its_new_team_from_rollups_and_live_rows(
        api: TestClient[Litestar], seeded: LedgerHandle, config_file: Path) -> None:
    live = get(api, "/v1/usage", ADMIN, groupBy="team", **WINDOW)
    services.rollup_usage(seeded.db, end=parse_time(WINDOW["to"]))  # the three hours are now rolled up
    rolled = get(api, "/v1/usage", ADMIN, groupBy="team", **WINDOW)
    on_cli = run_cli(seeded, config_file, "usage", "--from", WINDOW["from"], "--to", WINDOW["to"], "-o", "json")

    expected = {"vision": VISION_S / 3600, "ops": SERVE_S / 3600}
    assert hours_by_team(live) == pytest.approx(expected, abs=1e-6)
    assert rolled == live
    assert on_cli == live
    # In the same order too, the body's keys and each row's: one reader diffing the two texts sees no change.
    assert [list(on_cli), *map(list, on_cli["rows"])] == [list(live), *map(list, live["rows"])]


def test_two_namespaces_overridden_to_one_team_are_summed_into_one_row(seeded: LedgerHandle) -> None:
    merged = LedgerConfig.model_validate({"teams": {"overrides": {"ml-serve": "vision"}}})
    services.rollup_usage(seeded.db, end=parse_time("2026-11-02T11:00:00Z"))  # 09-11 rolled, 11-12 live
    body: Any = services.usage(seeded.db, start=parse_time(WINDOW["from"]), end=parse_time(WINDOW["to"]),
                               group_by="team", config=merged)

    assert [r["team"] for r in body["rows"]] == ["vision"]  # one DeviceClass, one driver in seed-lab
    assert body["rows"][0]["deviceHours"] == pytest.approx((VISION_S + SERVE_S) / 3600, abs=1e-6)  # 14.8825


def test_stepped_usage_and_a_team_limited_token_use_the_overridden_team(api: TestClient[Litestar]) -> None:
    ops = get(api, "/v1/usage", OPS, groupBy="team", step="PT1H", **WINDOW)
    nlp = get(api, "/v1/usage", NLP, groupBy="team", **WINDOW)
    by_namespace = get(api, "/v1/usage", OPS, groupBy="namespace", **WINDOW)

    # ml-serve per hour (test_cli_bodies.HOURLY): 5400 s, 7200 s, 7200 s.
    assert {(r["start"], r["team"]): r["deviceHours"] for r in ops["rows"]} == pytest.approx({
        ("2026-11-02T09:00:00Z", "ops"): 1.5, ("2026-11-02T10:00:00Z", "ops"): 2.0,
        ("2026-11-02T11:00:00Z", "ops"): 2.0}, abs=1e-6)
    assert nlp["rows"] == []
    assert [(r["namespace"], r["deviceHours"]) for r in by_namespace["rows"]] == [("ml-serve", 5.5)]


def test_claims_name_filter_and_limit_by_the_overridden_team(api: TestClient[Litestar]) -> None:
    at = "2026-11-02T09:30:00Z"
    everyone = get(api, "/v1/claims", ADMIN, at=at)["claims"]
    serve = [c for c in everyone if c["namespace"] == "ml-serve"]

    assert serve and all(c["team"] == "ops" for c in serve)
    assert get(api, "/v1/claims", ADMIN, at=at, team="ops")["claims"] == serve
    assert get(api, "/v1/claims", ADMIN, at=at, team="nlp")["claims"] == []
    assert get(api, "/v1/claims", OPS, at=at)["claims"] == serve
    assert get(api, "/v1/claims", NLP, at=at)["claims"] == []


def test_occupancy_allocations_and_a_team_limited_token_use_the_overridden_team(
        api: TestClient[Litestar], seeded: LedgerHandle, config_file: Path) -> None:
    at = "2026-11-02T09:30:00Z"
    everyone = get(api, "/v1/occupancy", ADMIN, at=at)
    ops = get(api, "/v1/occupancy", OPS, at=at)
    nlp = get(api, "/v1/occupancy", NLP, at=at)
    on_cli = run_cli(seeded, config_file, "occupancy", "--at", at, "-o", "json")

    teams = {a["team"] for d in everyone["devices"] for a in d["allocations"]}
    assert teams == {"vision", "ops"}
    # expected.json at 09:30: nlp (ml-serve) holds gpu-1 and gpu-4.
    assert sorted(d["device"] for d in ops["devices"]) == ["gpu-1", "gpu-4"]
    assert ops["totals"]["devices"] == 2 and ops["totals"]["allocated"] == 2
    assert nlp["devices"] == [] and nlp["totals"]["devices"] == 0
    assert on_cli == everyone


def test_shared_and_pending_name_the_overridden_team(
        make_client: Callable[[LedgerConfig], TestClient[Litestar]], seeded: LedgerHandle) -> None:
    config = LedgerConfig.model_validate({"teams": {"overrides": {"ml-serve": "ops", "ml-train": "research"}}})
    api = make_client(config)
    at = "2026-11-02T09:30:00Z"
    shared = api.get("/v1/shared", params={"at": at}).json()
    pending = api.get("/v1/pending", params={"at": at}).json()

    # gpu-1's claim has two live consumers at 09:30 (serve-a, serve-b); ml-train/big waits for 4 GPUs.
    assert [(c["name"], c["team"]) for c in shared["claims"]] == [("shared-gpu", "ops")]
    assert [(c["namespace"], c["name"], c["team"]) for c in pending["claims"]] == [("ml-train", "big", "research")]
