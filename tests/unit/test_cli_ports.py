"""Every port option refuses a number no TCP port has, as ``demo --port`` does: exit code 2 and Typer's
range message (``Input should be less than or equal to 65535``), before anything binds (no
``OverflowError`` traceback from ``bind()``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.factories import plugin_commands

WIDE = {"COLUMNS": "300"}
"""A terminal wide enough that Typer's error box keeps each message on one line."""


@pytest.mark.parametrize(("args", "option", "bounds"), [
    (["serve", "--port", "99999"], "--port", "less than or equal to 65535"),
    (["serve", "--port", "65536"], "--port", "less than or equal to 65535"),
    (["serve", "--port", "-5"], "--port", "greater than or equal to 1"),
    (["fake-apiserver", "--history", "h.jsonl", "--port", "99999"], "--port", "less than or equal to 65535"),
    (["fake-apiserver", "--history", "h.jsonl", "--port", "-5"], "--port", "greater than or equal to 0"),
    (["watch", "--health-port", "99999"], "--health-port", "less than or equal to 65535"),
    (["watch", "--health-port", "-2"], "--health-port", "greater than or equal to -1"),
])
def test_a_port_outside_0_to_65535_is_refused_with_exit_code_2_naming_the_option_and_its_range(
        args: list[str], option: str, bounds: str) -> None:
    with plugin_commands() as app:
        result = CliRunner().invoke(app, args, env=WIDE)

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"Invalid value for '{option}': Input should be {bounds}" in result.output
    assert "Traceback" not in result.output


def test_the_demo_refuses_an_impossible_port_the_same_way() -> None:
    from ledger.cli import app

    result = CliRunner().invoke(app, ["demo", "--port", "99999"], env=WIDE)

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--port': Input should be less than or equal to 65535" in result.output
