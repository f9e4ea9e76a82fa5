"""``--help`` and the refusal of a bad option value read as a command line's, on every command.

A bad choice names the option, the value and the choices in plain words (Typer 0.29 passed pydantic's
``Value error, `` prefix through); a flag shows no value type in ``--help`` (Typer's Rich help printed
``<bool>`` beside each, ``--help`` included); an argument shows its name in the usage line (``FILE...``, where
Typer printed ``{files}...``); an option that takes one value, given twice, is refused (Click kept the last).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.testing import CliRunner

from ledger import cli
from tests.factories import plugin_commands

WIDE = {"COLUMNS": "300"}
"""A terminal wide enough that no message and no row of ``--help`` is folded over two lines."""


def error_message(output: str) -> str:
    """The text inside the ``Error`` panel of a usage error as Typer prints it, its lines joined by spaces."""
    return " ".join(line.strip("│ ") for line in output.splitlines() if line.startswith("│"))


def every_command(plugins: typer.Typer) -> Iterator[tuple[list[str], typer.Typer, TyperCommand]]:
    """``(words naming the command, the app holding it, the command)`` for every command of ``dra-ledger``:
    those of ``ledger.cli.app`` and those ``plugins`` holds (:func:`tests.factories.plugin_commands`)."""

    def leaves(group: TyperGroup, path: list[str]) -> Iterator[tuple[list[str], TyperCommand]]:
        for name, command in group.commands.items():
            if isinstance(command, TyperGroup):
                yield from leaves(command, [*path, name])
            elif isinstance(command, TyperCommand):
                yield [*path, name], command

    for app in (cli.app, plugins):
        for path, command in leaves(typer.main.get_group(app), []):
            yield path, app, command


def help_of(app: typer.Typer, words: list[str]) -> str:
    result = CliRunner().invoke(app, [*words, "--help"], env=WIDE, prog_name="dra-ledger")
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(("args", "said"), [
    (["occupancy", "-o", "csv"], "Invalid value for '--output' / '-o': 'csv' is not one of 'table', 'json'."),
    (["usage", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T10:00:00Z", "--group-by", "pool"],
     "Invalid value for '--group-by': 'pool' is not one of 'team', 'namespace', 'deviceClass', 'model', 'node', "
     "'cluster'."),
    (["claims", "--state", "gone"],
     "Invalid value for '--state': 'gone' is not one of 'pending', 'allocated', 'deleted', 'all'."),
    (["report", "idle-claims", "-f", "xml"],
     "Invalid value for '--format' / '-f': 'xml' is not one of 'table', 'json', 'csv'."),
])
def test_a_bad_choice_names_the_option_the_value_and_the_choices_with_exit_code_2(args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli.app, args, env=WIDE)

    assert result.exit_code == 2, result.output
    assert error_message(result.output) == said


def test_a_long_bad_choice_is_echoed_cut_and_with_its_control_characters_escaped() -> None:
    result = CliRunner().invoke(cli.app, ["occupancy", "-o", "\x1b[31m" + "x" * 500], env=WIDE)

    assert result.exit_code == 2, result.output
    message = error_message(result.output)
    assert message.startswith(r"Invalid value for '--output' / '-o': '\x1b[31mxxx")
    assert message.endswith("xx…' is not one of 'table', 'json'.")
    assert len(message) < 200


def test_every_choice_option_of_every_command_refuses_a_bad_value_in_plain_words() -> None:
    checked = []
    with plugin_commands() as plugins:
        for words, app, command in every_command(plugins):
            for param in command.params:
                choices = param.type_descriptor.choices if isinstance(param, TyperOption) else None
                if not choices:
                    continue
                option = param.opts[0]
                result = CliRunner().invoke(app, [*words, option, "bogus"], env=WIDE)
                message = error_message(result.output)
                allowed = ", ".join(repr(str(getattr(c, "value", c))) for c in choices)
                assert result.exit_code == 2, (words, option, result.output)
                assert message.startswith(f"Invalid value for '{option}'"), (words, message)
                assert message.endswith(f": 'bogus' is not one of {allowed}."), (words, message)
                checked.append(f"{' '.join(words)} {option}")
    assert "occupancy --output" in checked and "report idle-claims --format" in checked  # the walk found them


def test_every_option_of_every_command_given_twice_is_refused_naming_it() -> None:
    checked = []
    with plugin_commands() as plugins:
        for words, app, command in every_command(plugins):
            for param in command.params:
                if not isinstance(param, TyperOption) or param.multiple or param.count or param.is_eager:
                    continue
                given = [param.opts[0]] if param.is_flag else [param.opts[0], "x"]
                result = CliRunner().invoke(app, [*words, *given, *given], env=WIDE)
                names = " / ".join(f"'{name}'" for name in [*param.opts, *param.secondary_opts])
                assert result.exit_code == 2, (words, given, result.output)
                assert error_message(result.output) == f"Option {names} was given 2 times; give it once.", words
                checked.append(f"{' '.join(words)} {param.opts[0]}")
    assert {"occupancy --at", "replay --cluster", "demo --serve", "watch --kubeconfig"} <= set(checked)


@pytest.mark.parametrize("args", [
    ["occupancy", "-o", "json", "--output", "table"],
    ["demo", "--serve", "--no-serve"],
])
def test_an_option_given_by_two_of_its_names_counts_as_given_twice(args: list[str]) -> None:
    result = CliRunner().invoke(cli.app, args, env=WIDE)

    assert result.exit_code == 2, result.output
    assert "was given 2 times; give it once." in error_message(result.output)


def test_help_given_twice_still_shows_the_help() -> None:
    result = CliRunner().invoke(cli.app, ["occupancy", "--help", "--help"], env=WIDE)

    assert result.exit_code == 0, result.output
    assert "Usage: root occupancy [OPTIONS]" in result.output


def rows(text: str) -> list[str]:
    """The lines of a ``--help`` text without the panels' borders, each run of blanks made one space."""
    return [" ".join(line.strip("│ ").split()) for line in text.splitlines()]


