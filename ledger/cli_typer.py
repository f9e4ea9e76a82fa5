"""Typer as every ``dra-ledger`` command uses it: choices refused in plain words, flags and arguments shown cleanly.

Why a module of its own: Typer 0.29 (which vendors Click and coerces values with pydantic) printed or did four things a
command line should not, and each is corrected here once for every command, ``ledger``'s and those that ``api`` and
``workers`` register (``ledger.cli.COMMAND_GROUP``), instead of at each option:

- a bad choice (``-o csv``) answered ``Value error, 'csv' is not one of 'table', 'json'.``: pydantic's prefix for
  the ``ValueError`` Typer raises inside its validator (:func:`choice_option`);
- every flag, ``--help`` included, showed ``<bool>`` in ``--help``, as if it took a value (:class:`LedgerCommand`,
  :class:`LedgerGroup`);
- a required argument was written ``{files}...`` in the usage line (:class:`LedgerCommand`);
- an option given twice (``--cluster a --cluster b``) kept the last value without a word
  (:func:`refuse_repeated_options`).

It also holds how a command ends on Ctrl-C or SIGTERM when it has nothing of its own to say
(:class:`LedgerCommand`).

Only Typer's own hooks are used: ``parser=`` of an option, ``metavar``, and the ``cls`` of a command or group
(whose Click methods, ``make_parser`` among them, are overridden).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

from ledger.errors import shorten_repr
from ledger.interrupts import stopped_by
from ledger.store.postgres import SESSION_NAME

if TYPE_CHECKING:
    # Typer's vendored Click, a private module: only the type checker reads it (for the types the overridden
    # methods take), so that a Typer release that moves it breaks no run of the command line.
    from typer._click import Context, HelpFormatter, Parameter

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
        raise typer.BadParameter(f"{shorten_repr(value)} is not one of {allowed}.")

    return parse


def whole_number_parser(low: int, high: int) -> Callable[[str | int], int]:
    """A Typer ``parser=`` reading an option's text (or its environment variable's) as a whole number from ``low`` to
    ``high``, written in ASCII digits only.

    Click's ``int`` reads the text with Python's ``int()``, which also takes ``1_5`` (15), ``+3``, `` 2`` and other
    scripts' digits: a typo in a setting became another number without a word. A ``parser=`` replaces Typer's
    ``min``/``max`` checks, so the range is checked here, in pydantic's words as Typer words them.

    Returns:
        A function from the text (or the already numeric default) to the number; it raises ``typer.BadParameter``
        (exit code 2, naming the option and its environment variable) for anything else.
    """

    def parse(value: str | int) -> int:
        if isinstance(value, int):
            number = value
        elif value.isascii() and value.isdigit():
            number = int(value)
        else:
            raise typer.BadParameter(f"{shorten_repr(value)} is not a whole number (digits 0-9 only)")
        if number < low:
            raise typer.BadParameter(f"Input should be greater than or equal to {low}")
        if number > high:
            raise typer.BadParameter(f"Input should be less than or equal to {high}")
        return number

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


def show_flags_without_a_type(params: Iterable[Parameter]) -> None:
    """Give each flag among ``params`` an empty ``metavar``, so that ``--help`` shows no value type beside it.

    Typer's Rich help prints an option's ``metavar`` in the type column, else its annotation: ``<bool>`` for every
    flag (``--help``, ``--version``, ``--serve/--no-serve``), which takes no value. A flag given a ``metavar`` of its
    own keeps it. Idempotent.
    """
    for param in params:
        if isinstance(param, TyperOption) and (param.is_flag or param.count) and param.metavar is None:
            param.metavar = ""


def argument_usage(argument: TyperArgument) -> str:
    """How the usage line names ``argument``, as Click writes it: its ``metavar`` as given (``FILE...``), else its
    name in capitals, in ``[...]`` when it is optional and followed by ``...`` when it takes several values."""
    if argument.metavar is not None:
        return argument.metavar
    name = (argument.name or "").upper()
    name = name if argument.required else f"[{name}]"
    return f"{name}..." if argument.nargs != 1 else name


def command_name(ctx: Context) -> str:
    """``dra-ledger`` and the names of the command and its groups (``dra-ledger db upgrade``), however the program
    was started (``python -c 'from ledger.cli import main; main()'``, a test runner's ``prog_name``)."""
    names: list[str] = []
    while ctx.parent is not None:
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["dra-ledger", *names])


ANSWERED: ContextVar[bool] = ContextVar("ANSWERED", default=False)
"""Whether the command returned (its answer written, exit code 0), set by :class:`LedgerCommand`: a Ctrl-C or
SIGTERM that comes after it, while Click closes the command's context, leaves that exit code
(:func:`ledger.cli.main`, which sets it to ``False`` first)."""


