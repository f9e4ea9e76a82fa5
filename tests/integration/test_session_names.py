"""Database sessions carry the name of the command that opened them (``pg_stat_activity.application_name``)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from typer.testing import CliRunner

from ledger.cli_typer import LedgerTyper
from ledger.store.postgres import make_engine


def _session_name(url: str) -> str:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SHOW application_name")).scalar_one())
    finally:
        engine.dispose()


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def _probe_app(url: str) -> LedgerTyper:
    """A command line with the ledger's command classes and one command that prints its session's name."""
    app = LedgerTyper()
    report = LedgerTyper()
    app.add_typer(report, name="report")

    @report.command("probe")
    def probe() -> None:
        print(_session_name(url))

    @app.command("other")
    def other() -> None:
        print(_session_name(url))

    return app


def test_a_commands_sessions_are_named_for_the_command_and_only_while_it_runs(ledger_engine: Engine) -> None:
    url = _url(ledger_engine)
    app = _probe_app(url)
    runner = CliRunner()
    result = runner.invoke(app, ["report", "probe"], prog_name="python -c ...")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "dra-ledger report probe"  # the program's name, not how it was started
    assert _session_name(url) == "dra-ledger"  # the name went with the command
    result = runner.invoke(app, ["other"])
    assert result.output.strip() == "dra-ledger other"


def test_an_application_name_in_the_url_or_pgappname_wins(ledger_engine: Engine,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url = _url(ledger_engine)
    sep = "&" if "?" in url else "?"
    assert _session_name(f"{url}{sep}application_name=grafana-sync") == "grafana-sync"
    monkeypatch.setenv("PGAPPNAME", "nightly-chargeback")
    assert _session_name(url) == "nightly-chargeback"
    result = CliRunner().invoke(_probe_app(url), ["other"])
    assert result.output.strip() == "nightly-chargeback"
