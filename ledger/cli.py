"""The ``dra-ledger`` command line (Typer): database, replay, rebuild, queries and the demo.

Every query command prints a readable table by default and, with ``--output json``, the exact JSON
body the REST API returns. With no ``LEDGER_DATABASE_URL`` the commands start (or reuse) an embedded
PostgreSQL in ``--data-dir`` and keep its schema current; with a URL they check the schema and say
``run dra-ledger db upgrade`` when it is behind.
"""

from __future__ import annotations

import enum
import importlib.metadata
import importlib.resources
import logging
import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import Field, TypeAdapter, ValidationError
from pydantic_settings import BaseSettings, SettingsError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy import QueuePool
from sqlalchemy.exc import OperationalError, ProgrammingError, SQLAlchemyError

import ledger
from ledger import services
from ledger import simulate_bounds as bounds
from ledger.cli_typer import ANSWERED, LedgerTyper, choice_option
from ledger.config import DEFAULT as DEFAULT_CONFIG
from ledger.config import LedgerConfig, check_cluster_name, error_message, load_config
from ledger.errors import STREAM_CONFLICT_HINT, Invalid, LedgerError, StreamConflict, printable
from ledger.interrupts import SIGTERM_EXIT, Terminated, error_chain, interrupt_behind, sigterm_raises, stopped_by
from ledger.projections.queries import rfc3339
from ledger.projections.runner import TRUNCATE_LOCK_PATIENCE_S
from ledger.recorded import LATEST_TIME, SHORTEST_STEP, parse_duration, parse_query_time, seconds_text
from ledger.settings import Settings
from ledger.store import schema
from ledger.store.database import INSUFFICIENT_PRIVILEGE, LOCK_NOT_AVAILABLE, QUERY_CANCELED, LedgerDatabase
from ledger.store.postgres import Analyzed, first_line
from ledger.types import JSONObject, JSONValue

app = LedgerTyper(help="dra-ledger: the system of record for Kubernetes DRA allocations.",
                  no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode="markdown")
db_app = LedgerTyper(help="Database: schema migrations and the embedded PostgreSQL server.",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")

MIN_COLUMNS = 20
"""Narrowest ``COLUMNS`` taken (characters): Rich lays everything out in ``COLUMNS``, and at 0 it printed nothing at all
(a table, its totals) with exit code 0, at 5 a table of empty cells. A value below this, or not a whole number, is
ignored as if unset."""


def columns_setting() -> int | None:
    """``COLUMNS`` as a width in characters when it is a whole number of at least :data:`MIN_COLUMNS`, else ``None``."""
    value = os.environ.get("COLUMNS", "")
    return int(value) if value.isascii() and value.isdigit() and int(value) >= MIN_COLUMNS else None


if "COLUMNS" in os.environ and columns_setting() is None:
    # Rich reads COLUMNS when a console is made (just below): one it cannot use is dropped before then.
    del os.environ["COLUMNS"]
# Status lines are never broken by Rich (soft_wrap): a terminal folds a long line itself, and a log or a pipe
# keeps one message per line, which grep needs.
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
UNWRAPPED_TABLE_WIDTH = 10_000
"""Width (characters) a table is laid out in when stdout is not a terminal and ``COLUMNS`` is unset: Rich would
otherwise fold every cell to fit 80 columns, and a file or a pipe would get one row over several lines."""
DEMO_CLUSTER = "seed-lab"
PROGRESS_MIN_LINES = 5000


class Output(enum.StrEnum):
    """Output format of query commands."""

    table = "table"
    json = "json"


SettingsT = TypeVar("SettingsT", bound=BaseSettings)



def _refuse_blank(text: str, *, option: str, envvar: str, default: str) -> None:
    """Refuse an empty or blank option value (exit code 2), naming ``option``, ``envvar`` and what leaving both out
    gives (``default``). The environment variables themselves are checked by :class:`ledger.settings.Settings`.

    Raises:
        typer.BadParameter: ``text`` is empty or blank.
    """
    if not text.strip():
        raise typer.BadParameter(f"empty; leave the option out (and {envvar} unset) for {default}", param_hint=option)


def path_parser(option: str, envvar: str, default: str) -> Callable[[str], Path]:
    """A Typer ``parser=`` for a path option that refuses a blank text (:func:`_refuse_blank`).

    Read as text, before the path: an empty path is ``.``, the directory the command runs from (``--data-dir ""``
    made a PostgreSQL data directory there; ``--config ""`` read "." as a configuration file).
    """

    def parse(text: str) -> Path:
        _refuse_blank(text, option=option, envvar=envvar, default=default)
        return Path(text)

    return parse


_data_dir = path_parser("--data-dir", "LEDGER_DATA_DIR", "the default data directory")
config_path = path_parser("--config", "LEDGER_CONFIG", "the built-in defaults")
"""The ``parser=`` of every ``--config`` option (``ledger``'s, ``serve``'s, ``watch``'s and ``jobs``')."""


def _database_url(value: str | None) -> str | None:
    """``--database-url`` as given; a blank one is refused (exit code 2): it read as unset, so the command used an
    embedded PostgreSQL instead of the database its caller meant."""
    if value is not None:
        _refuse_blank(value, option="--database-url", envvar="LEDGER_DATABASE_URL", default="an embedded PostgreSQL")
    return value


# Click takes an empty environment variable for an unset one; Settings refuses LEDGER_DATA_DIR="" and
# LEDGER_DATABASE_URL="" when settings_from reads the environment.
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", envvar="LEDGER_DATA_DIR", parser=_data_dir,
                                                 metavar="DIR", help="Embedded PostgreSQL data directory.")]
UrlOpt = Annotated[str | None, typer.Option("--database-url", envvar="LEDGER_DATABASE_URL", callback=_database_url,
                                            help="Ledger database URL; unset = embedded PostgreSQL.")]
def refuse_bad_cluster(*, leaving_out: str, envvar: bool = True) -> Callable[[str | None], str | None]:
    """A Typer callback for ``--cluster`` that refuses, with exit code 2 (a usage error), a name no cluster may have.

    Args:
        leaving_out: what leaving the option out means, ending the message for an empty name ("to ask about every
            cluster").
        envvar: the option also reads ``LEDGER_CLUSTER``: an empty variable is refused too, and the message
            says to leave it unset.

    Returns:
        The callback: it passes a valid name (or ``None``) through unchanged; the rule is
        :func:`ledger.config.check_cluster_name` (1 to 253 characters, no blank at either end, no control character).

    Why: an empty name would key rows or filter on a cluster called "" (queries showed nothing, ``replay``
    silently recorded under ``default``, ``watch`` under ""); the REST API refuses an empty ``cluster=``
    too (``api.parameters``, its guard for every empty query parameter). A padded name (``" lab"``) recorded a
    second cluster beside ``lab``; a query for one is refused too, since no ledger may hold it.
    """
    unset = " (and LEDGER_CLUSTER unset)" if envvar else ""

    def read(value: str | None) -> str | None:
        # Click takes an empty environment variable for an unset one: look at LEDGER_CLUSTER itself.
        if value == "" or (envvar and value is None and os.environ.get("LEDGER_CLUSTER") == ""):
            raise typer.BadParameter(f"empty; leave the option out{unset} {leaving_out}", param_hint="--cluster")
        if value is not None:
            try:
                check_cluster_name(value)
            except Invalid as e:
                raise typer.BadParameter(str(e), param_hint="--cluster") from e
        return value

    return read


def refuse_empty_filter(value: str | None) -> str | None:
    """A Typer callback for a filter option (``--node``, ``--driver``, ``--pool``, ``--device-class``,
    ``--namespace``): an empty value is a usage error (exit code 2), as ``node=`` is a 422 in the REST API.

    Why: ``--node "$NODE"`` with the variable unset filtered on a node called "" and printed an empty fleet
    (``devices 0``), an answer indistinguishable from a real one. A value of blanks alone is refused too: no
    Kubernetes name holds a blank, so it matched nothing just the same.
    """
    if value == "":
        raise typer.BadParameter("empty; leave the option out to keep every one")
    if value is not None and not value.strip():
        raise typer.BadParameter("only blanks, which no name holds; leave the option out to keep every one")
    return value


def _filter_option(help_text: str, *names: str) -> Any:  # what typer.Option returns (Typer types it Any)
    """A filter option's ``typer.Option``: its ``names`` (default: from the parameter), ``help_text``, and an empty
    value refused (:func:`refuse_empty_filter`)."""
    return typer.Option(*names, help=help_text, callback=refuse_empty_filter)


WriteClusterOpt = Annotated[str | None, typer.Option(
    "--cluster", envvar="LEDGER_CLUSTER", callback=refuse_bad_cluster(leaving_out="to record as cluster 'default'"),
    help="Cluster name (default: 'default'); an empty name is refused.")]
"""``--cluster`` of the commands that record: the name every row they write is keyed by."""
ClusterOpt = Annotated[str | None, typer.Option(
    "--cluster", envvar="LEDGER_CLUSTER", callback=refuse_bad_cluster(leaving_out="to ask about every cluster"),
    help="Cluster name (default: every cluster); an empty name is refused.")]
"""``--cluster`` of the queries: answer for this cluster only."""
OutputOpt = Annotated[Output, choice_option(Output, "--output", "-o", help="table or json.")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", envvar="LEDGER_CONFIG", parser=config_path,
                                                metavar="FILE",
                                                help="Configuration file (TOML or YAML); unset = defaults.")]
"""``--config``: the queries read its overrides, mappings, quotas and prices; ``replay`` its ``teams.label``."""
AtOpt = Annotated[str | None, typer.Option("--at", help="Instant T (RFC 3339); default now.")]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"{ledger.DISTRIBUTION} {ledger.version()}")
        raise typer.Exit()


@app.callback()
def _global_options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the installed version and exit.")] = False,
) -> None:
    # Options of `dra-ledger` itself, before any command; --version acts in its callback and exits.
    pass


def _time(value: str | None, option: str) -> datetime:
    if value is None:
        return datetime.now(UTC)
    try:
        return parse_query_time(value)
    except Invalid as e:
        raise typer.BadParameter(str(e), param_hint=option) from e


def _duration(value: str, option: str, *, shortest: timedelta = timedelta(0)) -> timedelta:
    try:
        return parse_duration(value, option, shortest=shortest)
    except Invalid as e:
        raise typer.BadParameter(str(e).removeprefix(f"{option}: "), param_hint=option) from e