def refuse_repeated_options(ctx: Context, order: Iterable[Parameter]) -> None:
    """Refuse an option given more than once when it takes one value (or is a flag).

    Click keeps the last of the values and drops the others without a word: ``--cluster a --cluster b`` answered for
    ``b`` alone, ``--at`` twice for the second instant, ``--serve --no-serve`` did not serve. Options that collect
    several values (``multiple``) or count (``-v -v``) are left alone, and so are the eager ones (``--help``), which
    end the command before anything is done.

    Args:
        ctx: the command's context, for the error.
        order: the parameters in the order the command line gave them, one entry each time one was given (the third
            value Click's option parser returns).

    Raises:
        click.UsageError: (Typer's vendored Click, by ``ctx.fail``) naming the option by all its names and saying how
            many times it was given; Typer prints it in its error panel and exits with code 2.
    """
    counts: dict[str, tuple[TyperOption, int]] = {}
    for param in order:
        if (isinstance(param, TyperOption) and not (param.multiple or param.count or param.is_eager)
                and param.name is not None):
            seen = counts.get(param.name)
            counts[param.name] = (param, seen[1] + 1 if seen else 1)
    for param, times in counts.values():
        if times > 1:
            names = " / ".join(f"'{name}'" for name in [*param.opts, *param.secondary_opts])
            ctx.fail(f"Option {names} was given {times} times; give it once.")


class LedgerCommand(TyperCommand):
    """A ``dra-ledger`` command: flags without a type in ``--help``, arguments named as Click names them in the usage
    line (``FILE...``; Typer 0.29 wrote a required one ``{files}...``), an option given twice refused
    (:func:`refuse_repeated_options`)."""

    def make_parser(self, ctx: Context) -> Any:
        """Click's option parser for this command, whose ``parse_args`` also refuses a repeated option.

        The parser is Click's own; only its result is checked, before any value is converted or any command runs.
        """
        parser = super().make_parser(ctx)
        parse = parser.parse_args

        def parse_once(args: list[str]) -> Any:
            opts, rest, order = parse(args=args)
            refuse_repeated_options(ctx, order)
            return opts, rest, order

        # The instance's method is replaced, not the class's: the parser's class lives in Typer's private vendored
        # Click, which this module never imports at run time (see the TYPE_CHECKING import above).
        parser.parse_args = parse_once  # type: ignore[method-assign]  # reason: above
        return parser

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        show_flags_without_a_type(self.get_params(ctx))  # --help itself is made only when first asked for
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Context) -> Any:
        """Run the command, its database sessions named for it (:data:`ledger.store.postgres.SESSION_NAME`).

        A Ctrl-C that reaches here (the command had no message of its own for that moment: while it connects, or
        prints its answer) ends with one line, ``interrupted``, and exit code 130, where Typer alone exited 130
        without a word; a SIGTERM turned into :class:`Terminated` there, with ``terminated (SIGTERM)`` and 143.
        Commands that say more catch them first (``ledger.cli.interrupt_said``).

        Raises:
            typer.Exit: code 130 (143 for SIGTERM), after the line.
        """
        named = SESSION_NAME.set(command_name(ctx))
        try:
            answer = super().invoke(ctx)
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM's Terminated
            word, code = stopped_by(e)
            typer.echo(word, err=True)
            raise typer.Exit(code) from None
        else:
            ANSWERED.set(True)
            return answer
        finally:
            SESSION_NAME.reset(named)  # engines made after the command (a test's, in the same process) are not its

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces.extend([argument_usage(param)] if isinstance(param, TyperArgument) else param.get_usage_pieces(ctx))
        return pieces


class LedgerGroup(TyperGroup):
    """A ``dra-ledger`` command group (the root, ``db``, ``report``): flags without a type in ``--help``, those Typer
    adds after the group is made (``--install-completion``, ``--show-completion``) included."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        show_flags_without_a_type(self.get_params(ctx))
        super().format_help(ctx, formatter)


class LedgerTyper(typer.Typer):
    """A ``typer.Typer`` whose groups are :class:`LedgerGroup` and whose commands are :class:`LedgerCommand`
    unless a ``cls`` is given: ``app.command()`` in ``ledger.cli`` and in the packages registering commands on it
    (``api.cli``, ``workers.cli``, ``workers.jobs_cli``) gets the corrections without naming them."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(cls=settings.pop("cls", LedgerGroup), **settings)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None,
                **settings: Any) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or LedgerCommand, **settings)
