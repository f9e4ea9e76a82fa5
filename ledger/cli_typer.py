"""Typer as every ``dra-ledger`` command uses it: a bad choice refused in plain words.

Why a module of its own: Typer 0.29 (which vendors Click and coerces values with pydantic) printed things a
command line should not, and each is corrected here once for every command, ``ledger``'s and those that ``api`` and
``workers`` register (``ledger.cli.COMMAND_GROUP``), instead of at each option:

- a bad choice (``-o csv``) answered ``Value error, 'csv' is not one of 'table', 'json'.``: pydantic's prefix for
  the ``ValueError`` Typer raises inside its validator (:func:`choice_option`).

Only Typer's own hooks are used: ``parser=`` of an option.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from ledger.errors import shorten

ChoiceT = TypeVar("ChoiceT", bound=enum.Enum)


def choice_parser(choices: type[ChoiceT]) -> Callable[[str | ChoiceT], ChoiceT]:
    """A Typer ``parser=`` reading an option's text as one of the ``choices`` (an ``Enum`` of ``str`` values).

    Args:
        choices: the values accepted, matched exactly (case-sensitive), as Typer matches an ``Enum`` option.

    Returns:
        A function from the text (or an already chosen member: the option's default) to the member. It raises
        ``typer.BadParameter`` for any other text, which Typer reports with exit code 2 as ``Invalid value for
        '--output' / '-o': 'csv' is not one of 'table', 'json'.`` (Click's own words), the value echoed at most 100
        characters long with its control characters escaped (``repr``).
    """

    def parse(value: str | ChoiceT) -> ChoiceT:
        if isinstance(value, choices):
            return value
        for choice in choices:
            if choice.value == value:
                return choice
        allowed = ", ".join(repr(choice.value) for choice in choices)
        # BadParameter, not ValueError: pydantic would prefix a ValueError's text with "Value error, ".
        raise typer.BadParameter(f"{shorten(repr(value))} is not one of {allowed}.")

    return parse


def choice_option(choices: type[enum.Enum], *param_decls: str, help: str | None = None) -> Any:
    """A ``typer.Option`` taking one of ``choices``: a bad value is refused naming the option, the value and the
    choices (:func:`choice_parser`); ``--help`` lists the choices as Typer does for an ``Enum`` (``<table|json>``).

    Every choice option is declared through this (``tests/unit/test_cli_help.py`` tries each one with a bad value).

    Args:
        choices: the ``Enum`` the parameter is annotated with.
        param_decls: the option's names (default: from the parameter's name).
        help: its help text.

    Returns:
        What ``typer.Option`` returns (typed ``Any`` by Typer), for ``Annotated[...]``.
    """
    return typer.Option(*param_decls, help=help, parser=choice_parser(choices))
