"""The CLI end to end on a real database: the demo, bad parameters, and the schema check."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from typer.testing import CliRunner

from ledger import cli
from ledger.cli import app
from ledger.recorded import BrokenLine, WatchLine, read_history
from ledger.testing.pg import create_database, drop_database, temporary_data_dir
from tests.factories import CLI, run_while_locked, taken_port
from tests.paths import HISTORIES

SEED = HISTORIES / "seed-lab.jsonl"


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def test_the_demo_replays_the_bundled_history_and_prints_its_tables(ledger_engine: Engine) -> None:
    result = CliRunner().invoke(app, ["demo", "--database-url", _url(ledger_engine)])
    assert result.exit_code == 0, result.output
    # 09:30: six GPUs held (gpu-1 by two pods), two free; 12:00: five held; big is pending with 4.
    assert "devices 8, allocated 6, free 2, shared 1" in result.output
    assert "devices 8, allocated 5, free 3, shared 0" in result.output
    assert "ml-train/big" in result.output
    assert "gpu.example.com: 4 (2 free)" in result.output  # pending demand: requested 4, 2 free at 09:30
    # The heading names the history's span whole (a rule 80 columns wide cut its end off in a file or a pipe).
    import json

    from tests.paths import HISTORIES

    stamps = [json.loads(line)["observedAt"] for line in (HISTORIES / "seed-lab.jsonl").read_text().splitlines()]
    span = f"{stamps[0].replace('.000000Z', 'Z')} .. {stamps[-1].replace('.000000Z', 'Z')}"
    assert f"── seed-lab: one node, 8 GPUs, history {span} ──" in result.output
    # The hints point at this ledger (a bare command would open the default embedded one), never print the URL.
    assert "--output json --database-url ...  (the same URL)" in result.output
    assert "it is in the database --database-url names" in result.output
    assert _url(ledger_engine) not in result.output
    # Again, the ledger named by the environment this time: nothing new, and the hint says where it is.
    again = CliRunner().invoke(app, ["demo"], env={"LEDGER_DATABASE_URL": _url(ledger_engine)})
    assert "39 lines: 0 recorded, 39 already recorded" in again.output
    assert "it is in the database LEDGER_DATABASE_URL names" in again.output
    assert "--group-by team\n" in again.output and "(the same URL)" not in again.output
    assert "besides the bundled history" not in again.output


def test_the_demo_warns_when_its_cluster_holds_lines_besides_the_bundled_history(ledger_engine: Engine,
                                                                                 tmp_path: Path) -> None:
    # A ledger kept from an earlier run, with one more line replayed under the demo's cluster: the demo's answers
    # then include it (an 8th GPU held at 09:30), and it says so instead of printing them as the seed lab's.
    from tests.paths import HISTORIES

    first = (HISTORIES / "seed-lab.jsonl").read_text().splitlines()[0]
    extra = json.loads(first)
    extra["object"]["metadata"] = {**extra["object"]["metadata"], "name": "late-ns", "uid": "late-ns-uid"}
    late = tmp_path / "late.jsonl"
    late.write_text(json.dumps(extra) + "\n")
    added = CliRunner().invoke(app, ["replay", str(late), "--cluster", "seed-lab", "--database-url",
                                     _url(ledger_engine)])
    assert added.exit_code == 0, added.output
    result = CliRunner().invoke(app, ["demo", "--database-url", _url(ledger_engine)])
    assert result.exit_code == 0, result.output
    assert ("warning: cluster 'seed-lab' of this ledger holds 1 observation(s) besides the bundled history"
            in " ".join(result.output.split()))


def test_bad_parameters_are_reported_not_crashed(ledger_engine: Engine) -> None:
    url = _url(ledger_engine)
    bad_time = CliRunner().invoke(app, ["occupancy", "--at", "yesterday", "--database-url", url])
    assert bad_time.exit_code == 2 and "not an RFC 3339 time" in bad_time.output
    no_zone = CliRunner().invoke(app, ["occupancy", "--at", "2026-11-02T09:30:00", "--database-url", url])
    assert no_zone.exit_code == 2
    reversed_window = CliRunner().invoke(app, ["usage", "--from", "2026-11-02T12:00:00Z", "--to",
                                               "2026-11-02T09:00:00Z", "--database-url", url])
    assert reversed_window.exit_code == 2 and "--from must be before --to" in reversed_window.output
    bad_idle = CliRunner().invoke(app, ["idle-claims", "--min-idle", "soon", "--database-url", url])
    assert bad_idle.exit_code == 2 and "ISO 8601" in bad_idle.output
    huge_idle = CliRunner().invoke(app, ["idle-claims", "--min-idle", "P99999999999D", "--database-url", url])
    assert huge_idle.exit_code == 2 and "out of range" in huge_idle.output and "P36500D" in huge_idle.output


def test_a_database_without_the_schema_is_refused_with_the_command_to_run(ledger_server: str) -> None:
    name = "ledger_empty_schema_check"
    drop_database(ledger_server, name)
    url = create_database(ledger_server, name)
    try:
        result = CliRunner().invoke(app, ["occupancy", "--database-url", url])
        assert result.exit_code == 2
        assert "run `dra-ledger db upgrade`" in result.output
        upgraded = CliRunner().invoke(app, ["db", "upgrade", "--database-url", url])
        assert upgraded.exit_code == 0, upgraded.output
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == 0
        engine.dispose()
        assert CliRunner().invoke(app, ["occupancy", "--database-url", url]).exit_code == 0
    finally:
        drop_database(ledger_server, name)


def test_database_urls_that_are_not_postgresql_are_refused_clearly() -> None:
    for url, expected in (("not a url", "must be postgresql://"), ("mysql://root@localhost/x", "needs PostgreSQL"),
                          ("sqlite:///tmp/x.db", "needs PostgreSQL")):
        result = CliRunner().invoke(app, ["occupancy", "--database-url", url])
        assert result.exit_code == 2 and expected in result.output, result.output


def test_db_stop_refuses_when_a_database_url_is_set() -> None:
    result = CliRunner().invoke(app, ["db", "stop", "--database-url", "postgresql://x@127.0.0.1/y"])
    assert result.exit_code == 2 and "embedded server is not in use" in result.output


def test_db_start_and_the_demo_give_the_embedded_ledgers_url_in_the_form_psql_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEDGER_DATABASE_URL", raising=False)
    with temporary_data_dir() as data_dir:
        try:
            started = CliRunner().invoke(app, ["db", "start", "--data-dir", str(data_dir)])
            assert started.exit_code == 0, started.output
            # Stdout stays the one URL the ledger's commands take (export LEDGER_DATABASE_URL=$(dra-ledger db start)).
            [sqlalchemy_url] = started.stdout.splitlines()
            assert sqlalchemy_url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
            with pytest.raises(psycopg.ProgrammingError):  # libpq (psql, Grafana) cannot read that form
                psycopg.connect(sqlalchemy_url).close()
            libpq_url = sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)
            assert f"for psql and Grafana (libpq form): {libpq_url}\n" in started.stderr
            assert "trusts every connection from 127.0.0.1" in started.stderr
            with psycopg.connect(libpq_url) as conn:
                row = conn.execute("SELECT current_database(), has_schema_privilege('ledger_reader', 'reporting', "
                                   "'USAGE')").fetchone()
            assert row == ("dra_ledger", True)
            demo = CliRunner().invoke(app, ["demo", "--no-serve", "--data-dir", str(data_dir)])
            assert demo.exit_code == 0, demo.output
            assert f"for psql and Grafana (libpq form): {libpq_url}\n" in demo.stderr
            assert "trusts every connection from 127.0.0.1" in demo.stderr
        finally:
            stopped = CliRunner().invoke(app, ["db", "stop", "--data-dir", str(data_dir)])
            assert stopped.exit_code == 0, stopped.output


def test_a_configuration_file_that_is_not_utf8_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "binary.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    from ledger.config import load_config
    from ledger.errors import Invalid

    with pytest.raises(Invalid, match="is not UTF-8"):
        load_config(bad)


def test_usage_with_prices_shows_cost_on_the_cli(ledger_engine: Engine, tmp_path: Path) -> None:
    url = _url(ledger_engine)
    from tests.paths import HISTORIES

    assert CliRunner().invoke(app, ["replay", str(HISTORIES / "seed-lab.jsonl"), "--database-url", url]).exit_code == 0
    config = tmp_path / "prices.toml"
    config.write_text('[[prices]]\ndeviceClass = "gpu.example.com"\nperDeviceHour = 2.0\n')
    result = CliRunner().invoke(app, ["usage", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z",
                                      "--config", str(config), "--output", "json", "--database-url", url])
    assert result.exit_code == 0, result.output
    import json

    rows = {r["team"]: r for r in json.loads(result.stdout)["rows"]}
    assert rows["nlp"]["cost"] == pytest.approx(11.0)  # 5.5 device-hours x 2.0


def test_simulate_into_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "fleet.jsonl"
    result = CliRunner().invoke(app, ["simulate", "--nodes", "2", "--hours", "1", "--output", str(target)])

    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"error: cannot write {target}: No such file or directory" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("given", ["", "  "])
def test_simulate_with_an_empty_output_names_the_option_instead_of_the_current_directory(
        given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # Path("") is "."; the refusal must come before anything is written there
    result = CliRunner().invoke(app, ["simulate", "--nodes", "1", "--hours", "0.01", "--output", given])

    assert result.exit_code == 2
    assert "Invalid value for '--output': is empty; give the file to write" in " ".join(result.output.split())
    assert "cannot write ." not in result.output
    assert list(tmp_path.iterdir()) == []


def _interrupted_after(lines: int) -> Callable[..., Iterator[WatchLine | BrokenLine]]:
    """A ``read_history`` that raises ``KeyboardInterrupt`` (what Ctrl-C raises in the main thread) after ``lines``."""
    def read(path: Path, **kwargs: object) -> Iterator[WatchLine | BrokenLine]:
        for n, line in enumerate(read_history(path, **kwargs), 1):  # type: ignore[arg-type]
            if n > lines:
                raise KeyboardInterrupt
            yield line

    return read


def test_an_interrupted_replay_says_how_to_resume_and_the_next_run_records_the_rest(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger import services
    from tests.paths import HISTORIES

    seed = HISTORIES / "seed-lab.jsonl"
    url = _url(ledger_engine)
    monkeypatch.setenv("LEDGER_BATCH_SIZE", "10")
    monkeypatch.setattr(services, "read_history", _interrupted_after(30))
    interrupted = CliRunner().invoke(app, ["replay", str(seed), "--database-url", url])
    monkeypatch.undo()
    with ledger_engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM observations")).scalar_one()
    resumed = CliRunner().invoke(app, ["replay", str(seed), "--database-url", url])

    assert interrupted.exit_code == 130
    assert "run the same command again" in interrupted.output
    # Batches 1 and 2 committed; batch 3 was in flight when Ctrl-C came: committed whole, or cancelled whole.
    assert stored in (20, 30)
    assert resumed.exit_code == 0, resumed.output
    assert f"39 lines: {39 - stored} recorded, {stored} already recorded" in resumed.output


def test_a_long_replay_without_a_terminal_reports_its_lines_and_the_read_models_catch_up(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.paths import HISTORIES

    # The seed lab's 39 lines stand for a long file: progress from 1 x 10 lines on, batches of 10.
    monkeypatch.setattr(cli, "PROGRESS_MIN_LINES", 10)
    monkeypatch.setattr(cli, "PLAIN_PROGRESS_FACTOR", 1)
    monkeypatch.setenv("LEDGER_BATCH_SIZE", "10")
    result = CliRunner().invoke(app, ["replay", str(HISTORIES / "seed-lab.jsonl"), "--database-url",
                                      _url(ledger_engine)])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # A line each tenth of the way passed (10 of 39 is past the second tenth), then the 51 events applied.
    assert lines[:4] == ["replay lines: 10 of 39", "replay lines: 20 of 39", "replay lines: 30 of 39",
                         "replay lines: 39 of 39"]
    assert lines[4] == "read models: applying 51 events ..."
    assert lines[5] == "events applied: 51 of 51"  # one batch of the catch-up (2,000 events a batch)
    assert lines[6].startswith("read models: 51 events applied in ")
    assert lines[7] == "39 lines: 39 recorded, 0 already recorded, 0 rejected; 51 events appended"
    again = CliRunner().invoke(app, ["replay", str(HISTORIES / "seed-lab.jsonl"), "--database-url",
                                     _url(ledger_engine)])
    assert "read models" not in again.output  # nothing to apply: nothing said


def test_an_interrupted_demo_says_where_the_ledger_is_and_its_rerun_adds_the_rest(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger import services

    url = _url(ledger_engine)
    monkeypatch.setattr(services, "read_history", _interrupted_after(20))
    interrupted = CliRunner().invoke(app, ["demo", "--no-serve", "--database-url", url])
    monkeypatch.undo()
    with ledger_engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM observations")).scalar_one()
    again = CliRunner().invoke(app, ["demo", "--no-serve", "--database-url", url])

    assert interrupted.exit_code == 130, interrupted.output
    assert interrupted.output.startswith("interrupted: what was replayed so far is kept")
    assert "the ledger is in the database --database-url names" in interrupted.output
    assert "Traceback" not in interrupted.output and "devices 8" not in interrupted.output
    # The demo replays its 39 lines in one batch (of 5,000): cut at line 21, none of it had been handed to a write.
    assert stored == 0
    assert again.exit_code == 0, again.output
    assert "39 lines: 39 recorded, 0 already recorded, 0 rejected" in again.output


@pytest.mark.parametrize("running", [True, False])
def test_ctrl_c_while_the_demos_embedded_server_starts_says_whether_it_runs_and_how_to_stop_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: bool) -> None:
    from ledger.embedded import EmbeddedPostgres

    def interrupted_start(self: EmbeddedPostgres) -> str:
        raise KeyboardInterrupt  # Ctrl-C during initdb or pg_ctl start: pg_ctl ends, a started server does not

    monkeypatch.delenv("LEDGER_DATABASE_URL", raising=False)
    monkeypatch.setattr(EmbeddedPostgres, "start", interrupted_start)
    monkeypatch.setattr(EmbeddedPostgres, "is_running", lambda self: running)  # pg_ctl had started it, or not yet
    result = CliRunner().invoke(app, ["demo", "--no-serve", "--data-dir", str(tmp_path / "pg")])

    assert result.exit_code == 130, result.output
    if running:
        assert "the embedded server keeps running (stop it with `dra-ledger db stop --data-dir " \
               f"{tmp_path / 'pg'}`)" in result.output
    else:  # initdb had not finished: nothing to stop, and `db stop` would say there is no ledger there
        assert result.output.rstrip().endswith("no embedded server was left running"), result.output
        assert "db stop" not in result.output
    assert "Traceback" not in result.output


def test_the_demo_says_where_the_ledger_stays_once_its_api_stops(ledger_engine: Engine) -> None:
    # Ctrl-C stops the API the demo serves; where the ledger stays was said only before it served, far up under the
    # request log.
    served: list[int] = []
    cli.DEMO_FOLLOWUPS.append(lambda settings, port: served.append(port))  # an API that stops at once
    try:
        result = CliRunner().invoke(app, ["demo", "--database-url", _url(ledger_engine), "--port", "18472"])
    finally:
        cli.DEMO_FOLLOWUPS.pop()

    assert result.exit_code == 0, result.output
    assert served == [18472]
    assert result.stderr.splitlines()[-1] == ("API stopped; the seed-lab history stays in the ledger; it is in the "
                                              "database --database-url names")


def test_the_demo_stops_before_replaying_when_its_api_port_is_taken(ledger_engine: Engine) -> None:
    served: list[int] = []
    cli.DEMO_FOLLOWUPS.append(lambda settings, port: served.append(port))  # what the API plugin adds
    try:
        with taken_port() as port:
            result = CliRunner().invoke(app, ["demo", "--database-url", _url(ledger_engine), "--port", str(port)])
    finally:
        cli.DEMO_FOLLOWUPS.pop()
    assert result.exit_code == 2, result.output
    assert f"cannot serve the API on 127.0.0.1:{port}" in result.output
    assert served == []
    with ledger_engine.connect() as conn:  # nothing replayed
        assert conn.execute(text("SELECT count(*) FROM events")).scalar_one() == 0


@pytest.mark.parametrize("command", [
    ["occupancy"], ["claims"], ["idle-claims"], ["quotas"], ["shared"], ["pending"], ["report", "idle-claims"],
    ["usage", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z"],
])
def test_an_empty_cluster_name_is_refused_by_every_query_like_the_api_refuses_it(
        ledger_engine: Engine, command: list[str]) -> None:
    url = _url(ledger_engine)
    given = CliRunner().invoke(app, [*command, "--cluster", "", "--database-url", url], env={"COLUMNS": "250"})
    from_env = CliRunner().invoke(app, [*command, "--database-url", url], env={"COLUMNS": "250", "LEDGER_CLUSTER": ""})

    for result in (given, from_env):
        assert result.exit_code == 2, result.output
        assert "leave the option out (and LEDGER_CLUSTER unset) to ask about every cluster" in result.output


def test_db_current_exits_1_while_the_schema_is_behind_the_code(ledger_engine: Engine) -> None:
    from ledger.store import schema

    url = _url(ledger_engine)
    head = schema.head_revision()
    at_head = CliRunner().invoke(app, ["db", "current", "--database-url", url])
    assert (at_head.exit_code, at_head.stdout.strip()) == (0, f"database: {head}; code: {head}")
    schema.downgrade(ledger_engine, "0005")
    behind = CliRunner().invoke(app, ["db", "current", "--database-url", url])
    assert behind.exit_code == 1
    assert behind.stdout.strip() == f"database: 0005; code: {head}"
    assert "run `dra-ledger db upgrade`" in behind.stderr


def test_the_configured_teams_label_decides_the_team_of_namespaces_replayed(ledger_engine: Engine,
                                                                             tmp_path: Path) -> None:
    import json

    from tests.paths import HISTORIES

    expected = json.loads((HISTORIES / "seed-lab.expected.json").read_text())["device_hours"]
    url = _url(ledger_engine)
    config = tmp_path / "ledger.toml"
    config.write_text('[teams]\nlabel = "cost-center"\n')  # seed-lab's namespaces carry only `team`
    clash = CliRunner().invoke(app, ["replay", str(HISTORIES / "seed-lab.jsonl"), "--config", str(config),
                                     "--database-url", url], env={"LEDGER_TEAM_LABEL": "team"})
    assert clash.exit_code == 2
    assert (f"LEDGER_TEAM_LABEL is 'team' but teams.label in {config} is 'cost-center': set the namespace label "
            "in one place") in clash.output
    with ledger_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM observations")).scalar_one() == 0  # refused before reading

    replayed = CliRunner().invoke(app, ["replay", str(HISTORIES / "seed-lab.jsonl"), "--config", str(config),
                                        "--database-url", url], env={"LEDGER_TEAM_LABEL": None})
    assert replayed.exit_code == 0, replayed.output
    usage = CliRunner().invoke(app, ["usage", "--from", expected["from"], "--to", expected["to"], "--output", "json",
                                     "--database-url", url])
    assert usage.exit_code == 0, usage.output
    # Without the label each namespace bills itself: vision's hours are ml-train's, nlp's are ml-serve's.
    by_team = {r["team"]: r["deviceHours"] for r in json.loads(usage.stdout)["rows"]}
    assert by_team == pytest.approx({"ml-train": expected["by_team"]["vision"],
                                     "ml-serve": expected["by_team"]["nlp"]}, abs=expected["tolerance_hours"])


def test_a_rejected_line_is_reported_on_one_line_with_its_control_characters_escaped(ledger_engine: Engine,
                                                                                     tmp_path: Path) -> None:
    import json

    hostile = {"apiVersion": "example.com/v1", "kind": "Foo\x1b]0;owned\x07\x1b[2J",
               "metadata": {"name": "n\x1b[31m\nsecond", "uid": "u-1"}}
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps({"observedAt": "2026-11-02T09:00:00Z", "type": "ADDED", "object": hostile}) + "\n")

    result = CliRunner().invoke(app, ["replay", str(path), "--database-url", _url(ledger_engine)])

    assert result.exit_code == 1, result.output  # a rejected line: exit 1, the line recorded as rejected
    [report] = [line for line in result.stderr.splitlines() if line.startswith("rejected ")]
    # The kind is echoed in the reason as the object spelled it: escaped, so it retitles and clears nothing.
    assert "Foo\\x1b]0;owned\\x07\\x1b[2J" in report
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr


def test_replay_reads_a_pipe_once_and_records_every_line(ledger_engine: Engine) -> None:
    # The progress count read the stream first and left nothing: "0 lines: 0 recorded", exit 0.
    import subprocess

    from tests.factories import CLI
    from tests.paths import HISTORIES

    result = subprocess.run([*CLI, "replay", "/dev/stdin", "--database-url", _url(ledger_engine)],
                            input=(HISTORIES / "seed-lab.jsonl").read_bytes(), capture_output=True, timeout=120)

    assert result.returncode == 0, result.stderr
    # seed-lab.jsonl: 39 lines, 51 events (its expected file's replay counts).
    assert b"39 lines: 39 recorded, 0 already recorded, 0 rejected; 51 events appended" in result.stderr


@pytest.mark.parametrize(("setting", "cancelled"), [
    ("lock_timeout", "canceling statement due to lock timeout"),
    ("statement_timeout", "canceling statement due to statement timeout")])
def test_a_statement_the_server_cancels_for_a_timeout_is_said_with_what_to_do(
        ledger_engine: Engine, setting: str, cancelled: str) -> None:
    # The role's (here the session's) timeout ends a statement that waits for a lock another session holds. It is no
    # lost connection: the line must say the server cancelled it and name the setting, where it said "database
    # unavailable".
    url = ledger_engine.url.render_as_string(hide_password=False)
    result = run_while_locked(ledger_engine, "LOCK TABLE events IN ACCESS EXCLUSIVE MODE",
                           [*CLI, "rebuild", "--database-url", url], f"{setting}=300")
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: the database cancelled a statement: {cancelled} (")
    assert f"PGOPTIONS='-c {setting}=0'" in line


def test_a_replay_stopped_by_a_lock_timeout_in_its_catch_up_says_its_lines_are_kept(ledger_engine: Engine) -> None:
    # Another session holds a read model (claims) while the replay's read models catch up: the server's
    # lock_timeout cancels the catch-up. The lines were committed before it; the error said only the cancel.
    url = ledger_engine.url.render_as_string(hide_password=False)
    result = run_while_locked(ledger_engine, "LOCK TABLE claims IN ACCESS EXCLUSIVE MODE",
                           [*CLI, "replay", str(SEED), "--database-url", url], "lock_timeout=300")
    assert result.returncode == 2, result.stderr
    error, kept = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: the database cancelled a statement: canceling statement due to lock timeout (")
    assert kept == ("stopped after every line was recorded, while applying events to the read models: the batches "
                    "applied so far are kept with their checkpoints; the next command that reads them, or a running "
                    "`serve`, applies the rest")
    with ledger_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM observations")).scalar_one() == 39  # seed-lab.jsonl's lines
    again = subprocess.run([*CLI, "replay", str(SEED), "--database-url", url], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert "39 lines: 0 recorded, 39 already recorded, 0 rejected" in again.stderr


def test_a_replay_stopped_at_the_first_query_of_its_catch_up_says_its_lines_are_kept(ledger_engine: Engine) -> None:
    # Reading the checkpoints (how many events to apply) waits for a lock too; it ran before the catch-up said what
    # was kept, so the error line came alone.
    url = ledger_engine.url.render_as_string(hide_password=False)
    result = run_while_locked(ledger_engine, "LOCK TABLE checkpoints IN ACCESS EXCLUSIVE MODE",
                              [*CLI, "replay", str(SEED), "--database-url", url], "lock_timeout=300")
    assert result.returncode == 2, result.stderr
    error, kept = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: the database cancelled a statement: canceling statement due to lock timeout (")
    assert kept.startswith("stopped after every line was recorded, while applying events to the read models: ")
    with ledger_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM observations")).scalar_one() == 39


def test_a_replay_whose_connection_is_lost_while_it_records_says_its_batches_are_kept(ledger_engine: Engine) -> None:
    # Recording waits for a lock on observations that another session holds; an administrator then ends the
    # replay's session (pg_terminate_backend). The services raise "database unavailable" from the lost connection,
    # and the note saying what was kept was on the error they raised it from: the error line came alone.
    url = ledger_engine.url.render_as_string(hide_password=False)
    with ledger_engine.connect() as blocker, ledger_engine.connect() as watcher:
        blocker.execute(text("LOCK TABLE observations IN ACCESS EXCLUSIVE MODE"))
        replay = subprocess.Popen([*CLI, "replay", str(SEED), "--database-url", url], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            pid = None
            deadline = time.monotonic() + 60  # the process's start on a busy machine, not a timing assertion
            while pid is None and replay.poll() is None and time.monotonic() < deadline:
                pid = watcher.execute(text("SELECT pid FROM pg_locks WHERE relation = 'observations'::regclass "
                                           "AND NOT granted")).scalar()
                watcher.rollback()
                time.sleep(0.05)
            assert pid is not None, "the replay never waited for observations"
            watcher.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            watcher.rollback()
            _, stderr = replay.communicate(timeout=120)
        finally:
            if replay.poll() is None:
                replay.kill()
                replay.communicate()
        blocker.rollback()
    assert replay.returncode == 2, stderr
    error, kept = stderr.strip().splitlines()[-2:]
    assert error.startswith("error: database unavailable: "), error
    assert kept == ("stopped: the batches committed so far are kept; run the same command again to record the rest "
                    "(lines already recorded are skipped)")


def test_a_rebuild_stopped_by_a_lock_timeout_says_it_rolled_back(ledger_engine: Engine) -> None:
    # The rebuild, with no patience, queues at once for a read model another session holds, and the server's
    # lock_timeout cancels it: the whole rebuild rolls back, and the error says so under the cancel.
    url = ledger_engine.url.render_as_string(hide_password=False)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    code = ("from ledger.projections import runner; runner.TRUNCATE_LOCK_PATIENCE_S = 0.0; "
            "from ledger.cli import main; main()")
    result = run_while_locked(ledger_engine, "LOCK TABLE device_allocations IN ACCESS SHARE MODE",
                           [sys.executable, "-c", code, "rebuild", "--database-url", url], "lock_timeout=300")
    assert result.returncode == 2, result.stderr
    error, kept = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: the database cancelled a statement: canceling statement due to lock timeout (")
    assert kept == "stopped: the rebuild rolled back; the read models are as they were"


def test_jobs_once_stopped_by_a_lock_timeout_says_the_hours_rolled_so_far_are_kept(ledger_engine: Engine) -> None:
    # Another session holds the rolled hours' table; the server's lock_timeout cancels the rollup. The error line
    # came alone, where SIGTERM and Ctrl-C said what was kept.
    url = ledger_engine.url.render_as_string(hide_password=False)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    result = run_while_locked(ledger_engine, "LOCK TABLE usage_rollups IN ACCESS EXCLUSIVE MODE",
                           [*CLI, "jobs", "--once", "--database-url", url], "lock_timeout=300")
    assert result.returncode == 2, result.stderr
    error, kept = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: the database cancelled a statement: canceling statement due to lock timeout (")
    assert kept == ("stopped: the rollup hours committed so far are kept; run `dra-ledger jobs --once` again to roll "
                    "up the rest (it resumes from the last rolled hour)")


def test_jobs_once_stopped_after_its_rollups_says_every_hour_is_rolled_up(ledger_engine: Engine) -> None:
    # The rollups committed, the snapshots stopped (a lock_timeout on the idle-claim snapshots): the note told the
    # operator to recompute "the rest" of the hours, with none left, and did not say the snapshots were not taken.
    url = ledger_engine.url.render_as_string(hide_password=False)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    result = run_while_locked(ledger_engine, "LOCK TABLE idle_claim_snapshots IN ACCESS EXCLUSIVE MODE",
                              [*CLI, "jobs", "--once", "--rollup-from", "2026-11-02T09:00:00Z", "--database-url",
                               url], "lock_timeout=300")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "stopped after every hour was rolled up: the snapshots (idle claims, quotas, pending demand) and occupancy "
        "counts not taken yet are taken by the next run of the jobs")
    with ledger_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM usage_rollups")).scalar_one() > 0
        assert conn.execute(text("SELECT count(*) FROM idle_claim_snapshots")).scalar_one() == 0


def test_jobs_once_with_rollup_from_stopped_names_the_hour_to_go_on_from(ledger_engine: Engine) -> None:
    # A run recomputing from --rollup-from told the operator to run `jobs --once` again, which resumes from the last
    # rolled hour, past the hours the stopped run never reached: they stayed as they were. Nothing was committed
    # here (the lock_timeout comes first), so it must name the hour it was asked to start from.
    url = ledger_engine.url.render_as_string(hide_password=False)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    result = run_while_locked(ledger_engine, "LOCK TABLE usage_rollups IN ACCESS EXCLUSIVE MODE",
                           [*CLI, "jobs", "--once", "--rollup-from", "2026-11-02T09:00:00Z", "--database-url", url],
                           "lock_timeout=300")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "stopped: the rollup hours committed so far are kept; run `dra-ledger jobs --once --rollup-from "
        "2026-11-02T09:00:00Z` to recompute the rest (without --rollup-from it would resume from the last rolled "
        "hour, past them)")


def test_the_long_running_jobs_write_a_timed_log_of_each_run_and_stop_on_sigterm(ledger_engine: Engine,
                                                                                  tmp_path: Path) -> None:
    # `dra-ledger jobs` (compose.yaml's `jobs` service) set up no logging: a run of a job, and what it did, left no
    # line, where `watch` running the same scheduler logs each.
    import os
    import re
    import signal

    url = ledger_engine.url.render_as_string(hide_password=False)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    log = tmp_path / "jobs.log"
    ran = 'Job "occupancy counts'
    with log.open("w") as out:
        process = subprocess.Popen([*CLI, "jobs", "--database-url", url], stdout=subprocess.DEVNULL, stderr=out,
                                   env={**os.environ, "LEDGER_JOBS_COUNTS_INTERVAL_S": "5"})
    try:
        deadline = time.monotonic() + 120  # the first run comes after 5 s; start-up on a busy machine besides
        while ran not in log.read_text() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = log.read_text().splitlines()
    assert process.returncode == 0, lines
    executed = [line for line in lines if ran in line and "executed successfully" in line]
    assert executed, lines
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO apscheduler\.executors\.default: "
                        r'Job "occupancy counts \(trigger: interval\[0:00:05\].*" executed successfully', executed[0])


def test_statistics_the_database_refused_are_said_after_the_events_applied(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # The statistics refresh follows the catch-up, so what it says follows the "events applied" line. When its
    # connection failed, its warning was logged at once and came out before that line.
    from ledger import services
    from ledger.errors import StoreUnavailable
    from ledger.store.database import LedgerDatabase

    def unreachable(self: LedgerDatabase) -> object:
        raise StoreUnavailable("connection refused")

    monkeypatch.setattr(cli, "PROGRESS_MIN_LINES", 10)
    monkeypatch.setattr(cli, "PLAIN_PROGRESS_FACTOR", 1)
    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", 1)
    monkeypatch.setattr(LedgerDatabase, "analyze", unreachable)
    result = CliRunner().invoke(app, ["replay", str(HISTORIES / "seed-lab.jsonl"), "--database-url",
                                      _url(ledger_engine)])

    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("replay lines:")]
    assert lines[:2] == ["read models: applying 51 events ...", "events applied: 51 of 51"]
    assert lines[2].startswith("read models: 51 events applied in ")
    assert lines[3:] == ["warning: statistics left to autovacuum: connection refused",
                         "39 lines: 39 recorded, 0 already recorded, 0 rejected; 51 events appended"]