def require_embedded_ledger(data_dir: Path | None) -> None:
    """Refuse to use an embedded ledger that was never made: a mistyped ``--data-dir`` must not start a new,
    empty server there and answer with zeros.

    Called, when no database URL is set, by the queries, ``db current``, ``db stop``, ``rebuild`` and ``jobs``; the
    commands meant to make a ledger (``db upgrade``, ``db start``, ``demo``, ``replay``, ``watch``) do not call it.

    Args:
        data_dir: ``--data-dir`` / ``LEDGER_DATA_DIR``; ``None``: the default one (``embedded.default_data_dir``).

    Raises:
        typer.Exit: (code 2) the directory holds no PostgreSQL cluster (no ``PG_VERSION``: initdb never ran
            there, or never finished); the message names it and the commands that record a ledger.
    """
    from ledger.embedded import default_data_dir, initialised

    where = data_dir or default_data_dir()
    if initialised(where):
        return
    me = command_name(sys.argv[0], shutil.which("dra-ledger"))
    hint = " (a mistyped --data-dir?)" if data_dir else ""
    same = f" --data-dir {data_dir}" if data_dir else ""  # the commands record into the directory asked for
    typer.echo(f"error: no ledger in {where}: nothing was recorded there{hint}. Record one with `{me} demo{same}` "
               f"or `{me} replay FILE --cluster NAME{same}`, or name one with --data-dir or --database-url.",
               err=True)
    raise typer.Exit(2)


def read_settings(kind: type[SettingsT]) -> SettingsT:
    """``kind()``: settings read from the environment, a bad variable reported as one line.

    Args:
        kind: a pydantic-settings class (:class:`ledger.settings.Settings`, ``workers.settings.WatchSettings``); its
            ``env_prefix`` names the variables in the message.

    Raises:
        typer.Exit: (code 2) a variable has a bad value; the message names each (``LEDGER_BATCH_SIZE: Input should
            be greater than or equal to 1``) as its check wrote it.
    """
    try:
        return kind()
    except ValidationError as e:
        prefix = str(kind.model_config.get("env_prefix") or "")
        problems = "; ".join(f"{prefix}{str(err['loc'][0]).upper()}: {error_message(err)}" for err in e.errors())
        typer.echo(f"error: bad setting: {problems}", err=True)
        raise typer.Exit(2) from e
    except SettingsError as e:  # a value pydantic-settings cannot even parse (JSON of a list setting)
        typer.echo(f"error: bad setting: {e}", err=True)
        raise typer.Exit(2) from e


def settings_from(url: str | None, data_dir: Path | None) -> Settings:
    """Settings from the environment, overridden by the ``--database-url`` / ``--data-dir`` options.

    Raises:
        typer.Exit: (code 2) an environment variable has a bad value; the message names it.
    """
    base = read_settings(Settings)
    updates: dict[str, object] = {}
    if url:
        updates["database_url"] = url
    if data_dir:
        updates["data_dir"] = data_dir
    settings = base.model_copy(update=updates)
    _refuse_a_data_dir_that_is_no_directory(settings.data_dir if not settings.database_url else None)
    return settings


def _refuse_a_data_dir_that_is_no_directory(data_dir: Path | None) -> None:
    """Refuse a ``--data-dir`` / ``LEDGER_DATA_DIR`` naming something other than a directory (a file, a device).

    Where nothing exists the commands that record make the directory, and the others say no ledger is there
    (:func:`require_embedded_ledger`); a file there was reported as ``cannot read <file>/postmaster.pid: [Errno 20]
    Not a directory``, or with advice to record a ledger into it.

    Raises:
        typer.Exit: (code 2) ``data_dir`` exists and is not a directory; the message names it.
    """
    if data_dir is not None and data_dir.exists() and not data_dir.is_dir():
        typer.echo(f"error: the data directory {data_dir} is not a directory (from --data-dir or LEDGER_DATA_DIR): "
                   "name a directory, new or holding a ledger", err=True)
        raise typer.Exit(2)


def caused_by_ctrl_c(error: BaseException) -> bool:
    """Whether Ctrl-C (or SIGTERM, which :func:`~ledger.interrupts.sigterm_raises` turns into a ``KeyboardInterrupt``)
    is behind ``error``: a ``KeyboardInterrupt`` is ``error`` or in its chain (``__cause__``, else ``__context__``).

    Why: Ctrl-C that stops psycopg while it reads a result or a ``COPY`` can leave the connection unable to run the
    rollback that follows. SQLAlchemy's rollback then raises ``OperationalError`` ("another command is already in
    progress"), which the services report as ``StoreUnavailable``, and the ``KeyboardInterrupt`` is left only as
    that error's context: the command would say the database is unavailable instead of interrupted.
    """
    return interrupt_behind(error) is not None


@contextmanager
def interrupt_said(message: str | Callable[[], str]) -> Iterator[None]:
    """Ctrl-C or SIGTERM inside the block: ``message`` on stderr and exit code 130 (Typer alone exits 130 without a
    word), also when the interrupt surfaced as a database error (:func:`caused_by_ctrl_c`).

    ``message`` is the text, or a function called when the block stops that gives it (what was kept may depend on
    how far the block got: the hour a rollup reached). It starts with "interrupted"; for SIGTERM (a ``kill``, a pod
    or a CI job stopped) that word reads "terminated (SIGTERM)" and the exit code is 143. SIGTERM is a
    ``KeyboardInterrupt`` inside the block (:func:`~ledger.interrupts.sigterm_raises`), so it takes Ctrl-C's way out:
    psycopg cancels the statement that is running and the transaction rolls back at once, releasing its locks, where
    the default action ended the process and left its server session holding them until the server noticed.

    A database or ledger error that no interrupt caused leaves the block with what was kept as a note
    (``stopped`` in place of "interrupted", :func:`reported_errors` writes it under the error): a replay that a
    ``lock_timeout`` or a lost connection stopped keeps its committed batches as one that Ctrl-C stopped does.

    Raises:
        typer.Exit: code 130 (Ctrl-C) or 143 (SIGTERM), after the message.
        LedgerError, SQLAlchemyError: from the block, with the note.
    """
    def kept() -> str:
        return (message if isinstance(message, str) else message()).removeprefix("interrupted")

    with sigterm_raises():
        try:
            yield
        except KeyboardInterrupt as e:
            _say_stopped(kept(), e)
        except (LedgerError, SQLAlchemyError) as e:
            cause = interrupt_behind(e)
            if cause is None:
                e.add_note("stopped" + kept())
                raise
            _say_stopped(kept(), cause)


def _say_stopped(kept: str, cause: KeyboardInterrupt) -> NoReturn:
    word, code = stopped_by(cause)
    err.print(word + kept, soft_wrap=True)
    raise typer.Exit(code) from None


class CtrlCResetFilter(logging.Filter):
    """Drops the connection pool's "Exception during reset or similar" record when Ctrl-C caused the failed reset
    (:func:`caused_by_ctrl_c`): its traceback would bury the command's own "interrupted" line. Installed on the
    pool's logger by :func:`main`; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for a record whose exception Ctrl-C caused, else ``True``."""
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not caused_by_ctrl_c(error)


class IgnoredErrorFilter(logging.Filter):
    """Drops psycopg's "error ignored ..." warnings (``error ignored in rollback of ...``, ``error ignored terminating
    <psycopg.Pipeline ...>``): psycopg logs them when a rollback or a pipeline's end fails while another error is
    already on its way out (the connection was lost), and the command says that error itself, on one line, with
    what was kept; the warning printed before it was noise. So is ``query cancellation interrupted
    (KeyboardInterrupt): closing connection``, logged when a second Ctrl-C (or SIGTERM) cuts short the cancel
    the first one sent: the command says it was interrupted. Installed on the ``psycopg`` logger by :func:`main`;
    every other record passes (a cancellation that failed with an error is still logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for a warning whose message starts "error ignored ", or a cancellation an interrupt cut short,
        else ``True``."""
        if not isinstance(record.msg, str):
            return True
        if record.msg.startswith("query cancellation interrupted "):
            return record.args not in ((KeyboardInterrupt.__name__,), (Terminated.__name__,))
        return not record.msg.startswith("error ignored ")


TABLE_RIGHTS = ("this role lacks a right on the ledger's tables: run the command as the role that owns them (the one "
                "that ran `dra-ledger db upgrade`) or as one granted what SECURITY.md grants; `ledger_reader` may read "
                "only the `reporting` views")
"""The hint for a command refused a right (SQLSTATE 42501) on the ledger's tables."""
DDL_RIGHTS = "run `dra-ledger db upgrade` as the database owner"
"""The hint for ``db upgrade`` refused a right: the schema's DDL needs the owner."""


@contextmanager
def reported_errors(*, rights: str = TABLE_RIGHTS) -> Iterator[None]:
    """Turn the errors a command may meet into one line on stderr and exit code 2, never a traceback.

    ``LedgerError``: its message; ``OperationalError`` (unreachable server, bad credentials, missing database):
    ``database unavailable: <first line>``; ``ProgrammingError`` (refused SQL): ``the database refused: ...``,
    with the hint ``rights`` when the role lacks a right (SQLSTATE 42501); a statement the server cancelled (a
    ``statement_timeout`` or ``lock_timeout``, SQLSTATE 57014 or 55P03, however the services reported it):
    ``the database cancelled a statement: ...`` with what to do (:data:`TIMEOUTS`).

    An error that Ctrl-C caused (:func:`caused_by_ctrl_c`) is raised again as ``KeyboardInterrupt`` (one SIGTERM
    caused, as :class:`~ledger.interrupts.Terminated`): the command's own handler, or
    :class:`~ledger.cli_typer.LedgerCommand`, deals with it as with any Ctrl-C (or SIGTERM). The notes of the
    error and of the errors in its chain (what a command kept, :func:`interrupt_said`) follow its line, one a line.

    Raises:
        typer.Exit: code 2, after the line is written.
        KeyboardInterrupt: see above.
    """
    try:
        yield
    except (LedgerError, SQLAlchemyError) as e:
        if (interrupt := interrupt_behind(e)) is not None:
            raise type(interrupt)() from e  # Terminated stays Terminated: its exit code is 143
        state, refused = _sqlstate_behind(e) or ("", e)
        if state in TIMEOUTS:
            # Before the LedgerError branch: the services report a cancelled statement as "database unavailable".
            line = f"the database cancelled a statement: {first_line(refused)} ({TIMEOUTS[state]})"
        elif isinstance(e, StreamConflict):
            # Retried already (services.CONFLICT_RETRIES, each after loading the state again): either another writer
            # keeps moving the stream, or the stored entry lags it for good.
            line = f"{e}: another writer appended to it first at every attempt; {STREAM_CONFLICT_HINT}, then this " \
                   "command again"
        elif isinstance(e, LedgerError):
            line = str(e)
        elif isinstance(e, OperationalError):
            # Unreachable server, bad credentials, database missing: say so without a traceback, in the words the
            # services use for the same cause (StoreUnavailable), whichever layer met it.
            line = f"database unavailable: {first_line(e)}"
        elif isinstance(e, ProgrammingError):
            # Refused SQL, e.g. `permission denied for schema public` when `db upgrade` lacks DDL rights.
            hint = f" ({rights})" if state == INSUFFICIENT_PRIVILEGE else ""
            line = f"the database refused: {first_line(e)}{hint}"
        else:
            raise
        # The notes of every error in the chain: the services may raise a new error from the one a note was added to
        # (unavailable_as_error). A note is written once, however many links carry it.
        notes = dict.fromkeys(note for link in error_chain(e) for note in getattr(link, "__notes__", ()))
        typer.echo("\n".join([f"error: {line}", *notes]), err=True)
        raise typer.Exit(2) from e


