"""The README's CLI reference table agrees with the commands ``dra-ledger`` really has.

Each row's options must exist on its command; an option written outside ``[...]`` must be required
(or act at once, as ``--version`` does) and one inside must be optional; every command and every
required option must appear in the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.testing import CliRunner

from ledger import cli
from tests.factories import plugin_commands

ROOT = Path(__file__).resolve().parents[2]


def reference_rows() -> list[str]:
    """The first cell of each row of the table under ``## CLI reference``, ``\\|`` unescaped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    return [m.group(1).replace("\\|", "|") for m in re.finditer(r"^\| `dra-ledger([^`]*)` \|", section, re.M)]


def the_whole_cli() -> TyperGroup:
    """``dra-ledger`` as its console script builds it: ``ledger.cli.app`` plus the registered commands."""
    root = typer.main.get_group(cli.app)
    with plugin_commands() as plugins:
        root.commands.update(typer.main.get_group(plugins).commands)
    return root


def leaves(group: TyperGroup, prefix: str = "") -> Iterator[str]:
    for name, command in group.commands.items():
        if isinstance(command, TyperGroup):
            yield from leaves(command, f"{prefix}{name} ")
        else:
            yield prefix + name


def resolve(root: TyperGroup, usage: str) -> tuple[TyperCommand | TyperGroup, list[str], list[tuple[str, bool]]]:
    """The command a row names, the commands it covers (``db upgrade | current`` covers two), and each
    option written in it with whether it stands inside brackets."""
    command: TyperCommand | TyperGroup = root  # a row naming no command (--version) is about the root's options
    group, groups = root, []
    covered: list[str] = []
    options: list[tuple[str, bool]] = []
    depth = 0
    for token in re.findall(r"\[|\]|[^\s\[\]|]+", usage):
        depth += {"[": 1, "]": -1}.get(token, 0)
        if token.startswith("-"):
            options.append((token, depth > 0))
        elif isinstance(found := group.commands.get(token), TyperGroup):
            group = found
            groups.append(token)
        elif isinstance(found, TyperCommand):
            covered.append(" ".join([*groups, token]))
            command = found if command is root else command
    return command, covered, options


ROOT_CLI = the_whole_cli()
ROWS = reference_rows()


@pytest.mark.parametrize("usage", ROWS)
def test_each_option_of_a_row_exists_and_is_bracketed_exactly_when_optional(usage: str) -> None:
    command, _, options = resolve(ROOT_CLI, usage)
    params = {name: p for p in command.params if isinstance(p, TyperOption) for name in [*p.opts, *p.secondary_opts]}
    for option, bracketed in options:
        assert option in params, f"{option} is not an option of `dra-ledger{usage}`"
        param = params[option]
        if bracketed:
            assert not param.required, f"{option} is required: write it without [...] in `dra-ledger{usage}`"
        else:
            assert param.required or param.is_eager, f"{option} is optional: write it as [{option} ...]"
    shown = {name for name, _ in options}
    missing = [p.opts[0] for p in command.params if isinstance(p, TyperOption) and p.required
               and not shown & {*p.opts, *p.secondary_opts}]
    assert not missing, f"`dra-ledger{usage}` leaves out required options {missing}"


def test_every_command_and_the_version_option_have_a_row() -> None:
    covered = {name for usage in ROWS for name in resolve(ROOT_CLI, usage)[1]}
    assert set(leaves(ROOT_CLI)) - covered == set()
    assert any(usage.strip() == "--version" for usage in ROWS)


def help_texts() -> Iterator[tuple[str, str]]:
    """``(command, --help output)`` of ``dra-ledger`` itself and of every command, as a terminal shows it."""
    wide = {"COLUMNS": "300"}
    yield "dra-ledger", CliRunner().invoke(cli.app, ["--help"], env=wide).output
    with plugin_commands() as plugins:
        for command in leaves(the_whole_cli()):
            for app in (cli.app, plugins):  # the command is on one of them
                result = CliRunner().invoke(app, [*command.split(), "--help"], env=wide)
                if result.exit_code == 0:
                    yield command, result.output
                    break
            else:
                raise AssertionError(f"no --help for {command}")


def test_no_help_text_and_no_readme_line_points_at_a_document_the_repository_lacks() -> None:
    # DESIGN.md is not in the repository: a reader of --help or the README could not follow "DESIGN §9".
    assert not (ROOT / "DESIGN.md").exists()
    for command, text in help_texts():
        assert "DESIGN" not in text, command
    readme = (ROOT / "README.md").read_text()
    assert "DESIGN" not in readme
    assert "(to come)" not in readme  # api/ and workers/ exist


def test_watch_help_names_the_six_kinds_it_follows() -> None:
    text = dict(help_texts())["watch"]
    assert "five" not in text
    for kind in ("ResourceSlice", "ResourceClaim", "DeviceClass", "Pod", "Namespace", "DeviceTaintRule"):
        assert kind in text, kind
