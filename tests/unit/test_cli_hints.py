"""The demo's hints name the command as it can be pasted back into the same shell."""

from __future__ import annotations

from pathlib import Path

from ledger.cli import command_name


def _script(folder: Path) -> Path:
    folder.mkdir(parents=True)
    script = folder / "dra-ledger"
    script.write_text("#!/bin/sh\n")
    return script


def test_a_command_started_from_a_venv_that_is_not_on_path_is_named_by_that_path(tmp_path: Path) -> None:
    mine = _script(tmp_path / "clone" / ".venv" / "bin")
    other = _script(tmp_path / "elsewhere" / "bin")
    assert command_name(".venv/bin/dra-ledger", None) == ".venv/bin/dra-ledger"
    assert command_name(str(mine), str(other)) == str(mine)


def test_the_command_on_path_is_named_by_its_bare_name(tmp_path: Path) -> None:
    mine = _script(tmp_path / "venv" / "bin")
    assert command_name(str(mine), str(mine)) == "dra-ledger"


def test_a_process_not_started_as_dra_ledger_gets_the_bare_name() -> None:
    # python -m / python -c (the benchmarks start it so): argv[0] names no dra-ledger program to repeat.
    assert command_name("-c", None) == "dra-ledger"
    assert command_name("/usr/lib/python3/ledger/cli.py", "/usr/bin/dra-ledger") == "dra-ledger"