TIMEOUTS: Mapping[str, str] = {
    QUERY_CANCELED: "PostgreSQL cancelled it: a `statement_timeout` of the server, the database or this role, or an "
             "administrator; for a timeout, run the command with PGOPTIONS='-c statement_timeout=0' in its "
             "environment, or raise the role's with `ALTER ROLE ... SET statement_timeout = ...`",
    LOCK_NOT_AVAILABLE: "a lock it needed was not granted within the `lock_timeout` of the server, the database or "
                        "this role; another session holds it (`pg_locks`), or run the command with "
                        "PGOPTIONS='-c lock_timeout=0' in its environment to wait for it",
}
"""SQLSTATE -> hint, for a statement PostgreSQL cancelled (``query_canceled``, ``lock_not_available``): not a
lost connection, though psycopg raises both as ``OperationalError``. Ctrl-C's own cancel is told apart first."""


def _sqlstate_behind(error: BaseException) -> tuple[str, BaseException] | None:
    """The SQLSTATE of the server's error that is ``error`` or in its chain (psycopg's errors carry it as
    ``sqlstate``), with that error; ``None`` when no link carries one (a refused connection, say)."""
    for link in error_chain(error):
        state = getattr(link, "sqlstate", None)
        if isinstance(state, str):
            return state, link
    return None


@contextmanager
def progress_bar(label: str, *, min_total: int) -> Iterator[Callable[[int, int], None]]:
    """A progress bar on stderr for long work whose size may be known only once it has begun.

    Yields ``update(done, total)``: the first call whose ``total`` is at least ``min_total`` starts the bar,
    when stderr is a terminal (nothing is drawn for short work); later calls move it to ``done`` of ``total``.
    The bar stops when the block ends, however it ends. When stderr is not a terminal (a log file, a Job's
    output) a line ``<label>: <done> of <total>`` is written each tenth of the way instead, for work of at
    least :data:`PLAIN_PROGRESS_FACTOR` times ``min_total``: a long replay in a pipeline is not silent.
    """
    bar: Progress | None = None
    task: TaskID | None = None
    tenths_said = 0

    def update(done: int, total: int) -> None:
        nonlocal bar, task, tenths_said
        if not err.is_terminal:
            if total >= PLAIN_PROGRESS_FACTOR * min_total and (tenths := done * 10 // total) > tenths_said:
                tenths_said = tenths
                err.print(f"{label}: {done:,} of {total:,}", soft_wrap=True)
            return
        if bar is None:
            if total < min_total:
                return
            bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err)
            bar.start()
            task = bar.add_task(label, total=total)
        assert task is not None
        bar.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


PLAIN_PROGRESS_FACTOR = 10
"""Work this many times a bar's ``min_total`` or more reports its progress in lines when stderr is no terminal."""


@contextmanager
def _progress(total: int | None, label: str) -> Iterator[Callable[[int], None] | None]:
    if total is None or total < PROGRESS_MIN_LINES:
        yield None
        return
    with progress_bar(label, min_total=PROGRESS_MIN_LINES) as update:
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done += n
            update(min(done, total), total)  # a catch-up also applies events appended after it began

        update(0, total)
        yield advance


CATCH_UP_LABEL = "events applied"
"""Label of the progress bar (or, off a terminal, of the lines) of a catch-up of :data:`PROGRESS_MIN_LINES` events
or more."""


def catch_up_read_models(db: LedgerDatabase, *, when: str) -> None:
    """Catch the read models up (after a replay, before ``serve`` listens), saying so on stderr when there are
    :data:`PROGRESS_MIN_LINES` events or more to apply (a large backlog takes seconds to minutes, with nothing else
    to show), with a progress bar on a terminal, and what the statistics refresh that follows a bulk catch-up did
    (:func:`ledger.services.catch_up`).

    Ctrl-C, SIGTERM or a database error says what was kept (:func:`interrupt_said`), for the step it stopped in:
    applying events (the batches applied stay, with their checkpoints) or, once every event is applied, the
    statistics refresh (tables not analyzed are left to autovacuum). ``when`` places the step in the command
    ("after every line was recorded", "before the server listened").

    Raises:
        typer.Exit: code 130 or 143, after the message.
        LedgerError: as :func:`ledger.services.catch_up`, with what was kept as a note.
    """
    analyzed: list[tuple[Analyzed, float]] = []  # said after the read models' line, which it follows
    caught_up = False

    def analyzing() -> None:
        nonlocal caught_up
        caught_up = True

    def kept() -> str:
        if caught_up:
            return f"interrupted {when}, with the read models caught up: tables not analyzed yet are left to autovacuum"
        return (f"interrupted {when}, while applying events to the read models: the batches applied so far are kept "
                "with their checkpoints; the next command that reads them, or a running `serve`, applies the rest")

    # From the first query: reading the checkpoints may wait for a lock too (and meet a lock_timeout, or Ctrl-C).
    with interrupt_said(kept):
        lag = services.events_to_apply(db)
        if lag >= PROGRESS_MIN_LINES:
            err.print(f"read models: applying {lag:,} events ...")
        started = time.monotonic()
        with _progress(lag, CATCH_UP_LABEL) as progress:
            applied = services.catch_up(db, progress=progress,
                                        built=_table_built() if lag >= PROGRESS_MIN_LINES else None,
                                        statistics=lambda done, seconds: analyzed.append((done, seconds)),
                                        analyzing=analyzing)
    if lag >= PROGRESS_MIN_LINES:
        applying = time.monotonic() - started - sum(seconds for _, seconds in analyzed)
        err.print(f"read models: {applied:,} events applied in {applying:.1f} s")
    for done, seconds in analyzed:
        _say_statistics(done, seconds)


def _table_built() -> Callable[[str], None]:
    """A ``built`` callback (:func:`ledger.services.rebuild`) that says on stderr each read-model table a build from
    the whole history has written, with the seconds since this call: a long build's steps (the tables are filled
    by single statements and a fold, so its events cannot be counted as it goes)."""
    started = time.monotonic()

    def say(table: str) -> None:
        err.print(f"read models: {table} built (at {time.monotonic() - started:.1f} s)", soft_wrap=True)

    return say


def _say_waiting(seconds: float) -> None:
    """Say on stderr that a rebuild waits for other sessions (dashboards, long queries) to let go of the read models
    (:func:`ledger.services.rebuild`'s ``waiting``)."""
    err.print(f"read models: waiting for other sessions to let go of them ({seconds:.0f} s so far; after "
              f"{TRUNCATE_LOCK_PATIENCE_S:g} s the rebuild waits in line for them)", soft_wrap=True)


def _say_statistics(done: Analyzed, seconds: float) -> None:
    """Say on stderr what :func:`ledger.services.refresh_statistics` did, each failed table as a warning (the load
    it follows stays committed either way)."""
    if done.unavailable is not None:
        err.print(f"warning: statistics left to autovacuum: {done.unavailable}")
    if done.analyzed:
        noun = "table" if len(done.analyzed) == 1 else "tables"
        err.print(f"statistics: {len(done.analyzed)} {noun} analyzed for the query planner in {seconds:.1f} s")
    if done.skipped:
        err.print(f"statistics: this role may not analyze {len(done.skipped)} of the ledger's tables (it owns neither "
                  "them nor the database; from PostgreSQL 17 a MAINTAIN grant lets it); autovacuum will, in time")
    for table, reason in done.failed:
        err.print(f"warning: statistics of table {table} left to autovacuum: ANALYZE failed: {reason}")


def _emit(body: JSONObject, output: Output, render: Callable[[JSONObject], None]) -> None:
    if output is Output.json:
        sys.stdout.write(services.dumps(body) + "\n")
    else:
        render(body)


# --- db ------------------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Migrate the ledger schema to the newest revision (the only step that needs DDL rights)."""
    settings = settings_from(url, data_dir)
    with reported_errors(rights=DDL_RIGHTS):
        if settings.database_url:
            db = LedgerDatabase.from_url(settings.database_url)
            db.upgrade()
        else:
            db = services.open_ledger(settings)
        out.print(f"schema at revision {schema.current_revision(db.engine)}")


