"""``dra-ledger simulate`` refuses absurd knobs before any work and never leaves a partial history."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger import simulate as simulation
from ledger.cli import app
from ledger.recorded import parse_query_time
from ledger.simulate import FleetSpec, write_history

WIDE = {"COLUMNS": "300"}


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--gpus-per-node", "99999999", "less than or equal to 128"),
    ("--nodes", "100001", "less than or equal to 100000"),
    ("--hours", "9000", "less than or equal to 8784"),
    ("--teams", "5000", "less than or equal to 1000"),
    ("--job-minutes", "1e9", "less than or equal to 43200"),
    ("--utilisation", "-0.5", "greater than or equal to 0"),
    ("--mig-node-fraction", "1.5", "less than or equal to 1"),
    # NaN passes no bound check at all (every comparison with it is false): it is named for what it is.
    ("--hours", "nan", "a finite number"),
    ("--utilisation", "nan", "a finite number"),
    ("--job-minutes", "NaN", "a finite number"),
    ("--mig-node-fraction", "nan", "a finite number"),
    ("--hours", "inf", "a finite number"),
])
def test_a_knob_past_its_bound_is_refused_and_the_old_file_is_kept(tmp_path: Path, option: str, value: str,
                                                                   said: str) -> None:
    out = tmp_path / "sim.jsonl"
    out.write_text("an earlier history\n", encoding="utf-8")

    small = {"--nodes": "1", "--hours": "1", option: value}  # the option tried replaces its small default
    result = CliRunner().invoke(app, ["simulate", "--output", str(out), *[w for o, v in small.items() for w in (o, v)]],
                                env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': Input should be {said}" in result.output
    assert out.read_text(encoding="utf-8") == "an earlier history\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl"]


def test_the_simulators_own_check_names_the_knob_and_makes_no_file(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"

    with pytest.raises(ValueError, match="gpus_per_node is 129; at most 128 is simulated"):
        write_history(FleetSpec(nodes=1, gpus_per_node=129, hours=1, mig_node_fraction=0), out)

    assert list(tmp_path.iterdir()) == []


def test_more_than_12_gpus_a_node_needs_nodes_without_mig_partitions(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"
    args = ["simulate", "--output", str(out), "--nodes", "1", "--hours", "0.5", "--gpus-per-node", "13"]

    refused = CliRunner().invoke(app, args, env=WIDE)
    taken = CliRunner().invoke(app, [*args, "--mig-node-fraction", "0"], env=WIDE)

    assert refused.exit_code == 2, refused.output
    assert ("error: gpus_per_node (--gpus-per-node) is 13; at most 12 is simulated while nodes have MIG "
            "partitions") in refused.output
    assert "a mig_node_fraction (--mig-node-fraction) of 0 allows 128" in refused.output
    assert taken.exit_code == 0, taken.output
    assert '"devices": 14' in taken.output  # 13 GPUs and the node's NIC


def test_a_failure_half_way_keeps_the_earlier_file_and_removes_the_partial_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "sim.jsonl"
    out.write_text("an earlier history\n", encoding="utf-8")
    seen: list[int] = []

    def interrupted(n: int) -> None:
        seen.append(n)
        raise KeyboardInterrupt  # Ctrl-C after the first progress report

    monkeypatch.setattr(simulation, "PROGRESS_LINES", 50)
    with pytest.raises(KeyboardInterrupt):
        write_history(FleetSpec(nodes=4, hours=2), out, progress=interrupted)

    assert seen == [50]
    assert out.read_text(encoding="utf-8") == "an earlier history\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl"]


def test_a_complete_run_replaces_the_file_with_the_history_and_reports_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "sim.jsonl"
    out.write_text("an earlier history\n", encoding="utf-8")
    seen: list[int] = []
    monkeypatch.setattr(simulation, "PROGRESS_LINES", 50)
    umask = os.umask(0o022)
    try:
        summary = write_history(FleetSpec(nodes=4, hours=2), out, progress=seen.append)
    finally:
        os.umask(umask)

    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == summary.lines > 100 and lines[0].startswith("{")
    assert seen == list(range(50, summary.lines + 1, 50))
    assert out.stat().st_mode & 0o777 == 0o644  # as open() makes it under umask 022, not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl"]


def test_ctrl_c_exits_130_and_says_the_earlier_file_is_left_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "sim.jsonl"
    out.write_text("an earlier history\n", encoding="utf-8")

    def interrupted(spec: FleetSpec, summary: simulation.SimulationSummary | None = None) -> Iterator[str]:
        yield from ['{"observedAt": "2026-11-01T00:00:00Z"}'] * 10
        raise KeyboardInterrupt

    monkeypatch.setattr(simulation, "simulate", interrupted)
    result = CliRunner().invoke(app, ["simulate", "--output", str(out), "--nodes", "1", "--hours", "1"], env=WIDE)

    assert result.exit_code == 130, result.output
    assert f"interrupted: {out} left as it was" in result.output
    assert out.read_text(encoding="utf-8") == "an earlier history\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl"]


def test_sigterm_mid_write_exits_143_removes_the_partial_file_and_keeps_the_earlier_one(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"
    out.write_text("an earlier history\n", encoding="utf-8")
    # 1,000 nodes x 24 h is ~600,000 lines: after its first progress report (100,000) it is still writing.
    command = [sys.executable, "-c", "from ledger.cli import main; main()", "simulate", "--output", str(out),
               "--nodes", "1000", "--hours", "24"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        said = []
        for line in proc.stderr:  # line-buffered: each report arrives as it is printed
            said.append(line)
            if line.startswith("... 100,000 lines"):
                break
        assert said[-1].startswith("... 100,000 lines"), said
        partial = [p.name for p in tmp_path.iterdir() if p.name != "sim.jsonl"]
        assert len(partial) == 1 and partial[0].startswith(".sim.jsonl.") and partial[0].endswith(".tmp")
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert code == 143, rest
    assert f"terminated (SIGTERM): {out} left as it was" in rest
    assert out.read_text(encoding="utf-8") == "an earlier history\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl"]


@pytest.mark.parametrize(("start", "hours", "fix"), [
    # 9998-12-31T23:59:59.999999Z less the 13 s tail less the start: 23:59:46.999999 = 23.996... h, so 23.99 h.
    ("9998-12-31T00:00:00Z", "8783", "at most 23.99 hours from that start"),
    ("9998-12-31T00:00:00Z", "24", "at most 23.99 hours from that start"),
    # 0.999999 s before the latest time: less than the 13 s tail, so no --hours fits.
    ("9998-12-31T23:59:59Z", "8784", "give an earlier start"),
    ("9998-12-31T23:59:59Z", "0.01", "give an earlier start"),
])
def test_a_history_that_would_end_after_the_latest_time_the_ledger_accepts_is_refused_and_the_old_file_is_kept(
        tmp_path: Path, start: str, hours: str, fix: str) -> None:
    out = tmp_path / "sim.jsonl"
    out.write_text("an earlier history\n", encoding="utf-8")

    result = CliRunner().invoke(app, ["simulate", "--output", str(out), "--start", start, "--hours", hours,
                                      "--nodes", "1", "--gpus-per-node", "1"], env=WIDE)

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert (f"error: hours (--hours) {hours} from start (--start) {start}: the history would end after "
            "9998-12-31T23:59:59.999999Z, the latest time the ledger accepts (its last lines come up to 13 s after "
            f"the end); {fix}") in result.output
    assert "simulating" not in result.output  # refused before any work is announced
    assert out.read_text(encoding="utf-8") == "an earlier history\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim.jsonl"]


def test_the_longest_history_from_a_start_near_the_latest_time_dates_no_line_after_it(tmp_path: Path) -> None:
    out = tmp_path / "sim.jsonl"
    # 23.99 h from 9998-12-31T00:00:00Z ends at 23:59:24; with short, dense jobs lines come up to 13 s after it.
    result = CliRunner().invoke(app, ["simulate", "--output", str(out), "--start", "9998-12-31T00:00:00Z",
                                      "--hours", "23.99", "--nodes", "2", "--gpus-per-node", "2",
                                      "--utilisation", "1", "--job-minutes", "1"], env=WIDE)

    assert result.exit_code == 0, result.output
    times = [parse_query_time(json.loads(line)["observedAt"]) for line in out.read_text().splitlines()]
    assert max(times) <= datetime(9998, 12, 31, 23, 59, 24, tzinfo=UTC) + timedelta(seconds=13)


def test_a_workload_outliving_a_run_near_the_latest_time_stays_allocated_without_overflowing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A hold of 400 days from 9998-12-31 would pass datetime.max (9999-12-31): the job simply outlives the run.
    monkeypatch.setattr(simulation._Simulation, "hold_time", lambda self: timedelta(days=400))
    spec = FleetSpec(nodes=2, gpus_per_node=2, hours=2, utilisation=1, start=datetime(9998, 12, 31, tzinfo=UTC))

    lines = [json.loads(line) for line in simulation.simulate(spec)]

    assert max(line["observedAt"] for line in lines) <= "9998-12-31T02:00:13.000000Z"
    claims = [line["object"] for line in lines if line["object"]["kind"] == "ResourceClaim"]
    assert any("allocation" in claim["status"] for claim in claims)
    # Only over-requests that never got a device are given up on; no allocated claim is released.
    assert all(claim["metadata"]["name"].startswith("big-") for line, claim in zip(
        [x for x in lines if x["object"]["kind"] == "ResourceClaim"], claims, strict=True) if line["type"] == "DELETED")


@pytest.mark.parametrize(("start", "written"), [(datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000000Z"),
                                               (datetime(999, 6, 1, tzinfo=UTC), "0999-06-01T00:00:00.000000Z")])
def test_a_history_of_the_first_millennium_writes_four_digit_years_that_replay_reads(
        tmp_path: Path, start: datetime, written: str) -> None:
    from ledger.recorded import BrokenLine, read_history

    path = tmp_path / "early.jsonl"
    summary = write_history(FleetSpec(nodes=1, gpus_per_node=1, hours=1, seed=3, start=start), path)

    read = list(read_history(path))
    assert [r for r in read if isinstance(r, BrokenLine)] == []  # glibc's %Y wrote "1-01-01T...": every line broken
    assert len(read) == summary.lines
    assert json.loads(path.read_text().splitlines()[0])["observedAt"] == written


def test_the_start_options_bound_is_read_whole_in_an_80_column_help() -> None:
    # The bound was the instant 9998-12-31T23:59:59.999999Z, one word too wide for the help's column: Rich cut it
    # to "9998-12-31T23:59:59.9…".
    result = CliRunner().invoke(app, ["simulate", "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert "…" not in result.output
    words = " ".join(result.output.replace("│", " ").split())
    assert "the history must end, 13 s past --hours at most, by the end of year 9998 (UTC)." in words
