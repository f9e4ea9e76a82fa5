"""``dra-ledger --version`` prints the version of the installed package (no database needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from ledger.cli import app

ROOT = Path(__file__).resolve().parents[2]


def test_version_prints_the_project_version_from_pyproject_and_exits_zero() -> None:
    # The expected value comes from pyproject.toml, not from the metadata the command reads.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    result = CliRunner().invoke(app, ["--version"])

    assert result.exit_code == 0, result.output
    assert result.stdout == f"{project['name']} {project['version']}\n"


def test_version_wins_over_a_command_given_after_it() -> None:
    # Eager: the command is never parsed, so its missing required options are not reported.
    result = CliRunner().invoke(app, ["--version", "usage"])

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dra-ledger ")