@db_app.command("current")
def db_current(url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Print the schema revision of the database and the one this code needs; exit 1 when they differ.

    An embedded data dir where no ledger was ever made is refused (exit code 2):
    a check must not initdb and migrate a new cluster and then report it current.
    """
    settings = settings_from(url, data_dir)
    if not settings.database_url:
        require_embedded_ledger(settings.data_dir)
    with reported_errors():
        db = LedgerDatabase.from_url(settings.database_url) if settings.database_url else services.open_ledger(settings)
        current, head = schema.current_revision(db.engine), schema.head_revision()
        out.print(f"database: {current or 'empty'}; code: {head}")
    if current != head:
        # Scripts (a deployment's pre-start check) read the exit status, as with `alembic check`.
        typer.echo("the schema is not the one this code needs: run `dra-ledger db upgrade` (with a newer "
                   "release if the database's revision is unknown to this one)", err=True)
        raise typer.Exit(1)


@db_app.command("repair-state")
def db_repair_state(cluster: ClusterOpt = None, url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Rebuild, from their events, translator state entries left behind their streams.

    Release 0.3.0 could leave such an entry (a standby taking the Lease while the former leader's write was still to
    commit); every later event of that object was then refused as a StreamConflict. Entries of claims, pods,
    namespaces, DeviceClasses and DeviceTaintRules are rebuilt. Safe while workers run (it takes the append lock); a
    second run finds nothing. Exit 1 when pool entries are behind (named, left as they are), else 0.
    """
    settings = settings_from(url, data_dir)
    if not settings.database_url:
        require_embedded_ledger(settings.data_dir)
    with reported_errors():
        db = services.open_ledger(settings)
        if cluster is not None and not services.has_events(db, cluster):
            typer.echo(f"nothing is recorded under cluster {cluster!r}: no translator state to repair", err=True)
            return
        repairs = services.repair_state(db, cluster=cluster)
    left = 0
    for repair in repairs:
        for entry in repair.repaired:
            out.print(f"{repair.cluster}: {entry.key}: entry at stream position {entry.position}, stream at "
                      f"{entry.head}: rebuilt from its events", highlight=False)
        for entry in repair.left:
            left += 1
            out.print(f"{repair.cluster}: {entry.key}: entry at stream position {entry.position}, stream at "
                      f"{entry.head}: a pool's entry, left as it is (its next events are refused)",
                      highlight=False)
        if not repair.repaired and not repair.left:
            out.print(f"{repair.cluster}: no entry behind its stream", highlight=False)
    if not repairs:
        out.print("no cluster recorded yet: no translator state to repair", highlight=False)
    if left:
        typer.echo(f"pool entries behind their streams, left as they are: {left} (nothing here rebuilds them)",
                   err=True)
        raise typer.Exit(1)


def _refuse_with_url(url: str | None) -> None:
    if url:
        typer.echo("error: LEDGER_DATABASE_URL (or --database-url) is set, so the embedded server is not in use; "
                   "unset it to manage the embedded server", err=True)
        raise typer.Exit(2)


EMBEDDED_TRUST = ("the embedded server trusts every connection from 127.0.0.1 (any local user can connect as "
                  "superuser postgres, no password): for demos and single-user machines; in production set "
                  "LEDGER_DATABASE_URL to a PostgreSQL of your own (SECURITY.md)")
"""Said on stderr wherever a command hands out the embedded server's URL."""


def _libpq_hint(db: LedgerDatabase) -> str:
    """The line that gives ``psql`` and Grafana the embedded ledger's URL in the form libpq reads."""
    return f"for psql and Grafana (libpq form): {db.libpq_url}"


@db_app.command("start")
def db_start(data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Start (or reuse) the embedded PostgreSQL, migrate its ledger database, and print that database's URL.

    Stdout is the URL alone (``export LEDGER_DATABASE_URL=$(dra-ledger db start)``); stderr adds the libpq form
    that ``psql`` and Grafana take, and that the server trusts local connections.
    """
    _refuse_with_url(url)
    with reported_errors():
        db = services.open_ledger(settings_from(None, data_dir))
        typer.echo(db.url)
        typer.echo(_libpq_hint(db), err=True)
        typer.echo(EMBEDDED_TRUST, err=True)


@db_app.command("stop")
def db_stop(data_dir: DataDirOpt = None, url: UrlOpt = None) -> None:
    """Stop the embedded PostgreSQL cleanly (a fast shutdown: connections are closed)."""
    from ledger.embedded import EmbeddedPostgres, default_data_dir

    _refuse_with_url(url)
    # Read like every command's settings, so that an empty LEDGER_DATA_DIR or LEDGER_DATABASE_URL is refused here
    # too: Click takes an empty variable for an unset one, and this stopped the default server instead.
    data_dir = settings_from(None, data_dir).data_dir
    require_embedded_ledger(data_dir)  # "not running" for a mistyped --data-dir hid the mistake
    with reported_errors():
        server = EmbeddedPostgres(data_dir or default_data_dir())
        if server.is_running():
            server.stop()
            out.print("stopped")
        else:
            out.print("not running")


# --- write side ----------------------------------------------------------------------------------


def _count_lines(paths: list[Path]) -> int | None:
    """Lines of ``paths`` in all, for a progress bar; ``None`` (no bar) when one is not a regular file.

    A pipe, a FIFO or ``/dev/stdin`` can be read once only: counting its lines first left nothing for the replay,
    which recorded 0 lines and exited 0 (a FIFO made it wait for a second writer).
    """
    if not all(stat.S_ISREG(path.stat().st_mode) for path in paths):
        return None
    total = 0
    for path in paths:
        with path.open("rb") as fh:
            total += sum(1 for _ in fh)
    return total


def summarise_report(report: services.IngestReport) -> str:
    """The one-line summary of an ingest that ``replay`` and ``demo`` print last.

    ``recorded``, ``already recorded`` and ``rejected`` are counts of lines. A line an earlier run stored as
    rejected counts both as already recorded and as rejected (:class:`ledger.services.IngestReport`), so the
    three can add up to more than the lines read; the rejected count then says how many of its lines were
    already recorded, e.g. ``40 lines: 0 recorded, 40 already recorded, 1 rejected (already recorded as
    rejected, so also among the 40 already recorded); 0 events appended``.

    Args:
        report: what :func:`ledger.services.replay_files` returned.

    Returns:
        The line, without a line end.
    """
    rejected = len(report.rejected)
    earlier = sum(1 for r in report.rejected if r.already_recorded)
    if earlier == 0:
        note = ""
    else:
        which = "" if earlier == rejected else f"{earlier:,} of them "
        note = f" ({which}already recorded as rejected, so also among the {report.duplicates:,} already recorded)"
    lines = f"{report.lines:,} line{'' if report.lines == 1 else 's'}"
    return (f"{lines}: {report.recorded:,} recorded, {report.duplicates:,} already recorded, "
            f"{rejected:,} rejected{note}; {report.events:,} events appended")


def _print_report(report: services.IngestReport) -> None:
    # Plain, unwrapped lines: one rejection per line, greppable by FILE:LINE.
    for rejection in report.rejected:
        typer.echo(f"rejected {rejection.origin}: {rejection.reason}", err=True)  # reasons come escaped (Rejection)
    typer.echo(summarise_report(report), err=True)
    if report.went_back:
        lines = f"{report.went_back:,} line{'' if report.went_back == 1 else 's'}"
        them = "it" if report.went_back == 1 else "them"
        typer.echo(f"warning: {lines} received (observedAt) before a line read ahead of {them}, "
                   f"up to {seconds_text(report.went_back_most)} s back: a file out of order, or files given out of "
                   "order? Lines are translated in the order read and releases are dated when received, so a release "
                   "received before the allocation it ends bills nothing", err=True)


@app.command()
def replay(
    files: Annotated[list[Path], typer.Argument(exists=True, dir_okay=False, readable=True, metavar="FILE...",
                                                help="Recorded histories, kubectl watch output or Lists.")],
    at: Annotated[str | None, typer.Option("--at", help="Receive time for Lists without one (RFC 3339).")] = None,
    cluster: WriteClusterOpt = None, url: UrlOpt = None, data_dir: DataDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Replay recorded watch histories into the ledger (idempotent); exit 1 if any line was rejected."""
    settings = settings_from(url, data_dir)
    when = _time(at, "--at") if at else None
    with reported_errors():
        translator = services.translator_settings(settings, load_config(config), config_path=config)
        db = services.open_ledger(settings)
        # Held from the first line to the end of the catch-up: a query meanwhile answers from the read models as
        # they stand (and says so) rather than applying this replay's events beside it.
        with services.applying(db):
            # Every committed batch stays; the run that follows skips it by digest.
            with interrupt_said("interrupted: the batches committed so far are kept; run the same command again to "
                                "record the rest (lines already recorded are skipped)"), \
                    _progress(_count_lines(files), "replay lines") as progress:
                report = services.replay_files(
                    db, files, cluster=cluster or settings.cluster, at=when,
                    settings=translator, batch_size=settings.batch_size,
                    progress=progress, catch_up=False)
            catch_up_read_models(db, when="after every line was recorded")
    _print_report(report)
    if report.rejected:
        raise typer.Exit(1)


@app.command()
def rebuild(url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Rebuild every read model from the events (global position 0) and swap it in atomically.

    An embedded data dir where no ledger was ever made is refused (exit code 2):
    there are no events to rebuild from, and a new, empty server would be left behind.
    Ctrl-C (exit code 130) or SIGTERM (143) during the rebuild rolls it back and says so.
    """
    settings = settings_from(url, data_dir)
    if not settings.database_url:
        require_embedded_ledger(settings.data_dir)
    # SIGTERM (kill, a Job's deadline) ends it as Ctrl-C does, with its own word and exit code 143: before the
    # rebuild starts, "terminated (SIGTERM)" (LedgerCommand); inside, what was kept (interrupt_said).
    with reported_errors(), sigterm_raises():
        db = services.open_ledger(settings)
        err.print(f"rebuilding the read models from the events ({services.count_events(db):,}) ...")
        # One transaction: Ctrl-C rolls all of it back.
        with interrupt_said("interrupted: the rebuild rolled back; the read models are as they were"):
            applied = services.rebuild(db, built=_table_built(), waiting=_say_waiting, occupancy_counts=False)
        err.print(f"rebuilt read models from {applied:,} events; computing the occupancy counts ...")
        with interrupt_said("interrupted after the rebuild committed: the occupancy counts not computed yet are "
                            "computed by the jobs (`dra-ledger jobs`, or `watch` without --no-jobs); occupancy "
                            "totals meanwhile come from the intervals"):
            written = services.refresh_occupancy_counts(db)
        # None written: every cluster was covered already (a rebuild beside this one computed them) or none exists.
        err.print(f"occupancy counts: {sum(written.values()):,} rows over {len(written)} cluster(s)" if written
                  else "occupancy counts: none left to compute (already current)")
        with interrupt_said("interrupted after the rebuild and the occupancy counts committed: tables not analyzed "
                            "yet are left to autovacuum"):
            services.refresh_statistics(db, told=_say_statistics)


def output_path(text: str) -> Path:
    """A Typer ``parser=`` for a file to write (``simulate --output``, ``record --output``): the path as given.

    Raises:
        typer.BadParameter: ``text`` is empty or blank (exit code 2). ``Path("")`` is ``.``, the current
            directory, so an empty value (an unset shell variable, ``--output "$OUT"``) read as "cannot write .: it
            is a directory" instead of naming the mistake.
    """
    if not text.strip():
        raise typer.BadParameter("is empty; give the file to write")
    return Path(text)


def finite_float(*, ge: float | None = None, gt: float | None = None,
                 le: float | None = None) -> Callable[[str], float]:
    """A Typer ``parser=`` for a float option: a finite number in ``[ge, le]`` (``(gt, le]`` with ``gt``).

    pydantic reads the text (``Annotated[float, Field(ge=..., le=..., allow_inf_nan=False)]``). Typer's own
    ``min=``/``max=`` let ``inf`` through where there is no ``max``, and refuse ``nan`` with a misleading
    "greater than or equal" message (every comparison with NaN is false); here NaN and infinities are
    refused as "Input should be a finite number" (exit code 2, as any bad option value).

    Args:
        ge: the smallest value accepted (inclusive), in the option's own unit; ``None`` for none.
        gt: a value every accepted one is above (exclusive; a duration above 0, say), or ``None``.
        le: the largest value accepted (inclusive), or ``None`` for no upper bound.

    Returns:
        A function from the option's text to its value; it raises ``pydantic.ValidationError``, which
        Typer reports as an invalid value for the option.
    """
    adapter: TypeAdapter[float] = TypeAdapter(Annotated[float, Field(ge=ge, gt=gt, le=le, allow_inf_nan=False)])
    return adapter.validate_python


@app.command()
def simulate(
    output_file: Annotated[Path, typer.Option(
        "--output", parser=output_path, help="History file to write (JSON Lines in the recorded format that "
        "replay reads: one {observedAt, type, object} per line).")],
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=bounds.MAX_NODES, help="Nodes in the fleet.")] = 10,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1, max=bounds.MAX_GPUS_PER_NODE,
                                               help="Whole GPUs per node.")] = 8,
    hours: Annotated[float, typer.Option("--hours", parser=finite_float(ge=0.01, le=bounds.MAX_HOURS),
                                         help=f"Simulated hours, 0.01 to {bounds.MAX_HOURS:g}.")] = 24.0,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same file.")] = 0,
    utilisation: Annotated[float, typer.Option("--utilisation", parser=finite_float(ge=0, le=1),
                                               help="Target fraction of GPUs held, 0 to 1.")] = 0.7,
    job_minutes: Annotated[float, typer.Option("--job-minutes", parser=finite_float(ge=1, le=bounds.MAX_JOB_MINUTES),
                                               help=f"Mean hold time (min), 1 to {bounds.MAX_JOB_MINUTES:g}.")] = 60.0,
    mig_node_fraction: Annotated[float, typer.Option("--mig-node-fraction", parser=finite_float(ge=0, le=1),
                                                     help="Fraction of nodes whose GPUs also offer MIG "
                                                     "partitions, 0 to 1.")] = 0.1,
    teams: Annotated[int, typer.Option("--teams", min=1, max=bounds.MAX_TEAMS,
                                       help="Teams (2 namespaces each).")] = 6,
    start: Annotated[str, typer.Option("--start", help="Start instant (RFC 3339); the history must end, 13 s "
                                       f"past --hours at most, by the end of year {LATEST_TIME.year} (UTC).")]
    = "2026-11-01T00:00:00Z",
) -> None:
    """Write a deterministic simulated fleet history (what it holds: the README, "Benchmarks and the fleet simulator").

    The file appears only once complete (written beside it, then renamed): an earlier file of that name
    survives a failure, Ctrl-C (exit code 130) or SIGTERM (exit code 143), and the partial file is removed.
    Progress goes to stderr every 100,000 lines.
    """
    from ledger import simulate as simulation

    spec = simulation.FleetSpec(nodes=nodes, gpus_per_node=gpus_per_node, hours=hours, seed=seed,
                                utilisation=utilisation, job_minutes=job_minutes,
                                mig_node_fraction=mig_node_fraction, teams=teams, start=_time(start, "--start"))
    try:
        simulation.check_spec(spec)  # what the options cannot bound alone, said before "simulating ..."
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    typer.echo(f"simulating {nodes:,} nodes x {gpus_per_node} GPUs for {hours:g} h into {output_file} ...",
               err=True)
    try:
        with sigterm_raises():
            summary = simulation.write_history(spec, output_file,
                                               progress=lambda n: err.print(f"... {n:,} lines", highlight=False))
    except Terminated:  # before KeyboardInterrupt, which it is
        # The same clean-up as Ctrl-C: write_history removed its temporary file on the way out.
        typer.echo(f"terminated (SIGTERM): {output_file} left as it was", err=True)
        raise typer.Exit(SIGTERM_EXIT) from None
    except KeyboardInterrupt:
        # write_history has removed its temporary file by now; the earlier FILE was never touched.
        typer.echo(f"interrupted: {output_file} left as it was", err=True)
        raise typer.Exit(130) from None
    except OSError as e:
        typer.echo(f"error: cannot write {output_file}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from e
    err.print(f"wrote {summary.lines} lines to {output_file}: {summary.devices} devices, {summary.claims} claims, "
              f"{summary.allocations} device allocations")
    out.print(services.dumps(summary.to_json()))


# --- queries -------------------------------------------------------------------------------------


def _cell(value: str | list[str]) -> Text:
    """A table cell exactly as the data spells it: never read as Rich markup (a value ``[bold]x[/bold]`` stays
    those characters), control characters escaped, newlines too (:func:`printable`: a team label ``a\nb`` from
    the cluster showed as two lines, like a row that was never there). A list is one value a line."""
    lines = value if isinstance(value, list) else [value]
    return Text("\n").join(Text(printable(line)) for line in lines)


def _table(title: str, columns: list[str], rows: Sequence[Sequence[str | list[str]]]) -> None:
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(value) for value in row))
    width = table_width(out)
    # Console.print never lays out wider than its console, so a wider layout needs a console of that width.
    (out if width is None else Console(file=out.file, width=width, soft_wrap=True)).print(table)


def _heading(title: str) -> None:
    """``title`` between two short rules on one line. Not a Rich rule: a rule is as wide as the console (80
    columns in a file, a pipe or a common terminal), and Rich cut a longer title, the end of the demo's span."""
    out.print(f"── {title} ──", highlight=False)


def table_width(console: Console) -> int | None:
    """Width in characters to lay a table out in on ``console``: ``COLUMNS`` where it is usable
    (:func:`columns_setting`); else ``None`` (Rich's own choice, the terminal's width) on a terminal, and
    :data:`UNWRAPPED_TABLE_WIDTH` elsewhere, so that each row is one line in a file, a pipe or a CI log."""
    if (given := columns_setting()) is not None:
        return given
    return None if console.is_terminal else UNWRAPPED_TABLE_WIDTH


def _s(value: JSONValue) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(_s(v) for v in value) or "-"
    return str(value)


class _ClusterLead:
    """The optional leading ``cluster`` column of a table whose rows each carry a ``cluster`` field.

    Queries answer for every cluster unless ``--cluster`` is given, so rows of same-named devices or claims
    from two clusters would print as identical lines; when the rows name more than one cluster, each row
    starts with its cluster (as ``cluster`` leads the JSON rows and the CSV). Rows of one cluster (every
    ``--cluster`` query, every single-cluster ledger) print without it.
    """

    def __init__(self, rows: Sequence[JSONValue]) -> None:
        several = len({_s(r["cluster"]) for r in rows if isinstance(r, dict)}) > 1
        self.columns: list[str] = ["cluster"] if several else []
        """The header to put first: ``["cluster"]`` or nothing."""

    def __call__(self, row: Mapping[str, JSONValue]) -> list[str]:
        """The cells to put first in ``row``'s line: its cluster, or nothing."""
        return [_s(row["cluster"])] if self.columns else []


def render_occupancy(body: JSONObject) -> None:
    """Print an occupancy body as a table of devices and holders, then the totals. A device held after leaving its
    ResourceSlice says ``(off-slice)``, one whose counter set is allocated past its hardware ``(counter set
    over-committed)``, and each of two allocations of one device (a double booking) ``[conflict]``. A device with no
    allocation is ``free``, or ``(counters held by gpu-0)`` when allocated devices of its counter set leave too
    little for it (a MIG partition of a GPU allocated whole); one held by ``adminAccess`` alone carries that mark
    after its name.

    A ``cluster`` column comes first when the devices come from more than one cluster (see
    :class:`_ClusterLead`).
    """
    rows: list[list[str]] = []
    devices = body["devices"]
    assert isinstance(devices, list)
    lead = _ClusterLead(devices)
    for dev in devices:
        assert isinstance(dev, dict)
        allocs = dev["allocations"]
        assert isinstance(allocs, list)
        held_by = dev.get("counterSetHeldBy")
        counters_held = f"(counters held by {', '.join(map(str, held_by))})" if isinstance(held_by, list) and held_by \
            else ""
        name = (f"{dev['pool']}/{dev['device']}" + (" (off-slice)" if dev["offSlice"] else "")
                + (" (counter set over-committed)" if dev.get("counterSetConflict") else "")
                + (f" {counters_held}" if counters_held and allocs else ""))  # held by adminAccess alone
        if not allocs:
            rows.append([*lead(dev), name, _s(dev["node"]), counters_held or "free", "", "", ""])
        for a in allocs:
            assert isinstance(a, dict)
            holder = (f"{a['namespace']}/{a['claim']}" + (" [adminAccess]" if a["adminAccess"] else "")
                      + (" [conflict]" if a.get("conflict") else ""))
            rows.append([*lead(dev), name, _s(dev["node"]), holder, _s(a["team"]), _s(a["shareID"]),
                         _s(a["consumers"])])
    _table(f"Occupancy at {body['at']}",
           [*lead.columns, "pool/device", "node", "held by", "team", "shareID", "consumers"], rows)
    totals = body["totals"]
    assert isinstance(totals, dict)
    out.print("devices {devices}, allocated {allocated}, free {free}, shared {shared}".format(**totals))


def render_claims(body: JSONObject) -> None:
    """Print a claims body as a table; a ``cluster`` column comes first when the claims come from more than
    one cluster (see :class:`_ClusterLead`)."""
    rows: list[list[str]] = []
    claims = body["claims"]
    assert isinstance(claims, list)
    lead = _ClusterLead(claims)
    for c in claims:
        assert isinstance(c, dict)
        requested = c["requested"]
        assert isinstance(requested, dict)
        devices = c["devices"]
        assert isinstance(devices, list)
        rows.append([*lead(c), f"{c['namespace']}/{c['name']}", _s(c["state"]), _s(c["origin"]), _s(c["team"]),
                     ", ".join(f"{k}: {v}" for k, v in requested.items()) or "-",
                     ", ".join(str(d["device"]) for d in devices if isinstance(d, dict)) or "-",
                     _s(c["consumers"])])
    _table(f"Claims at {body['at']}",
           [*lead.columns, "claim", "state", "origin", "team", "requested", "devices", "consumers"], rows)


def render_usage(body: JSONObject) -> None:
    """Print a usage body as a table of device-hours.

    A stepped body (``step`` in seconds, each row with its bucket's ``start`` / ``end``) gets the bucket as
    the first two columns, rows in the body's order (bucket, then group), and the step in the title. When a
    price table priced any row (rows with ``cost`` and ``currency``), a last ``cost`` column gives it to two
    decimals with its currency (``-`` for a row no price applies to), as the JSON and CSV carry it.
    """
    key = str(body["groupBy"])
    rows_in = body["rows"]
    assert isinstance(rows_in, list)
    records = [r for r in rows_in if isinstance(r, dict)]
    step = body.get("step")
    bucket = ["start", "end"] if isinstance(step, int | float) else []
    groups = [key] if key != "deviceClass" else []  # grouped by class: the class column says it once
    priced = any("cost" in r for r in records)
    columns = [*bucket, *groups, "deviceClass", "driver", "device-hours", *(["cost"] if priced else [])]
    rows = [[*(_s(r[c]) for c in [*bucket, *groups, "deviceClass", "driver"]), f"{r['deviceHours']:.3f}",
             *([_cost(r)] if priced else [])]
            for r in records]
    title = f"Device-hours from {body['from']} to {body['to']}"
    if isinstance(step, int | float):
        # ISO 8601 as the option takes it (PT1H), written by pydantic, which also parses it.
        title += f" in steps of {TypeAdapter(timedelta).dump_python(timedelta(seconds=step), mode='json')}"
    _table(title, columns, rows)


def _cost(row: JSONObject) -> str:
    """A usage row's ``cost`` to two decimals with its ``currency`` (``12.50 USD``), or ``-`` when unpriced."""
    cost = row.get("cost")
    return f"{cost:.2f} {_s(row.get('currency'))}" if isinstance(cost, int | float) else "-"


def render_idle(body: JSONObject) -> None:
    """Print an idle-claims body (``idle-claims``, ``report idle-claims``) as a table, one row per claim in the
    body's order.

    When the rows come from more than one ledger cluster (a report over every cluster), a ``cluster`` column
    comes first, as ``cluster`` leads the CSV: same-named claims of two clusters would otherwise print as
    identical rows. Rows of one cluster (every ``--cluster`` report) print as before, without it.
    """
    claims_in = body["claims"]
    assert isinstance(claims_in, list)
    claims = [c for c in claims_in if isinstance(c, dict)]
    lead = _ClusterLead(claims)
    rows = [[*lead(c), f"{c['namespace']}/{c['name']}", _s(c["team"]),
             _s(c["category"]), _s(c["idleSince"]), _s(c["devices"]), f"{c['wastedDeviceHours']:.3f}"]
            for c in claims]
    _table(f"Idle claims at {body['at']}", [*lead.columns, "claim", "team", "category",
                                            "idle since", "devices", "wasted device-hours"], rows)


def _whole_page(body: JSONObject) -> JSONObject:
    """``body`` as the REST API's last page of the same query: every row, and ``"nextPageToken": null``.

    The CLI does not page: it prints the whole result at once, so there is never a next page. Used by the
    commands whose API endpoint is paged, so that their ``--output json`` is the API's body (which always
    carries ``nextPageToken``) whenever the result fits in one API page.
    """
    return {**body, "nextPageToken": None}


INTERRUPTED_APPLYING = ("interrupted while applying events to the read models: the batches applied so far are kept "
                        "with their checkpoints; the next command applies the rest")
"""What a query says when Ctrl-C stops it while it brings the read models up to date (exit code 130)."""


def _query(settings: Settings, run: Callable[[LedgerDatabase], JSONObject]) -> JSONObject:
    """Open the ledger, bring the read models up to the newest event, and answer ``run``.

    Should another process be applying events to the read models (a ``replay``, ``serve``, a watch worker), the
    query does not wait for it to finish, nor apply them beside it: it answers from the read models as they stand
    and says on stderr how far behind the newest event they are (:func:`ledger.services.catch_up_for_query`).
    A query that applies many events itself says so first.
    """
    if not settings.database_url:
        require_embedded_ledger(settings.data_dir)
    with reported_errors():
        db = services.open_ledger(settings)
        analyzed: list[tuple[Analyzed, float]] = []

        missing = applied = 0

        def applying_from(events: int) -> None:
            nonlocal missing
            missing = events
            if missing >= PROGRESS_MIN_LINES:
                err.print(f"read models: applying {missing:,} events before answering ...")

        with interrupt_said(INTERRUPTED_APPLYING), progress_bar(CATCH_UP_LABEL, min_total=PROGRESS_MIN_LINES) as bar:

            def advance(events: int) -> None:
                nonlocal applied
                applied += events
                bar(min(applied, missing), missing)

            behind = services.catch_up_for_query(db, applying_from=applying_from, progress=advance,
                                                 statistics=lambda done, seconds: analyzed.append((done, seconds)))
        for done, seconds in analyzed:
            _say_statistics(done, seconds)
        if behind is not None:
            _say_behind(behind)  # a rebuild's tables: the query's statements wait for its commit
        return run(db)  # Ctrl-C here: "interrupted", said by the command class (ledger.cli_typer.LedgerCommand)


def _say_behind(behind: services.ReadModelsBehind) -> None:
    """Say on stderr that another process is applying events, and how many the read models lack."""
    if behind.rebuilding:
        err.print("note: another process is rebuilding the read models (dra-ledger rebuild, or a first replay "
                  "building them from the whole history); this answer waits until it commits")
        return
    err.print(f"note: another process is applying events to the read models; this answer is from them as they "
              f"stand, {behind.events:,} events behind the newest")


@app.command()
def occupancy(at: AtOpt = None, node: Annotated[str | None, _filter_option("Only this node.")] = None,
              driver: Annotated[str | None, _filter_option("Only this driver.")] = None,
              pool: Annotated[str | None, _filter_option("Only this pool.")] = None,
              device_class: Annotated[str | None, _filter_option(
                  "Only devices in this DeviceClass at T (its CEL selectors match them).", "--device-class")] = None,
              config: ConfigOpt = None, cluster: ClusterOpt = None, output: OutputOpt = Output.table,
              url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Every device at T with its holders and the totals devices / allocated / free / shared.

    ``--device-class`` keeps the devices in that DeviceClass at T, with totals over them (the rule of
    ``GET /v1/occupancy?deviceClass``); a class not defined at T is an error (exit code 2).
    """
    when = _time(at, "--at")
    cfg = _config(config)

    def run(db: LedgerDatabase) -> JSONObject:
        return _whole_page(services.occupancy_all(db, at=when, cluster=cluster, node=node, driver=driver, pool=pool,
                                                  device_class=device_class, config=cfg))

    _emit(_query(settings_from(url, data_dir), run), output, render_occupancy)


class GroupBy(enum.StrEnum):
    """Usage grouping."""

    team = "team"
    namespace = "namespace"
    deviceClass = "deviceClass"
    model = "model"
    node = "node"
    cluster = "cluster"


@app.command()
def usage(start: Annotated[str, typer.Option("--from", help="Window start (RFC 3339).")],
          end: Annotated[str, typer.Option("--to", help="Window end, exclusive (RFC 3339).")],
          group_by: Annotated[GroupBy, choice_option(
              GroupBy, "--group-by", help="Group rows by this key; every key but cluster adds the clusters' "
              "device-hours together (give --cluster for one cluster).")] = GroupBy.team,
          step: Annotated[str | None, typer.Option(
              "--step", help="Split the window into buckets this long (ISO 8601 duration such as PT1H, or "
              "seconds); the last bucket ends at --to.")] = None,
          config: ConfigOpt = None, cluster: ClusterOpt = None, output: OutputOpt = Output.table,
          url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Device-hours per group over [from, to), always split by DeviceClass (adminAccess not billed);
    with prices in the configuration file (its prices tables), priced rows carry a cost; its team
    overrides decide the team. Every grouping but cluster adds the device-hours of all clusters
    unless --cluster is given."""
    t0, t1 = _time(start, "--from"), _time(end, "--to")
    if not t0 < t1:
        raise typer.BadParameter("--from must be before --to", param_hint="--from")
    # The API's parser and, in services.usage, the API's bucket limits: the same answers and messages.
    bucket = _duration(step, "--step", shortest=SHORTEST_STEP) if step is not None else None
    cfg = _config(config)

    def run(db: LedgerDatabase) -> JSONObject:
        return _whole_page(services.usage(db, start=t0, end=t1, group_by=group_by.value, cluster=cluster,
                                         step=bucket, config=cfg))

    _emit(_query(settings_from(url, data_dir), run), output, render_usage)


class ClaimState(enum.StrEnum):
    """Claim states for ``claims --state``."""

    pending = "pending"
    allocated = "allocated"
    deleted = "deleted"
    all = "all"


@app.command()
def claims(state: Annotated[ClaimState, choice_option(ClaimState, help="Which claims.")] = ClaimState.all,
           at: AtOpt = None, namespace: Annotated[str | None, _filter_option("Only this namespace.")] = None,
           config: ConfigOpt = None, cluster: ClusterOpt = None, output: OutputOpt = Output.table,
           url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Claims at T with state, origin, team (after the configured overrides), requested devices, allocated
    devices and consumers."""
    when = _time(at, "--at")
    cfg = _config(config)

    def run(db: LedgerDatabase) -> JSONObject:
        return _whole_page(services.claims(db, at=when, state=state.value, cluster=cluster, namespace=namespace,
                                           config=cfg))

    _emit(_query(settings_from(url, data_dir), run), output, render_claims)


@app.command("idle-claims")
def idle_claims(at: AtOpt = None,
                min_idle: Annotated[str | None, typer.Option("--min-idle", help="Override every category's "
                                                             "threshold (ISO 8601 or seconds).")] = None,
                config: ConfigOpt = None, cluster: ClusterOpt = None, output: OutputOpt = Output.table,
                url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Idle claims at T: unreserved, inactive-consumers, unreferenced (thresholds from [idle], 30 min each by
    default; teams after the configured overrides), as `report idle-claims` and the API answer."""
    when = _time(at, "--at")
    threshold = _duration(min_idle, "--min-idle") if min_idle is not None else None
    cfg = _config(config)

    def run(db: LedgerDatabase) -> JSONObject:
        return _whole_page(services.idle_report(db, at=when, config=cfg, min_idle=threshold, cluster=cluster))

    _emit(_query(settings_from(url, data_dir), run), output, render_idle)


# --- quotas, sharing, pending demand, reports (the configuration file matters here) -------------

def _config(path: Path | None) -> LedgerConfig:
    with reported_errors():
        return load_config(path)


def _number(value: JSONValue) -> str:
    """A count or quantity of a quota or counter as the table shows it: whole numbers exact with thousands
    separators, fractions as the shortest text that reads back as the same float (``123,456.789`` for a
    ``nominalQuota`` of ``123456789m``), never cut to six digits, and never in exponent form (``0.000001`` for
    ``1u``, not ``1e-06``)."""
    if isinstance(value, float) and not value.is_integer():
        # repr is the shortest text that reads back as the float; Decimal writes it out without an exponent.
        return f"{Decimal(repr(value)):,f}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{int(value):,}"
    return _s(value)


def render_quotas(body: JSONObject) -> None:
    """Print a quotas body (usage versus quota, or its intervals over time) as a table; a ``cluster`` column comes
    first when the rows come from more than one cluster (:class:`_ClusterLead`)."""
    if "intervals" in body:
        intervals = body["intervals"]
        assert isinstance(intervals, list)
        lead = _ClusterLead(intervals)
        rows = [[*lead(i), _s(i["team"]), _s(i["resourceName"]), _s(i["from"]), _s(i["to"]), _number(i["used"]),
                 _number(i["nominalQuota"]), "OVER" if i["overQuota"] else ""]
                for i in intervals if isinstance(i, dict)]
        _table(f"Counted usage from {body['from']} to {body['to']}",
               [*lead.columns, "team", "resource name", "from", "to", "used", "nominal quota", "over quota"], rows)
        return
    rows_in = body["rows"]
    assert isinstance(rows_in, list)
    lead = _ClusterLead(rows_in)
    counted: list[list[str | list[str]]] = [
        [*lead(r), _s(r["team"]), _s(r["resourceName"]), _number(r["used"]), _number(r["nominalQuota"]),
         "OVER" if r["overQuota"] else "", [str(x) for x in r["reasons"]] if isinstance(r["reasons"], list) else ""]
        for r in rows_in if isinstance(r, dict)]
    _table(f"Kueue-style counted usage at {body['at']}",
           [*lead.columns, "team", "resource name", "used", "nominal quota", "over quota", "Kueue would refuse"],
           counted)


def render_shared(body: JSONObject) -> None:
    """Print a shared body: shared devices, counter sets (partitions) and multi-consumer claims."""
    devices, sets, claims = body["devices"], body["counterSets"], body["claims"]
    assert isinstance(devices, list) and isinstance(sets, list) and isinstance(claims, list)
    rows: list[list[str]] = []
    for d in devices:
        assert isinstance(d, dict) and isinstance(d["allocations"], list)
        for a in d["allocations"]:
            assert isinstance(a, dict)
            rows.append([f"{d['pool']}/{d['device']}", f"{a['namespace']}/{a['claim']}", _s(a["team"]),
                         _s(a["shareID"]), f"{a['fraction']:.6g}", _s(d["split"])])
    _table(f"Shared devices at {body['at']}", ["pool/device", "claim", "team", "shareID", "share", "split by"], rows)
    rows = []
    for c in sets:
        assert isinstance(c, dict) and isinstance(c["counters"], dict) and isinstance(c["partitions"], list)
        counters = ", ".join(f"{k}: {_number(v['inUse'])}/{_number(v['total'])}" for k, v in c["counters"].items()
                             if isinstance(v, dict))
        held = ", ".join(f"{p['device']} ({a['namespace']}/{a['claim']})" for p in c["partitions"]
                         if isinstance(p, dict) and isinstance(p["allocations"], list)
                         for a in p["allocations"] if isinstance(a, dict))
        if c.get("conflict") is True:
            counters += " (conflict: allocated past the hardware)"
        rows.append([f"{c['pool']}/{c['counterSet']}", counters, held or "-"])
    _table("Partitionable devices (counter sets)", ["pool/counter set", "in use / total", "allocated partitions"],
           rows)
    rows = [[f"{c['namespace']}/{c['name']}", _s(c["team"]), _s(c["devices"]),
             ", ".join(str(x["name"]) for x in c["consumers"] if isinstance(x, dict))
             if isinstance(c["consumers"], list) else ""] for c in claims if isinstance(c, dict)]
    _table("Claims with several consumers", ["claim", "team", "devices", "consumers (equal split)"], rows)


def render_pending(body: JSONObject) -> None:
    """Print a pending body: per DeviceClass requested vs free, then the claims waiting; both tables start with a
    ``cluster`` column when the body holds more than one cluster (:class:`_ClusterLead`)."""
    classes, claims = body["classes"], body["claims"]
    assert isinstance(classes, list) and isinstance(claims, list)
    lead = _ClusterLead([*classes, *claims])
    _table(f"Pending demand at {body['at']}", [*lead.columns, "deviceClass", "claims", "requested", "free"],
           [[*lead(c), _s(c["deviceClass"]), _s(c["claims"]), _s(c["requested"]), _s(c["free"])]
            for c in classes if isinstance(c, dict)])
    rows = []
    for c in claims:
        assert isinstance(c, dict) and isinstance(c["requests"], list)
        wants = ", ".join(f"{r['deviceClass']}: {r['count']} ({r['free']} free)" for r in c["requests"]
                          if isinstance(r, dict))
        rows.append([*lead(c), f"{c['namespace']}/{c['name']}", _s(c["team"]), _s(c["pendingSince"]), wants or "-"])
    _table("Pending claims", [*lead.columns, "claim", "team", "pending since", "requested"], rows)


def _instant_or_window(at: str | None, start: str | None, end: str | None) -> None:
    """Check the ``--at`` or ``--from``/``--to`` choice of ``quotas`` and ``shared``.

    Raises:
        typer.BadParameter: (exit code 2) only one of ``--from`` / ``--to``, or ``--at`` with them (one of
            the two would be ignored).
    """
    if (start is None) != (end is None):
        raise typer.BadParameter("give both --from and --to, or neither", param_hint="--from")
    if at is not None and start is not None:
        raise typer.BadParameter("answers either for one instant (--at) or over a window (--from/--to), "
                                 "not both", param_hint="--at")


@app.command()
def quotas(at: AtOpt = None,
           start: Annotated[str | None, typer.Option("--from", help="With --to: usage over time instead.")] = None,
           end: Annotated[str | None, typer.Option("--to", help="Window end, exclusive (RFC 3339).")] = None,
           config: ConfigOpt = None, cluster: ClusterOpt = None, output: OutputOpt = Output.table,
           url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Kueue-style counted usage per team and resource name versus quota (deviceClassMappings, quotas)."""
    cfg = _config(config)
    _instant_or_window(at, start, end)

    def run(db: LedgerDatabase) -> JSONObject:
        for warning in services.quota_cluster_warnings(db, cfg):
            typer.echo(warning, err=True)
        if start is not None and end is not None:
            return services.quota_history(db, start=_time(start, "--from"), end=_time(end, "--to"), config=cfg,
                                          cluster=cluster)
        return _whole_page(services.quotas(db, at=_time(at, "--at"), config=cfg, cluster=cluster))

    body = _query(settings_from(url, data_dir), run)
    # The table prints the exact counts; the JSON is written as /v1/quotas writes it (see float_quota_usage).
    _emit(float_quota_usage(body) if output is Output.json else body, output, render_quotas)


def float_quota_usage(body: JSONObject) -> JSONObject:
    """A ``quotas`` body (``rows`` at an instant, or ``intervals`` over a window) with every ``used`` a float,
    the form ``GET /v1/quotas`` writes it in.

    The ledger counts exactly: ``used`` is an ``int`` for a whole count (``4``; ``9223372036854775807`` where
    Kueue's counts saturate at int64) and a ``float`` only for a fractional quantity. The API's schema types
    ``used`` as a float (``api.schemas.QuotaRow.used``, OpenAPI ``number``), so the API writes ``4.0``;
    ``--output json`` is the API's body, so it writes ``4.0`` too, and the window intervals (CLI-only) take
    the same form so that both answers of ``quotas`` agree. A float is exact up to 2**53; a count above
    that is rounded, as the API rounds it (the table, printed from the exact body, is not).

    Args:
        body: from :func:`ledger.services.quotas` or :func:`ledger.services.quota_history`; not changed.

    Returns:
        A copy with ``rows[].used``, ``rows[].claims[].used`` and ``intervals[].used`` floats; everything else
        as it was (``nominalQuota`` is a float already: the configuration's).
    """

    def floated(item: JSONValue) -> JSONValue:
        if not isinstance(item, dict):
            return item
        copy = dict(item)
        used = copy.get("used")
        if isinstance(used, int) and not isinstance(used, bool):
            copy["used"] = float(used)
        if isinstance(claims := copy.get("claims"), list):
            copy["claims"] = [floated(c) for c in claims]
        return copy

    return {key: [floated(x) for x in value] if key in ("rows", "intervals") and isinstance(value, list) else value
            for key, value in body.items()}


def render_shared_usage(body: JSONObject) -> None:
    """Print a shared-usage body: shared device-hours charged per team and DeviceClass."""
    rows_in = body["rows"]
    assert isinstance(rows_in, list)
    _table(f"Shared device-hours from {body['from']} to {body['to']}", ["team", "deviceClass", "driver",
                                                                         "device-hours"],
           [[_s(r["team"]), _s(r["deviceClass"]), _s(r["driver"]), f"{r['deviceHours']:.6f}"]
            for r in rows_in if isinstance(r, dict)])


@app.command()
def shared(at: AtOpt = None,
           start: Annotated[str | None, typer.Option("--from", help="With --to: shared device-hours charged "
                                                     "over [from, to) instead.")] = None,
           end: Annotated[str | None, typer.Option("--to", help="Window end, exclusive (RFC 3339).")] = None,
           config: ConfigOpt = None, cluster: ClusterOpt = None, output: OutputOpt = Output.table,
           url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Shared devices (shareID, consumable capacity), partitions of counter sets, multi-consumer claims at T."""
    _instant_or_window(at, start, end)
    cfg = _config(config)
    if start is not None and end is not None:
        t0, t1 = _time(start, "--from"), _time(end, "--to")

        def run_window(db: LedgerDatabase) -> JSONObject:
            return services.shared_usage(db, start=t0, end=t1, cluster=cluster, config=cfg)

        _emit(_query(settings_from(url, data_dir), run_window), output, render_shared_usage)
        return
    when = _time(at, "--at")

    def run(db: LedgerDatabase) -> JSONObject:
        return _whole_page(services.shared(db, at=when, cluster=cluster, config=cfg))

    _emit(_query(settings_from(url, data_dir), run), output, render_shared)


@app.command()
def pending(at: AtOpt = None, config: ConfigOpt = None, cluster: ClusterOpt = None,
            output: OutputOpt = Output.table, url: UrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Pending demand at T: per DeviceClass claims waiting, devices requested, devices free (CEL, taints)."""
    when = _time(at, "--at")
    cfg = _config(config)

    def run(db: LedgerDatabase) -> JSONObject:
        return _whole_page(services.pending(db, at=when, cluster=cluster, config=cfg))

    _emit(_query(settings_from(url, data_dir), run), output, render_pending)


report_app = LedgerTyper(help="Reports: the idle-claim cleanup report.", no_args_is_help=True)
app.add_typer(report_app, name="report")


class ReportFormat(enum.StrEnum):
    """Output format of reports."""

    table = "table"
    json = "json"
    csv = "csv"


@report_app.command("idle-claims")
def report_idle_claims(at: AtOpt = None,
                       min_idle: Annotated[str | None, typer.Option(
                           "--min-idle", help="Override every category's threshold (ISO 8601 or seconds).")] = None,
                       output_format: Annotated[ReportFormat, choice_option(ReportFormat, "--format", "-f",
                                                                             help="table, json or csv.")]
                       = ReportFormat.table,
                       config: ConfigOpt = None, cluster: ClusterOpt = None, url: UrlOpt = None,
                       data_dir: DataDirOpt = None) -> None:
    """Idle claims at T with the configured thresholds ([idle]) and team overrides; CSV for spreadsheets."""
    when = _time(at, "--at")
    threshold = _duration(min_idle, "--min-idle") if min_idle is not None else None
    cfg = _config(config)

    def run(db: LedgerDatabase) -> JSONObject:
        return services.idle_report(db, at=when, config=cfg, min_idle=threshold, cluster=cluster)

    body = _query(settings_from(url, data_dir), run)
    if output_format is ReportFormat.csv:
        sys.stdout.write(services.idle_report_csv(body))
    else:
        _emit(_whole_page(body), Output(output_format.value), render_idle)


# --- demo ----------------------------------------------------------------------------------------


def seed_lab_path() -> Path:
    """Path of the seed-lab history shipped inside the package (``ledger/data/seed-lab.jsonl``)."""
    return Path(str(importlib.resources.files("ledger") / "data" / "seed-lab.jsonl"))


DEMO_FOLLOWUPS: list[Callable[[Settings, int], None]] = []
"""Run after the demo printed the ledger, with the settings and ``--port`` (the API plugin registers one
that serves the API on that port)."""

DEMO_PORT = 8472
"""Default port of the API the demo serves (the API's default: unassigned by IANA)."""


@app.command()
def demo(ctx: typer.Context, data_dir: DataDirOpt = None, url: UrlOpt = None,
         serve: Annotated[bool, typer.Option("--serve/--no-serve", help="Serve the REST API afterwards "
                                             "(when the API is installed).")] = True,
         port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port of the API the demo serves "
                                           "on 127.0.0.1.")] = DEMO_PORT) -> None:
    """Replay the bundled seed-lab history (cluster 'seed-lab') and print what the ledger knows.

    Replaying is idempotent, so running the demo again adds nothing; the embedded server stays up so
    the query commands that follow reuse it.
    """
    from ledger.recorded import WatchLine, read_history

    settings = settings_from(url, data_dir)
    history = seed_lab_path()
    if serve and DEMO_FOLLOWUPS:
        from ledger.embedded import require_port

        with reported_errors():
            require_port("127.0.0.1", port, doing="serve the API")  # said before the replay, not after it
    me = command_name(sys.argv[0], shutil.which("dra-ledger"))
    # The hints name the ledger the demo used: without them a query would start (or ask) another one. A URL
    # from LEDGER_DATABASE_URL needs no flag: the next command reads the same variable.
    same = f" --data-dir {data_dir}" if data_dir else ""
    # By the member's name: Typer releases differ in whose ParameterSource enum they use (click's or their own).
    source = ctx.get_parameter_source("url")
    from_env = source is not None and source.name == "ENVIRONMENT"
    stop = f"stop it with `{me} db stop{same}`"
    named = f"the database {'LEDGER_DATABASE_URL' if from_env else '--database-url'} names"
    where = (f"the embedded server keeps running for the next command ({stop})" if not settings.database_url
             else f"it is in {named}")
    try:
        with reported_errors():
            if not settings.database_url:
                from ledger.embedded import EmbeddedPostgres, default_data_dir

                server = EmbeddedPostgres(settings.data_dir or default_data_dir())
                server.start()
                err.print(f"embedded PostgreSQL 18 in {server.data_dir}")
            db = services.open_ledger(settings)
            if not settings.database_url:
                err.print(f"ledger database: {db.url}", markup=False)
                err.print(_libpq_hint(db), markup=False)
                err.print(EMBEDDED_TRUST, markup=False)
            times = [x.observed_at for x in read_history(history) if isinstance(x, WatchLine) and x.observed_at]
            report = services.replay_files(db, [history], cluster=DEMO_CLUSTER)
            _print_report(report)
            # The bundled history's lines are each stored now (recorded by this run or an earlier one).
            if (extra := services.count_observations(db, DEMO_CLUSTER) - report.recorded - report.duplicates) > 0:
                # A ledger kept from an earlier run, where other lines were replayed under the demo's cluster: the
                # answers below are not the seed lab's alone, and nothing else would say so.
                err.print(f"warning: cluster {DEMO_CLUSTER!r} of this ledger holds {extra} "
                          "observation(s) besides the bundled history (replayed into it earlier), so the answers "
                          "below include them and differ from the seed lab's; run the demo with --data-dir on an "
                          "empty directory (or --database-url on an empty database) for the seed lab alone",
                          markup=False)
            services.refresh_occupancy_counts(db, cluster=DEMO_CLUSTER)  # what the occupancy-counts job keeps up
            start, end = min(times), max(times)
            busy = start.replace(minute=30, second=0, microsecond=0)  # seed-lab: every claim but one is placed
            _heading(f"seed-lab: one node, 8 GPUs, history {rfc3339(start)} .. {rfc3339(end)}")
            c = DEMO_CLUSTER
            render_occupancy(services.occupancy_all(db, at=busy, cluster=c))
            render_pending(services.pending(db, at=busy, cluster=c))  # requested 4, 2 free
            out.print("After train-0 finished and the shared claim's pods went away:")
            render_occupancy(services.occupancy_all(db, at=end, cluster=c))
            render_usage(services.usage(db, start=start.replace(minute=0, second=0, microsecond=0), end=end,
                                        group_by="team", cluster=c))
            render_idle(services.idle_report(db, at=end, config=DEFAULT_CONFIG, cluster=c))
    except KeyboardInterrupt:
        # Ctrl-C while the embedded server starts (the first start runs initdb) ends pg_ctl, not a server it started:
        # say whether one runs, and how to stop it.
        err.print(f"interrupted: what was replayed so far is kept (running the demo again adds nothing twice); "
                  f"{_where_after_interrupt(settings, stop=stop, named=named)}", soft_wrap=True)
        raise typer.Exit(130) from None
    if url and not from_env:
        same += " --database-url ...  (the same URL)"  # not printed: it may carry a password
    out.print(f"The seed-lab history stays in the ledger as cluster 'seed-lab'; {where}. Try:\n"
              f"  {me} occupancy --at 2026-11-02T10:40:00Z --output json{same}\n"
              f"  {me} usage --from 2026-11-02T09:00:00Z --to 2026-11-02T12:00:00Z --group-by team{same}",
              soft_wrap=True)  # commands to copy: never broken across lines
    if serve and DEMO_FOLLOWUPS:
        with reported_errors():
            for followup in DEMO_FOLLOWUPS:
                followup(settings, port)
        # Said again once the API stops (Ctrl-C): the hint above is far up, under the API's request log.
        err.print(f"API stopped; the seed-lab history stays in the ledger; {where}", soft_wrap=True)


def _where_after_interrupt(settings: Settings, *, stop: str, named: str) -> str:
    """Where an interrupted demo leaves the ledger: the database named, or whether the embedded server runs."""
    if settings.database_url:
        return f"the ledger is in {named}"
    from ledger.embedded import EmbeddedPostgres, default_data_dir

    try:
        running = EmbeddedPostgres(settings.data_dir or default_data_dir()).is_running()
    except (OSError, LedgerError):
        running = True  # cannot tell: say how to stop it
    return f"the embedded server keeps running ({stop})" if running else "no embedded server was left running"


def command_name(invoked: str, on_path: str | None) -> str:
    """How the demo's hints spell this command so that they run when pasted: ``dra-ledger`` when that name on
    ``PATH`` is the program running, else the path it was started by (e.g. ``.venv/bin/dra-ledger`` in a venv
    that is not activated).

    Args:
        invoked: ``sys.argv[0]`` of this process.
        on_path: ``shutil.which("dra-ledger")`` (``None``: not on ``PATH``).
    """
    if Path(invoked).name != "dra-ledger" or (on_path is not None
                                              and Path(on_path).resolve() == Path(invoked).resolve()):
        return "dra-ledger"
    return invoked


COMMAND_GROUP = "dra_ledger.commands"
"""Entry-point group through which other packages add commands (``api``: serve; ``workers``: watch).

Each entry point names a callable taking the Typer ``app``; it registers its commands on it. This keeps
``ledger`` free of imports of ``api`` and ``workers`` (the import contract in pyproject.toml).
"""


def _load_plugins() -> None:
    for entry in sorted(importlib.metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        register = entry.load()
        register(app)


def main() -> None:
    """Console-script entry point of ``dra-ledger``: load command plugins, then run.

    Ctrl-C while the plugins load (their imports take a second or two), or while Typer builds the commands from
    their signatures, ends the process with exit code 130 and one line, as Ctrl-C inside a command does, instead
    of a traceback of whatever was running; SIGTERM then (:class:`~ledger.interrupts.Terminated`, raised once
    :mod:`ledger.entry` has installed its handler) with 143 and ``terminated (SIGTERM)``. (Inside a command, Click
    or the command itself handles them first.) So does one that Typer ends with a silent exit code 130: while it
    parses the command line, before the command runs. One that comes while the command's exit is on its way out
    (its answer written, or its stop said) keeps the exit code the command chose, without a word.
    """
    # The pool logs the failed reset of a connection that Ctrl-C left mid-COPY with a traceback; the command says
    # "interrupted" itself. (A filter applies to the records of its own logger: the pool class's.)
    logging.getLogger(f"{QueuePool.__module__}.{QueuePool.__name__}").addFilter(CtrlCResetFilter())
    logging.getLogger("psycopg").addFilter(IgnoredErrorFilter())
    ANSWERED.set(False)
    try:
        _load_plugins()
        app()
    except SystemExit as e:
        if (interrupt := _interrupt_typer_ended(e)) is None:
            raise
        _exit_interrupted(interrupt)
    except BaseException as e:  # Ctrl-C, or SIGTERM's Terminated, bare or wrapped (an import's RuntimeError)
        if (interrupt := interrupt_behind(e)) is None:
            raise
        _exit_interrupted(interrupt)


def _interrupt_typer_ended(exited: SystemExit) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind ``exited``, when Typer made it of one: Typer turns a ``KeyboardInterrupt`` that
    reaches it (outside :class:`~ledger.cli_typer.LedgerCommand`'s ``invoke``, which says its own) into
    ``Exit(130)`` without a word, and that into ``SystemExit(130)``."""
    ended = exited.__context__
    if exited.code != 130 or not isinstance(ended, typer.Exit) or not isinstance(ended.__cause__, KeyboardInterrupt):
        return None
    return ended.__cause__


def _exit_interrupted(interrupt: KeyboardInterrupt) -> NoReturn:
    """Say ``interrupt`` (``interrupted`` with exit code 130, ``terminated (SIGTERM)`` with 143) and exit, unless it
    came while the command's exit was on its way out (a ``typer.Exit`` in its context: the answer written and its
    code 0 chosen, or its stop said) or after the command returned (:data:`~ledger.cli_typer.ANSWERED`): that exit
    code stands, without a second word."""
    chosen = next((link for link in error_chain(interrupt) if isinstance(link, typer.Exit)), None)
    if chosen is not None:
        raise SystemExit(chosen.exit_code) from None
    if ANSWERED.get():
        raise SystemExit(0) from None
    word, code = stopped_by(interrupt)
    typer.echo(word, err=True)
    raise SystemExit(code) from None