def test_no_help_text_shows_a_value_type_for_a_flag() -> None:
    with plugin_commands() as plugins:
        texts = [("dra-ledger", help_of(cli.app, []))] + [(" ".join(words), help_of(app, words))
                                                          for words, app, _ in every_command(plugins)]
        demo, watch = help_of(cli.app, ["demo"]), help_of(plugins, ["watch"])

    assert len(texts) > 15
    for command, text in texts:
        assert "<bool>" not in text, command
        assert "--help Show this message and exit." in rows(text), command
    assert any(row.startswith("--serve --no-serve Serve the REST API") for row in rows(demo))
    assert any(row.startswith("--jobs --no-jobs Run the report jobs") for row in rows(watch))


def test_the_root_help_shows_its_flags_without_a_type() -> None:
    shown = rows(help_of(cli.app, []))

    assert "--version Print the installed version and exit." in shown
    assert any(row.startswith("--install-completion Install completion") for row in shown)


def test_replay_usage_line_names_its_files_FILE() -> None:
    text = help_of(cli.app, ["replay"])

    assert "Usage: dra-ledger replay [OPTIONS] FILE..." in [line.strip() for line in text.splitlines()]
    assert any(row.startswith("* FILE... ") for row in rows(text)), text


def test_replay_without_a_file_or_with_a_missing_one_names_the_argument_FILE() -> None:
    missing = CliRunner().invoke(cli.app, ["replay"], env=WIDE, prog_name="dra-ledger")
    absent = CliRunner().invoke(cli.app, ["replay", "/nonexistent/history.jsonl"], env=WIDE)

    assert missing.exit_code == 2 and absent.exit_code == 2
    assert error_message(missing.output) == "Missing argument 'FILE...'."
    assert error_message(absent.output) == ("Invalid value for 'FILE...': file '/nonexistent/history.jsonl' does not "
                                            "exist.")


def test_no_usage_line_marks_an_argument_with_braces() -> None:
    with plugin_commands() as plugins:
        usages = [next(line.strip() for line in help_of(app, words).splitlines() if "Usage:" in line)
                  for words, app, _ in every_command(plugins)]

    assert len(usages) > 15
    assert [usage for usage in usages if "{" in usage or "}" in usage] == []


def test_the_group_by_option_says_which_groupings_add_clusters_together() -> None:
    text = " ".join(rows(help_of(cli.app, ["usage"])))

    assert "Group rows by this key; every key but cluster adds the clusters' device-hours together (give --cluster " \
        "for one cluster)." in text
