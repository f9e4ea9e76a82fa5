"""Ctrl-C during a command's database work ends it with exit code 130 and a line saying what was kept, also when
the interrupt surfaces as a database error (psycopg stopped mid-COPY cannot roll back), and never with a
traceback or a "database unavailable" error."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from typing import NoReturn

import psycopg
import pytest
import typer
from sqlalchemy import Engine, QueuePool, text
from sqlalchemy.exc import OperationalError
from typer.testing import CliRunner

from ledger import cli, services
from ledger.cli import INTERRUPTED_APPLYING, CtrlCResetFilter, IgnoredErrorFilter, app, caused_by_ctrl_c
from ledger.errors import StoreUnavailable
from ledger.interrupts import Terminated
from ledger.store.database import LedgerDatabase
from tests.factories import CLI, signalled
from tests.paths import HISTORIES

SEED = HISTORIES / "seed-lab.jsonl"
SEED_EVENTS = 51  # events the seed lab's 39 lines append (README, "What the demo shows")
IN_PROGRESS = "sending query failed: another command is already in progress"


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _failed_rollback_after_ctrl_c() -> OperationalError:
    """What SQLAlchemy raises when Ctrl-C stopped psycopg mid-COPY and the rollback that follows fails: its
    ``OperationalError`` caused by psycopg's, whose context is the ``KeyboardInterrupt`` (the chain a real
    interrupted ``COPY ... TO STDOUT`` left, one run in four)."""
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            try:
                raise psycopg.OperationalError(IN_PROGRESS)
            except psycopg.OperationalError as e:
                raise OperationalError("ROLLBACK", None, e) from e
    except OperationalError as e:
        return e


def _store_unavailable_after_ctrl_c() -> StoreUnavailable:
    """The same failure as the services report it (``unavailable_as_error``)."""
    try:
        raise StoreUnavailable(f"database unavailable: {IN_PROGRESS}") from _failed_rollback_after_ctrl_c()
    except StoreUnavailable as e:
        return e


def test_an_error_is_caused_by_ctrl_c_when_a_keyboard_interrupt_is_in_its_chain() -> None:
    error = _failed_rollback_after_ctrl_c()
    assert isinstance(error.__cause__, psycopg.OperationalError)
    assert isinstance(error.__cause__.__context__, KeyboardInterrupt)
    assert caused_by_ctrl_c(error) and caused_by_ctrl_c(_store_unavailable_after_ctrl_c())
    assert not caused_by_ctrl_c(OperationalError("SELECT 1", None, Exception(IN_PROGRESS)))


@pytest.mark.parametrize("failure", [_failed_rollback_after_ctrl_c, _store_unavailable_after_ctrl_c],
                         ids=["OperationalError", "StoreUnavailable"])
def test_ctrl_c_that_breaks_the_connection_during_a_replays_catch_up_says_interrupted_not_unavailable(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch, failure: object) -> None:
    assert callable(failure)

    def catch_up(*args: object, **kwargs: object) -> NoReturn:
        raise failure()

    monkeypatch.setattr(services, "catch_up", catch_up)
    result = CliRunner().invoke(app, ["replay", str(SEED), "--database-url", _url(ledger_engine)])

    assert result.exit_code == 130, result.output
    assert result.output.startswith("interrupted after every line was recorded, while applying events to the read "
                                    "models: the batches applied so far are kept with their checkpoints; the next "
                                    "command that reads them, or a running `serve`, applies the rest")
    assert "error" not in result.output and "Traceback" not in result.output
    with ledger_engine.connect() as conn:  # the lines stay recorded; nothing was applied
        assert conn.execute(text("SELECT count(*) FROM observations")).scalar_one() == 39


def test_a_replay_interrupted_while_it_analyzes_says_the_read_models_are_caught_up(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every event was applied when Ctrl-C came in the statistics refresh that follows: the replay said the read
    # models "catch up on the next command", which had nothing left to apply.
    def interrupted(*args: object, **kwargs: object) -> NoReturn:
        raise KeyboardInterrupt

    monkeypatch.setattr(services, "ANALYZE_AFTER_EVENTS", 10)  # the seed lab's events are a bulk load
    monkeypatch.setattr(services, "refresh_statistics", interrupted)
    result = CliRunner().invoke(app, ["replay", str(SEED), "--database-url", _url(ledger_engine)])

    assert result.exit_code == 130, result.output
    assert result.output.splitlines()[-1] == ("interrupted after every line was recorded, with the read models caught "
                                              "up: tables not analyzed yet are left to autovacuum")
    db = services.open_ledger(cli.settings_from(_url(ledger_engine), None))
    try:
        assert services.events_to_apply(db) == 0
    finally:
        db.dispose()


def test_ctrl_c_that_breaks_the_connection_while_recording_says_run_again(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def replay_files(*args: object, **kwargs: object) -> NoReturn:
        raise _store_unavailable_after_ctrl_c()

    monkeypatch.setattr(services, "replay_files", replay_files)
    result = CliRunner().invoke(app, ["replay", str(SEED), "--database-url", _url(ledger_engine)])

    assert result.exit_code == 130, result.output
    assert result.output.startswith("interrupted: the batches committed so far are kept; run the same command again")


def _recorded_not_applied(engine: Engine) -> None:
    report = services.replay_files(services.open_ledger(cli.settings_from(_url(engine), None)), [SEED],
                                   cluster="default", catch_up=False)
    assert report.events == SEED_EVENTS


def test_a_query_interrupted_while_it_applies_events_says_what_is_kept(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _recorded_not_applied(ledger_engine)

    def catch_up(*args: object, **kwargs: object) -> NoReturn:
        raise KeyboardInterrupt  # what Ctrl-C raises in the main thread

    monkeypatch.setattr(services, "catch_up", catch_up)
    result = CliRunner().invoke(app, ["occupancy", "--database-url", _url(ledger_engine)])

    assert result.exit_code == 130
    assert result.output == INTERRUPTED_APPLYING + "\n"


def test_a_query_interrupted_while_it_answers_says_interrupted(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def occupancy_all(*args: object, **kwargs: object) -> NoReturn:
        raise _failed_rollback_after_ctrl_c()

    monkeypatch.setattr(services, "occupancy_all", occupancy_all)
    result = CliRunner().invoke(app, ["occupancy", "--database-url", _url(ledger_engine)])

    assert (result.exit_code, result.output) == (130, "interrupted\n")


def test_a_database_error_without_ctrl_c_is_still_reported_as_one(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def occupancy_all(*args: object, **kwargs: object) -> NoReturn:
        raise OperationalError("SELECT 1", None, Exception(IN_PROGRESS))

    monkeypatch.setattr(services, "occupancy_all", occupancy_all)
    result = CliRunner().invoke(app, ["occupancy", "--database-url", _url(ledger_engine)])

    assert (result.exit_code, result.output) == (2, f"error: database unavailable: {IN_PROGRESS}\n")


def test_a_query_that_applies_many_events_shows_their_progress(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _recorded_not_applied(ledger_engine)
    # The seed lab's 51 events stand for a large backlog: progress from 10 events on, a line each tenth off a
    # terminal.
    monkeypatch.setattr(cli, "PROGRESS_MIN_LINES", 10)
    monkeypatch.setattr(cli, "PLAIN_PROGRESS_FACTOR", 1)
    result = CliRunner().invoke(app, ["occupancy", "--database-url", _url(ledger_engine), "-o", "json"])

    assert result.exit_code == 0, result.output
    # One batch (the catch-up's batches hold 2,000 events): one line, all of them.
    assert result.stderr.splitlines() == [f"read models: applying {SEED_EVENTS} events before answering ...",
                                          f"events applied: {SEED_EVENTS} of {SEED_EVENTS}"]


def _record(error: BaseException | None) -> logging.LogRecord:
    exc_info = (type(error), error, error.__traceback__) if error is not None else None
    return logging.LogRecord("sqlalchemy.pool.impl.QueuePool", logging.ERROR, __file__, 1,
                             "Exception during reset or similar", None, exc_info)


def test_the_pools_failed_reset_after_ctrl_c_is_not_logged_and_every_other_record_is() -> None:
    keep = CtrlCResetFilter().filter
    assert not keep(_record(_failed_rollback_after_ctrl_c()))
    assert keep(_record(OperationalError("ROLLBACK", None, Exception(IN_PROGRESS))))
    assert keep(_record(None))


def test_the_cli_filters_the_logger_its_engines_pool_logs_to(ledger_engine: Engine,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "app", lambda: None)
    monkeypatch.setattr(cli, "_load_plugins", lambda: None)
    monkeypatch.setattr(sys, "argv", ["dra-ledger"])
    logger = logging.getLogger(f"{QueuePool.__module__}.{QueuePool.__name__}")
    monkeypatch.setattr(logger, "filters", [])
    monkeypatch.setattr(logging.getLogger("psycopg"), "filters", [])
    cli.main()

    db = services.open_ledger(cli.settings_from(_url(ledger_engine), None))
    assert isinstance(db.engine.pool, QueuePool)
    pool_logger = getattr(db.engine.pool.logger, "logger", db.engine.pool.logger)  # SQLAlchemy may wrap it
    assert pool_logger is logger
    assert [type(f) for f in logger.filters] == [CtrlCResetFilter]
    assert [type(f) for f in logging.getLogger("psycopg").filters] == [IgnoredErrorFilter]


def test_psycopgs_ignored_errors_are_not_logged_and_its_other_warnings_are(caplog: pytest.LogCaptureFixture,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # psycopg logs these (psycopg/transaction.py, _pipeline.py, _copy.py) when a rollback or a pipeline's end fails
    # while an error is already on its way out, a lost connection: a trial's `jobs --once` printed the pipeline's
    # before its own one-line error.
    psycopg_logger = logging.getLogger("psycopg")
    monkeypatch.setattr(psycopg_logger, "filters", [IgnoredErrorFilter()])
    psycopg_logger.warning("error ignored in rollback of %s: %s", "<psycopg.Transaction>", "the connection is lost")
    psycopg_logger.warning("error ignored terminating %r: %s", "<psycopg.Pipeline [BAD]>", "the connection is lost")
    # A second Ctrl-C (or SIGTERM) while psycopg cancels the statement the first one stopped (psycopg/connection.py)
    # printed this above the command's "interrupted" line; one that an error cut short stays.
    for cut_by in ("KeyboardInterrupt", "Terminated", "OperationalError"):
        psycopg_logger.warning("query cancellation interrupted (%s): closing connection", cut_by)
    psycopg_logger.warning("another warning of psycopg")
    assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == [
        "query cancellation interrupted (OperationalError): closing connection", "another warning of psycopg"]


def test_a_rebuild_interrupted_says_it_rolled_back_and_one_interrupted_after_its_commit_says_what_is_left(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _url(ledger_engine)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0

    def interrupted(*args: object, **kwargs: object) -> NoReturn:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(services, "rebuild", interrupted)
        during = CliRunner().invoke(app, ["rebuild", "--database-url", url])
    with monkeypatch.context() as patch:
        patch.setattr(services, "refresh_occupancy_counts", interrupted)
        after = CliRunner().invoke(app, ["rebuild", "--database-url", url])
    with monkeypatch.context() as patch:
        patch.setattr(services, "refresh_statistics", interrupted)
        last = CliRunner().invoke(app, ["rebuild", "--database-url", url])

    assert during.exit_code == after.exit_code == last.exit_code == 130
    assert last.output.splitlines()[-1] == ("interrupted after the rebuild and the occupancy counts committed: tables "
                                            "not analyzed yet are left to autovacuum")
    with ledger_engine.connect() as conn:
        events = conn.execute(text("SELECT count(*) FROM events")).scalar_one()
    assert during.output.splitlines() == [f"rebuilding the read models from the events ({events:,}) ...",
                                          "interrupted: the rebuild rolled back; the read models are as they were"]
    assert after.output.splitlines()[-1].startswith("interrupted after the rebuild committed: the occupancy counts "
                                                    "not computed yet are computed by the jobs")


def test_the_events_to_apply_are_counted_not_read_off_positions_with_gaps(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _url(ledger_engine)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    with ledger_engine.begin() as conn:  # what an append rolled back leaves: positions used up, no events
        conn.execute(text("SELECT nextval(pg_get_serial_sequence('events', 'global_position')) "
                          "FROM generate_series(1, 7)"))
    db = services.open_ledger(cli.settings_from(url, None))
    assert services.replay_files(db, [SEED], cluster="second", catch_up=False).events == SEED_EVENTS
    assert max(services.projection_lag(db).values()) == SEED_EVENTS + 7
    assert services.events_to_apply(db) == SEED_EVENTS
    monkeypatch.setattr(cli, "PROGRESS_MIN_LINES", 10)
    monkeypatch.setattr(cli, "PLAIN_PROGRESS_FACTOR", 1)

    result = CliRunner().invoke(app, ["occupancy", "--database-url", url, "-o", "json"])

    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"read models: applying {SEED_EVENTS} events before answering ...",
                                          f"events applied: {SEED_EVENTS} of {SEED_EVENTS}"]


@pytest.mark.parametrize("command", [["occupancy"], ["claims"], ["db", "current"]])
def test_ctrl_c_where_a_command_has_no_message_of_its_own_ends_with_one_line(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    def interrupted(*args: object, **kwargs: object) -> NoReturn:
        raise KeyboardInterrupt

    # While it connects: the queries' own messages cover applying events and answering, not opening the ledger.
    monkeypatch.setattr(services, "open_ledger", interrupted)
    monkeypatch.setattr(LedgerDatabase, "from_url", interrupted)
    result = CliRunner().invoke(app, [*command, "--database-url", _url(ledger_engine)])

    assert result.exit_code == 130  # Typer alone: 130 and no word
    assert result.output.splitlines() == ["interrupted"]


def _unavailable_after_sigterm(*args: object, **kwargs: object) -> NoReturn:
    """What the services raise when SIGTERM (:class:`Terminated`) broke a statement: "database unavailable", with
    the interrupt as its cause."""
    try:
        raise Terminated
    except Terminated as e:
        raise StoreUnavailable(f"database unavailable: {IN_PROGRESS}") from e


def test_sigterm_while_a_rebuild_waits_in_line_rolls_it_back_at_once_and_says_so(ledger_engine: Engine) -> None:
    # Another session reads the last read model (device_allocations) in an open transaction, as a long Grafana query
    # does. With no patience, the rebuild queues for its locks at once: it holds the other read models and waits for
    # that one. SIGTERM must end it as Ctrl-C does: the statement cancelled, the transaction rolled back (its locks
    # gone when the process has exited, not when the server notices a dead client), one line and exit code 143.
    url = _url(ledger_engine)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    with ledger_engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM device_allocations")).scalar_one()
    assert before > 0
    code = ("import sys; from ledger.projections import runner; runner.TRUNCATE_LOCK_PATIENCE_S = 0.0; "
            "sys.argv[0] = 'dra-ledger'; from ledger.cli import main; main()")
    with ledger_engine.connect() as reader, ledger_engine.connect() as watcher:
        reader.execute(text("LOCK TABLE device_allocations IN ACCESS SHARE MODE"))
        proc = subprocess.Popen([sys.executable, "-c", code, "rebuild", "--database-url", url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        pid = None
        deadline = time.monotonic() + 60  # the process's start-up on a busy machine, not a timing assertion
        while pid is None and proc.poll() is None and time.monotonic() < deadline:
            pid = watcher.execute(text(
                "SELECT pid FROM pg_locks WHERE relation = 'device_allocations'::regclass "
                "AND mode = 'AccessExclusiveLock' AND NOT granted")).scalar()
            watcher.rollback()
            time.sleep(0.05)
        held = watcher.execute(text("SELECT count(*) FROM pg_locks WHERE pid = :p AND granted "
                                    "AND mode = 'AccessExclusiveLock'"), {"p": pid}).scalar_one()
        watcher.rollback()
        _, stderr = signalled(proc, signal.SIGTERM, timeout_s=60)
        left = watcher.execute(text("SELECT count(*) FROM pg_locks WHERE pid = :p"), {"p": pid}).scalar_one()
        watcher.rollback()
        reader.rollback()
    assert pid is not None, f"the rebuild never queued for device_allocations: {stderr}"
    assert held >= 8  # the read models before device_allocations
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[-1] == "terminated (SIGTERM): the rebuild rolled back; the read models are as they were"
    assert left == 0
    with ledger_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM device_allocations")).scalar_one() == before


def test_sigterm_where_a_command_has_no_message_of_its_own_ends_with_one_line(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def terminated(*args: object, **kwargs: object) -> NoReturn:
        raise Terminated

    monkeypatch.setattr(services, "open_ledger", terminated)
    result = CliRunner().invoke(app, ["rebuild", "--database-url", _url(ledger_engine)])

    assert result.exit_code == 143
    assert result.output.splitlines() == ["terminated (SIGTERM)"]


def test_an_error_caused_by_sigterm_says_terminated_where_ctrl_c_says_interrupted(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    url = _url(ledger_engine)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0

    monkeypatch.setattr(services, "rebuild", _unavailable_after_sigterm)
    result = CliRunner().invoke(app, ["rebuild", "--database-url", url])

    assert result.exit_code == 143
    assert result.output.splitlines()[-1] == ("terminated (SIGTERM): the rebuild rolled back; the read models are as "
                                              "they were")


def test_sigterm_during_a_replay_says_what_is_kept_as_ctrl_c_does(ledger_engine: Engine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def terminated(*args: object, **kwargs: object) -> NoReturn:
        raise Terminated

    monkeypatch.setattr(services, "replay_files", terminated)
    result = CliRunner().invoke(app, ["replay", str(SEED), "--database-url", _url(ledger_engine)])

    assert result.exit_code == 143
    assert result.output.splitlines()[-1] == ("terminated (SIGTERM): the batches committed so far are kept; run the "
                                              "same command again to record the rest (lines already recorded are "
                                              "skipped)")


def test_a_rebuild_that_finds_the_occupancy_counts_current_says_so(ledger_engine: Engine) -> None:
    # Nothing recorded: no cluster has counts to compute, as when a rebuild beside this one computed them first. The
    # line said "0 rows over 0 cluster(s)".
    result = CliRunner().invoke(app, ["rebuild", "--database-url", _url(ledger_engine)])

    assert result.exit_code == 0, result.output
    assert "occupancy counts: none left to compute (already current)" in result.output.splitlines()


def test_a_database_error_that_sigterm_caused_before_the_rebuild_began_says_terminated(
        ledger_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    # SIGTERM while the rebuild opens the ledger, surfacing as the services' "database unavailable": it was said as
    # an interrupt (exit 130) because the error was raised again as a plain KeyboardInterrupt.
    monkeypatch.setattr(services, "open_ledger", _unavailable_after_sigterm)
    result = CliRunner().invoke(app, ["rebuild", "--database-url", _url(ledger_engine)])

    assert result.exit_code == 143
    assert result.output.splitlines() == ["terminated (SIGTERM)"]


def test_what_a_command_kept_is_said_when_the_services_raise_their_own_error_from_the_one_it_was_noted_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    # A replay's lines are recorded inside interrupt_said, which notes what was kept on the error leaving it; the
    # services.applying block around it (unavailable_as_error) then raises "database unavailable" from a lost
    # connection. The note was on the error the new one was raised from, and only the new one's notes were said.
    from ledger.store.database import unavailable_as_error

    with pytest.raises(typer.Exit) as exited, cli.reported_errors(), unavailable_as_error(), \
            cli.interrupt_said("interrupted: the batches committed so far are kept"):
        raise OperationalError("COPY observations FROM STDIN", None, psycopg.OperationalError("the connection is lost"))

    assert exited.value.exit_code == 2
    assert capsys.readouterr().err.splitlines() == ["error: database unavailable: the connection is lost",
                                                    "stopped: the batches committed so far are kept"]


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_stops_jobs_once_while_its_snapshot_waits_for_a_lock_held_elsewhere(
        ledger_engine: Engine, signum: int, code: int, said: str) -> None:
    # The snapshot runs in a worker thread, which no signal reaches: with no lock_timeout, `jobs --once` stopped
    # only once the other session let go of idle_claim_snapshots (never, while it held it), and the snapshot then
    # committed under a line saying it was not taken. The signal must cancel the waiting statement at once.
    url = _url(ledger_engine)
    assert CliRunner().invoke(app, ["replay", str(SEED), "--database-url", url]).exit_code == 0
    with ledger_engine.connect() as holder, ledger_engine.connect() as watcher:
        holder.execute(text("LOCK TABLE idle_claim_snapshots IN ACCESS EXCLUSIVE MODE"))
        proc = subprocess.Popen(
            [*CLI, "jobs", "--once", "--database-url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # not a shell's background job
        waiting = 0
        deadline = time.monotonic() + 60  # the process's start-up on a busy machine, not a timing assertion
        while not waiting and proc.poll() is None and time.monotonic() < deadline:
            waiting = watcher.execute(text(_WAITING_FOR_SNAPSHOTS)).scalar_one()
            watcher.rollback()
            time.sleep(0.05)
        # Read while the holder still holds the lock: the process has ended, so the cancel, not the lock's
        # release, let it go (before, this waited until timeout_s and the process was killed).
        out, err = signalled(proc, signum, timeout_s=60)
        still_waiting = watcher.execute(text(_WAITING_FOR_SNAPSHOTS)).scalar_one()
        watcher.rollback()
        holder.rollback()
    assert waiting == 1, (out, err)
    assert proc.returncode == code, err
    assert still_waiting == 0
    assert err.strip().splitlines() == [
        f"{said} after every hour was rolled up: the snapshots (idle claims, quotas, pending demand) and occupancy "
        "counts not taken yet are taken by the next run of the jobs"]
    with ledger_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM usage_rollups")).scalar_one() > 0
        assert conn.execute(text("SELECT count(*) FROM idle_claim_snapshots")).scalar_one() == 0


_WAITING_FOR_SNAPSHOTS = ("SELECT count(*) FROM pg_locks WHERE relation = 'idle_claim_snapshots'::regclass "
                          "AND NOT granted")
