"""A query of an embedded ledger that was never recorded is refused: a mistyped ``--data-dir`` must not start a
new, empty PostgreSQL there and answer with zeros. So are the other commands that only use a ledger
(``db current``, ``rebuild``, ``jobs``): only the commands meant to make one may initdb a data dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from ledger.cli import app
from tests.factories import plugin_commands

WIDE = {"COLUMNS": "300", "LEDGER_DATABASE_URL": None}


def _assert_refused(result: Result, tmp_path: Path, missing: Path) -> None:
    """Exit code 2, the no-ledger message with its hints naming ``missing``, and nothing made in ``tmp_path``."""
    assert result.exit_code == 2, result.output
    assert f"error: no ledger in {missing}: nothing was recorded there (a mistyped --data-dir?)" in result.output
    # The commands it suggests record into the directory asked for, not the default one.
    assert f"demo --data-dir {missing}`" in result.output
    assert f"replay FILE --cluster NAME --data-dir {missing}`" in result.output
    assert not missing.exists()
    assert list(tmp_path.iterdir()) == []  # no lock or port file beside it either


@pytest.mark.parametrize("args", [
    ["occupancy"], ["usage", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z"], ["claims"],
    ["idle-claims"], ["quotas"], ["pending"], ["report", "idle-claims", "-f", "csv"],
])
def test_a_query_of_a_data_dir_with_no_ledger_is_refused_and_creates_nothing(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "ledgr"  # the user meant another directory

    result = CliRunner().invoke(app, [*args, "--data-dir", str(missing)], env=WIDE)

    _assert_refused(result, tmp_path, missing)


def test_an_empty_directory_is_no_ledger_either(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["occupancy", "--data-dir", str(tmp_path)], env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"no ledger in {tmp_path}" in result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [["db", "current"], ["db", "stop"], ["rebuild"]])
def test_db_current_and_rebuild_of_a_data_dir_with_no_ledger_are_refused_and_create_nothing(
        tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "ledgr"

    result = CliRunner().invoke(app, [*args, "--data-dir", str(missing)], env=WIDE)

    _assert_refused(result, tmp_path, missing)


@pytest.mark.parametrize("args", [["db", "current"], ["rebuild"]])
def test_a_data_dir_with_no_ledger_from_ledger_data_dir_is_refused_too(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "ledgr"

    result = CliRunner().invoke(app, args, env={**WIDE, "LEDGER_DATA_DIR": str(missing)})

    _assert_refused(result, tmp_path, missing)


@pytest.mark.parametrize("args", [["jobs", "--once"], ["jobs"]])
def test_the_jobs_take_data_dir_and_refuse_one_with_no_ledger(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "ledgr"

    with plugin_commands() as plugins:
        result = CliRunner().invoke(plugins, [*args, "--data-dir", str(missing)], env=WIDE)

    _assert_refused(result, tmp_path, missing)


def test_the_jobs_refuse_a_ledger_data_dir_with_no_ledger(tmp_path: Path) -> None:
    missing = tmp_path / "ledgr"

    with plugin_commands() as plugins:
        result = CliRunner().invoke(plugins, ["jobs", "--once"], env={**WIDE, "LEDGER_DATA_DIR": str(missing)})

    _assert_refused(result, tmp_path, missing)
