"""An empty cluster name is refused by every command that takes ``--cluster`` (exit code 2), whether it came
from the option or from ``LEDGER_CLUSTER``, before any database is opened: the recording commands used to
key their rows by ``default`` (``replay``) or by ``""`` (``watch``) without a word. Empty filters are refused the
same way, and ``jobs --rollup-from`` without ``--once``."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.factories import plugin_commands

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"
"""A database URL that leads nowhere: the refusal must come before the database is touched."""
WIDE = {"COLUMNS": "300"}
"""A terminal wide enough that Typer's error box keeps each message on one line."""


def _assert_refused_to_record(app: typer.Typer, args: list[str], source: str) -> None:
    """Run ``args`` with an empty cluster from ``source`` (``option`` or ``environment``); assert exit code 2
    and the recording commands' message."""
    if source == "option":
        result = CliRunner().invoke(app, [*args, "--cluster", ""], env=WIDE)
    else:
        result = CliRunner().invoke(app, args, env={**WIDE, "LEDGER_CLUSTER": ""})
    assert result.exit_code == 2, result.output
    assert ("Invalid value for --cluster: empty; leave the option out (and LEDGER_CLUSTER unset) to record as "
            "cluster 'default'") in result.output


@pytest.mark.parametrize("source", ["option", "environment"])
def test_replay_refuses_an_empty_cluster_instead_of_recording_under_default(tmp_path: Path, source: str) -> None:
    from ledger.cli import app

    history = tmp_path / "h.jsonl"
    history.write_text("")
    _assert_refused_to_record(app, ["replay", str(history), "--database-url", NOWHERE], source)


@pytest.mark.parametrize("source", ["option", "environment"])
def test_watch_refuses_an_empty_cluster(source: str) -> None:
    with plugin_commands() as app:
        _assert_refused_to_record(app, ["watch", "--database-url", NOWHERE, "--kubeconfig", "/nonexistent"], source)


def test_jobs_refuses_an_empty_cluster() -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["jobs", "--once", "--cluster", "", "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "Invalid value for --cluster: empty; leave the option out to run the jobs for every cluster" in result.output


def test_serve_refuses_an_empty_cluster() -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["serve", "--cluster", "", "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "--cluster is empty; leave it out to serve every cluster" in result.output


@pytest.mark.parametrize(("command", "option"), [
    (["occupancy"], "--node"), (["occupancy"], "--driver"), (["occupancy"], "--pool"),
    (["occupancy"], "--device-class"), (["claims"], "--namespace"),
])
def test_an_empty_filter_is_refused_as_the_api_refuses_it_not_answered_with_an_empty_fleet(
        command: list[str], option: str) -> None:
    # `--node "$NODE"` with NODE unset printed "devices 0, allocated 0, free 0" for a node called "".
    from ledger.cli import app

    result = CliRunner().invoke(app, [*command, option, "", "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}': empty; leave the option out to keep every one" in result.output


@pytest.mark.parametrize(("command", "option"), [(["occupancy"], "--node"), (["claims"], "--namespace")])
def test_a_filter_of_only_blanks_is_refused_as_an_empty_one_is(command: list[str], option: str) -> None:
    from ledger.cli import app

    result = CliRunner().invoke(app, [*command, option, "  ", "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert (f"Invalid value for '{option}': only blanks, which no name holds; leave the option out to keep every "
            "one") in result.output


def test_jobs_refuses_rollup_from_without_once_instead_of_starting_the_scheduler_silently() -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["jobs", "--rollup-from", "2026-11-02T09:00:00Z", "--database-url", NOWHERE],
                                    env=WIDE)

    assert result.exit_code == 2, result.output
    assert ("Invalid value for --rollup-from: only with --once (the scheduled rollup resumes from the last rolled "
            "hour)") in result.output


def test_jobs_refuses_an_empty_rollup_from_instead_of_rolling_up_from_the_last_hour() -> None:
    # `--rollup-from "" --once` rolled up 776 hours from the last rolled hour, as if the option were left out.
    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["jobs", "--once", "--rollup-from", "", "--database-url", NOWHERE], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "Invalid value for --rollup-from: not an RFC 3339 time with a zone: ''" in result.output
