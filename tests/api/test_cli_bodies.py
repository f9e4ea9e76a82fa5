"""The CLI's query commands answer as the REST API does, on the bundled seed-lab history.

``usage --step`` gives the hours of each bucket (worked out by hand below) and refuses a bad step with
the API's words; ``--output json`` of every query command is the API's JSON body for the same query,
through Litestar's test client, ``"nextPageToken": null`` included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient
from typer.testing import CliRunner

from ledger import cli
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

EXPECTED: dict[str, Any] = json.loads((HISTORIES / "seed-lab.expected.json").read_text())
WINDOW = EXPECTED["device_hours"]  # 2026-11-02 09:00 .. 12:00, device-hours per team
WIDE = {"COLUMNS": "250"}  # one table row, or one error message, per line


def run_cli(ledger: LedgerHandle, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, [*args, "--database-url", ledger.db.url], env=WIDE)
    return result.exit_code, result.output


# Hours per bucket, from the allocations of seed-lab.jsonl (start: allocationTimestamp; end: the line
# that shows the allocation gone). vision (namespace ml-train): train-0 holds gpu-0 09:02:04-10:00:01,
# pick-seven gpu-7 from 09:05:00, pair-0 gpu-2 and gpu-3 from 09:15:00. nlp (ml-serve): shared-gpu
# holds gpu-1 from 09:10:00 (one allocation, however many pods use it), ext-0 gpu-4 from 09:20:00.
#   09-10 vision 3476 + 3300 + 2 x 2700 = 12176 s; nlp 3000 + 2400 = 5400 s
#   10-11 vision 1 + 3600 + 2 x 3600 = 10801 s;   nlp 2 x 3600 = 7200 s
#   11-12 vision 3 x 3600 = 10800 s;              nlp 7200 s
HOURLY = {
    ("2026-11-02T09:00:00Z", "vision"): 12176 / 3600,
    ("2026-11-02T09:00:00Z", "nlp"): 5400 / 3600,
    ("2026-11-02T10:00:00Z", "vision"): 10801 / 3600,
    ("2026-11-02T10:00:00Z", "nlp"): 7200 / 3600,
    ("2026-11-02T11:00:00Z", "vision"): 10800 / 3600,
    ("2026-11-02T11:00:00Z", "nlp"): 7200 / 3600,
}


def test_hourly_steps_on_the_cli_give_each_hour_its_hand_worked_device_hours(seeded: LedgerHandle) -> None:
    code, output = run_cli(seeded, "usage", "--from", WINDOW["from"], "--to", WINDOW["to"], "--step", "PT1H",
                           "--output", "json")

    assert code == 0, output
    body = json.loads(output)
    assert body["step"] == 3600
    got = {(r["start"], r["team"]): r["deviceHours"] for r in body["rows"]}
    assert got == pytest.approx(HOURLY, abs=1e-6)  # the body rounds hours to 6 decimals
    ends = {"2026-11-02T09:00:00Z": "2026-11-02T10:00:00Z", "2026-11-02T10:00:00Z": "2026-11-02T11:00:00Z",
            "2026-11-02T11:00:00Z": "2026-11-02T12:00:00Z"}
    assert {(r["start"], r["end"]) for r in body["rows"]} == set(ends.items())
    for team, hours in WINDOW["by_team"].items():  # the buckets add up to the expected window totals
        assert sum(h for (_, t), h in got.items() if t == team) == pytest.approx(hours, abs=WINDOW["tolerance_hours"])


def test_a_stepped_usage_table_gives_each_row_its_bucket(seeded: LedgerHandle) -> None:
    # 90-minute buckets, the same allocations as HOURLY:
    #   vision 09:00-10:30: gpu-0 3477 s, gpu-7 5100 s, gpu-2/3 2 x 4500 s = 17577 s = 4.8825 h
    #   vision 10:30-12:00: 3 devices x 5400 s = 16200 s = 4.500 h
    #   nlp    09:00-10:30: gpu-1 4800 s + gpu-4 4200 s = 9000 s = 2.500 h; 10:30-12:00: 2 x 5400 s = 3.000 h
    code, output = run_cli(seeded, "usage", "--from", WINDOW["from"], "--to", WINDOW["to"], "--step", "5400")

    assert code == 0, output
    assert "in steps of PT1H30M" in output
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]
    assert cells == [
        ["2026-11-02T09:00:00Z", "2026-11-02T10:30:00Z", "nlp", "gpu.example.com", "gpu.example.com", "2.500"],
        ["2026-11-02T09:00:00Z", "2026-11-02T10:30:00Z", "vision", "gpu.example.com", "gpu.example.com", "4.883"],
        ["2026-11-02T10:30:00Z", "2026-11-02T12:00:00Z", "nlp", "gpu.example.com", "gpu.example.com", "3.000"],
        ["2026-11-02T10:30:00Z", "2026-11-02T12:00:00Z", "vision", "gpu.example.com", "gpu.example.com", "4.500"],
    ]


@pytest.mark.parametrize("step", ["soon", "PT30M30M", "P1M", "-5", "0", "1"])
def test_a_bad_step_is_refused_with_the_words_the_api_uses(seeded: LedgerHandle, client: TestClient[Litestar],
                                                          step: str) -> None:
    window = {"from": WINDOW["from"], "to": WINDOW["to"]}
    problem = client.get("/v1/usage", params={**window, "step": step})
    assert problem.status_code == 422
    detail = problem.json()["detail"].removeprefix("step: ")  # the API names its parameter, the CLI its option

    code, output = run_cli(seeded, "usage", "--from", WINDOW["from"], "--to", WINDOW["to"], "--step", step)

    assert code == 2
    assert detail in output


LAB = {"from": WINDOW["from"], "to": WINDOW["to"]}
SAME_QUERIES = [
    # CLI arguments, API path, API query: one question asked both ways.
    pytest.param(["occupancy", "--at", "2026-11-02T09:30:00Z"], "/v1/occupancy", {"at": "2026-11-02T09:30:00Z"},
                 id="occupancy"),
    pytest.param(["occupancy", "--at", "2026-11-02T12:00:00Z", "--node", "lab-node"], "/v1/occupancy",
                 {"at": "2026-11-02T12:00:00Z", "node": "lab-node"}, id="occupancy of a node"),
    pytest.param(["occupancy", "--at", "2026-11-02T09:30:00Z", "--device-class", "gpu.example.com"], "/v1/occupancy",
                 {"at": "2026-11-02T09:30:00Z", "deviceClass": "gpu.example.com"}, id="occupancy of a DeviceClass"),
    pytest.param(["usage", "--from", LAB["from"], "--to", LAB["to"]], "/v1/usage", LAB, id="usage"),
    pytest.param(["usage", "--from", LAB["from"], "--to", LAB["to"], "--group-by", "node"], "/v1/usage",
                 {**LAB, "groupBy": "node"}, id="usage by node"),
    pytest.param(["usage", "--from", LAB["from"], "--to", LAB["to"], "--group-by", "cluster"], "/v1/usage",
                 {**LAB, "groupBy": "cluster"}, id="usage by cluster"),
    pytest.param(["usage", "--from", LAB["from"], "--to", LAB["to"], "--step", "PT1H"], "/v1/usage",
                 {**LAB, "step": "PT1H"}, id="usage hourly"),
    pytest.param(["claims", "--state", "pending", "--at", "2026-11-02T09:30:00Z"], "/v1/claims",
                 {"state": "pending", "at": "2026-11-02T09:30:00Z"}, id="pending claims"),
    pytest.param(["claims", "--at", "2026-11-02T12:00:00Z"], "/v1/claims", {"at": "2026-11-02T12:00:00Z"},
                 id="claims"),
    pytest.param(["idle-claims", "--at", "2026-11-02T12:00:00Z"], "/v1/reports/idle-claims",
                 {"at": "2026-11-02T12:00:00Z"}, id="idle-claims"),
    pytest.param(["report", "idle-claims", "--at", "2026-11-02T12:00:00Z", "--format", "json"],
                 "/v1/reports/idle-claims", {"at": "2026-11-02T12:00:00Z"}, id="report idle-claims"),
    pytest.param(["quotas", "--at", "2026-11-02T09:30:00Z"], "/v1/quotas", {"at": "2026-11-02T09:30:00Z"},
                 id="quotas"),
    pytest.param(["pending", "--at", "2026-11-02T09:30:00Z"], "/v1/pending", {"at": "2026-11-02T09:30:00Z"},
                 id="pending"),
    pytest.param(["shared", "--at", "2026-11-02T09:30:00Z"], "/v1/shared", {"at": "2026-11-02T09:30:00Z"},
                 id="shared"),
]


@pytest.mark.parametrize(("args", "path", "query"), SAME_QUERIES)
def test_cli_json_is_the_api_body_for_the_same_query(seeded: LedgerHandle, client: TestClient[Litestar],
                                                     args: list[str], path: str, query: dict[str, str]) -> None:
    # Every answer here fits in one API page, so the API too says "nextPageToken": null.
    response = client.get(path, params=query)
    assert response.status_code == 200, response.text
    output_option = [] if "--format" in args else ["--output", "json"]

    code, output = run_cli(seeded, *args, *output_option)

    assert code == 0, output
    # Compared as JSON text, not as Python values (where 1 == 1.0): a count the API writes 1.0 is 1.0 here too.
    assert json.dumps(json.loads(output), sort_keys=True) == json.dumps(response.json(), sort_keys=True)


def test_the_quota_intervals_on_the_cli_write_used_as_the_api_writes_it(seeded: LedgerHandle,
                                                                          client: TestClient[Litestar]) -> None:
    # vision's GPUs (DeviceClass gpu.example.com, unmapped, so counted under its own name), from the
    # allocations listed above HOURLY: train-0 gpu-0 09:02:04-10:00:01, pick-seven gpu-7 from 09:05:00,
    # pair-0 gpu-2 and gpu-3 from 09:15:00.
    code, output = run_cli(seeded, "quotas", "--from", LAB["from"], "--to", LAB["to"], "--output", "json")

    assert code == 0, output
    vision = [(i["from"], i["to"], i["used"]) for i in json.loads(output)["intervals"]
              if i["team"] == "vision" and i["resourceName"] == "gpu.example.com"]
    assert vision == [("2026-11-02T09:02:04Z", "2026-11-02T09:05:00Z", 1), ("2026-11-02T09:05:00Z",
                       "2026-11-02T09:15:00Z", 2), ("2026-11-02T09:15:00Z", "2026-11-02T10:00:01Z", 4),
                      ("2026-11-02T10:00:01Z", "2026-11-02T12:00:00Z", 3)]
    assert [type(used) for _, _, used in vision] == [float] * 4  # 4.0, as /v1/quotas writes it:
    at_930 = client.get("/v1/quotas", params={"at": "2026-11-02T09:30:00Z"}).json()
    assert [r["used"] for r in at_930["rows"] if r["team"] == "vision"] == [4.0]
    assert type(at_930["rows"][0]["used"]) is float


def test_a_table_written_to_a_pipe_keeps_each_device_on_one_line_unless_columns_is_set(seeded: LedgerHandle) -> None:
    check = EXPECTED["checks"][0]  # 09:30: which claim holds each allocated device
    args = ["occupancy", "--at", check["at"], "--database-url", seeded.db.url]

    piped = CliRunner().invoke(cli.app, args, env={"COLUMNS": None})  # CliRunner's stdout is no terminal
    narrow = CliRunner().invoke(cli.app, args, env={"COLUMNS": "60"})

    assert piped.exit_code == 0, piped.output
    lines = piped.output.splitlines()
    for device, claim in check["allocated"].items():
        assert [line for line in lines if f"/{device} " in line and claim in line], (device, claim, piped.output)
    assert narrow.exit_code == 0, narrow.output
    longest = max(check["allocated"].values(), key=len)
    assert not [line for line in narrow.output.splitlines() if longest in line]  # folded to 60 columns
    assert max(len(line) for line in narrow.output.splitlines()) <= 60


@pytest.mark.parametrize("columns", ["0", "5", "", "abc", "12"])
def test_a_columns_value_no_table_fits_in_is_ignored_not_an_empty_report(seeded: LedgerHandle, columns: str) -> None:
    import os
    import subprocess

    from tests.factories import CLI

    check = EXPECTED["checks"][0]
    # A process of its own: Rich reads COLUMNS when the CLI's consoles are made, at import.
    result = subprocess.run([*CLI, "occupancy", "--at", check["at"], "--database-url", seeded.db.url],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": columns})

    assert result.returncode == 0, result.stderr
    # COLUMNS=0 printed nothing at all (and exit code 0); 5 gave a table of empty cells.
    totals = f"devices {check['devices_total']}, allocated {check['devices_allocated']}, free {check['devices_free']}"
    assert totals in result.stdout
    lines = result.stdout.splitlines()
    for device, claim in check["allocated"].items():
        assert [line for line in lines if f"/{device} " in line and claim in line], (device, result.stdout)


def test_hours_of_no_model_are_a_null_model_row_in_the_api_body_as_in_the_cli_json(
        seeded: LedgerHandle, client: TestClient[Litestar], tmp_path: Path) -> None:
    # A claim holding a device no ResourceSlice published: its hours have no model. The API left the "model" key out
    # of that row (null counted as "not the grouping"), where the CLI wrote "model": null.
    line = json.loads((HISTORIES / "seed-lab.jsonl").read_text().splitlines()[7])  # train-0's claim, allocated
    claim = line["object"]
    claim["metadata"].update(uid="5d1c7c3e-0000-4000-8000-000000000001", name="ghost", ownerReferences=[])
    claim["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-99"
    ghost = tmp_path / "ghost.jsonl"
    ghost.write_text(json.dumps({**line, "type": "ADDED"}) + "\n")
    assert seeded.replay(ghost).rejected == []

    response = client.get("/v1/usage", params={**LAB, "groupBy": "model"})
    code, output = run_cli(seeded, "usage", "--from", LAB["from"], "--to", LAB["to"], "--group-by", "model",
                           "--output", "json")

    assert response.status_code == 200 and code == 0, (response.text, output)
    rows = response.json()["rows"]
    assert [(r["model"], r["deviceClass"]) for r in rows] == [(None, "gpu.example.com"),
                                                              ("LATEST-GPU-MODEL", "gpu.example.com")]
    assert json.dumps(json.loads(output), sort_keys=True) == json.dumps(response.json(), sort_keys=True)
