"""Settings no ledger can use are refused with exit code 2 and a message naming them, before any database is
opened: a cluster name padded with blanks, too long or holding a control character (from ``--cluster`` or
``LEDGER_CLUSTER``), ``LEDGER_BATCH_SIZE`` outside 1 to 100,000, and a ``LEDGER_TEAM_LABEL`` that is empty or no
label key. Each was taken without a word before."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from ledger.config import MAX_CLUSTER_NAME
from ledger.settings import MAX_BATCH_SIZE, Settings
from tests.factories import plugin_commands

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"
"""A database URL that leads nowhere: every refusal must come before the database is touched."""
WIDE = {"COLUMNS": "300"}
"""A terminal wide enough that Typer's error box keeps each message on one line."""
RULE = "a cluster name is 1 to 253 characters, with no blank at either end and no control character"


def _replay(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    from ledger.cli import app

    history = tmp_path / "h.jsonl"
    history.write_text("")
    result = CliRunner().invoke(app, ["replay", str(history), "--database-url", NOWHERE, *args],
                                env={**WIDE, **(env or {})})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, " ".join(result.output.split())  # Typer's box may still break a long line


@pytest.mark.parametrize(("name", "said"), [
    (" lab", "' lab' has a blank at the start or the end"),
    ("lab ", "'lab ' has a blank at the start or the end"),
    (" ", "' ' has only blanks"),
    ("lab\tone", "'lab\\tone' has a control character ('\\t')"),
    ("lab\x1b[31m", "'lab\\x1b[31m' has a control character ('\\x1b')"),
    # 300 characters: the name is echoed cut to 100 (its quote, 98 letters, an ellipsis).
    ("a" * 300, "'" + "a" * 97 + "…' has 300 characters"),
])
@pytest.mark.parametrize("source", ["option", "environment"])
def test_replay_refuses_a_cluster_name_no_cluster_may_have(tmp_path: Path, name: str, said: str,
                                                           source: str) -> None:
    code, output = (_replay(tmp_path, "--cluster", name) if source == "option"
                    else _replay(tmp_path, env={"LEDGER_CLUSTER": name}))

    assert code == 2, output
    assert f"Invalid value for --cluster: {said}; {RULE}" in output


def test_the_longest_cluster_name_is_253_characters() -> None:
    assert MAX_CLUSTER_NAME == 253
    assert Settings(cluster="c" * 253).cluster == "c" * 253
    assert Settings(cluster="lab one").cluster == "lab one"  # a blank inside is no padding
    with pytest.raises(ValidationError, match="254 characters"):
        Settings(cluster="c" * 254)


def test_a_query_and_serve_refuse_a_padded_cluster_name_too() -> None:
    from ledger.cli import app

    query = CliRunner().invoke(app, ["occupancy", "--cluster", " lab", "--database-url", NOWHERE], env=WIDE)
    with plugin_commands() as plugins:
        serve = CliRunner().invoke(plugins, ["serve", "--cluster", " lab", "--database-url", NOWHERE], env=WIDE)

    assert query.exit_code == 2, query.output
    assert f"Invalid value for --cluster: ' lab' has a blank at the start or the end; {RULE}" in query.output
    assert serve.exit_code == 2, serve.output
    assert f"error: --cluster: ' lab' has a blank at the start or the end; {RULE}" in serve.output


@pytest.mark.parametrize(("env", "said"), [
    ({"LEDGER_BATCH_SIZE": "0"}, "LEDGER_BATCH_SIZE: Input should be greater than or equal to 1"),
    ({"LEDGER_BATCH_SIZE": "-5"}, "LEDGER_BATCH_SIZE: Input should be greater than or equal to 1"),
    ({"LEDGER_BATCH_SIZE": "100001"}, "LEDGER_BATCH_SIZE: Input should be less than or equal to 100000"),
    ({"LEDGER_TEAM_LABEL": ""}, "LEDGER_TEAM_LABEL: String should have at least 1 character"),
    ({"LEDGER_TEAM_LABEL": " team"}, "LEDGER_TEAM_LABEL: a blank at the start or the end"),
    ({"LEDGER_TEAM_LABEL": "   "}, "LEDGER_TEAM_LABEL: only blanks"),
    ({"LEDGER_TEAM_LABEL": "my team"}, "LEDGER_TEAM_LABEL: 'my team' is not a label key (a Kubernetes qualified name "
                                       "such as team or example.com/team: letters, digits, '-', '_' and '.', no "
                                       "blank; the name after '/' at most 63 characters, the prefix before it at most "
                                       "253)"),
    ({"LEDGER_TEAM_LABEL": "t" * 64}, "LEDGER_TEAM_LABEL: '" + "t" * 64 + "' is not a label key"),
])
def test_replay_refuses_a_batch_size_or_team_label_it_cannot_use(tmp_path: Path, env: dict[str, str],
                                                                  said: str) -> None:
    code, output = _replay(tmp_path, env=env)

    assert code == 2, output
    assert f"error: bad setting: {said}" in output


def test_the_batch_size_bounds_are_1_and_100000() -> None:
    assert MAX_BATCH_SIZE == 100_000
    assert Settings(batch_size=1).batch_size == 1
    assert Settings(batch_size=100_000).batch_size == 100_000
    assert Settings(team_label="example.com/team").team_label == "example.com/team"


@pytest.mark.parametrize(("env", "said"), [
    ({"LEDGER_BATCH_SIZE": "0"}, "error: bad setting: LEDGER_BATCH_SIZE: Input should be greater than or equal to 1"),
    ({"LEDGER_TEAM_LABEL": ""}, "error: bad setting: LEDGER_TEAM_LABEL: String should have at least 1 character"),
    ({"LEDGER_CLUSTER": " lab"}, f"Invalid value for --cluster: ' lab' has a blank at the start or the end; {RULE}"),
])
def test_watch_refuses_the_same_settings_before_the_ledger_is_opened(tmp_path: Path, env: dict[str, str],
                                                                     said: str) -> None:
    kubeconfig = tmp_path / "kube.yaml"
    # A whole kubeconfig (watch loads it before the ledger), of a server never reached: the settings are refused.
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                          "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                          "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    data_dir = tmp_path / "ledger"

    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["watch", "--kubeconfig", str(kubeconfig), "--data-dir", str(data_dir),
                                          "--no-leader-election", "--health-port", "-1"],
                                    env={**WIDE, "LEDGER_DATABASE_URL": None, **env})

    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.split())
    assert not data_dir.exists()


def _replay_into(cwd: Path, args: list[str], env: dict[str, str | None]) -> tuple[int, str]:
    """``replay`` of an empty history run from ``cwd``, the database left to the options and ``env`` alone."""
    from ledger.cli import app

    history = cwd / "h.jsonl"
    history.write_text("")
    runner = CliRunner()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        result = runner.invoke(app, ["replay", str(history), *args],
                               env={**WIDE, "LEDGER_DATABASE_URL": None, "LEDGER_DATA_DIR": None, **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize(("args", "env", "said"), [
    # An empty --data-dir was the path ".": replay made an embedded server in the directory it ran from.
    (["--data-dir", ""], {}, "Invalid value for --data-dir: empty; leave the option out (and LEDGER_DATA_DIR unset)"),
    (["--data-dir", "  "], {}, "Invalid value for --data-dir: empty;"),
    ([], {"LEDGER_DATA_DIR": ""}, "error: bad setting: LEDGER_DATA_DIR: empty; unset the variable for its default"),
    # An empty URL read as unset: the command used an embedded server, not the database meant.
    (["--database-url", ""], {}, "Invalid value for --database-url: empty; leave the option out (and "
                                 "LEDGER_DATABASE_URL unset) for an embedded PostgreSQL"),
    ([], {"LEDGER_DATABASE_URL": " "}, "Invalid value for --database-url: empty;"),
    ([], {"LEDGER_DATABASE_URL": ""}, "error: bad setting: LEDGER_DATABASE_URL: empty;"),
    # An empty --config read "." as the configuration file; an empty LEDGER_CONFIG was taken as unset.
    (["--config", ""], {}, "Invalid value for --config: empty; leave the option out (and LEDGER_CONFIG unset) for "
                           "the built-in defaults"),
    ([], {"LEDGER_CONFIG": ""}, "error: bad setting: LEDGER_CONFIG: empty; unset the variable for its default"),
])
def test_an_empty_data_dir_or_database_url_is_refused_and_nothing_is_made(tmp_path: Path, args: list[str],
                                                                          env: dict[str, str | None],
                                                                          said: str) -> None:
    code, output = _replay_into(tmp_path, args, env)

    assert code == 2, output
    assert said in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl"]  # no data directory made where it ran


def test_a_data_dir_option_still_names_the_directory_it_is_given(tmp_path: Path) -> None:
    # The option is read as text now; a real path passes through unchanged (here one holding no ledger, which
    # a query reports by its name).
    from ledger.cli import app

    missing = tmp_path / "no ledger here"
    result = CliRunner().invoke(app, ["occupancy", "--data-dir", str(missing)],
                                env={**WIDE, "LEDGER_DATABASE_URL": None})
    assert result.exit_code == 2, result.output
    assert str(missing) in " ".join(result.output.split())


@pytest.mark.parametrize("env", [{"LEDGER_DATA_DIR": ""}, {"LEDGER_DATABASE_URL": ""}])
def test_db_stop_refuses_an_empty_variable_rather_than_stopping_the_default_server(tmp_path: Path,
                                                                                  env: dict[str, str]) -> None:
    # It read the empty variable as unset and stopped the default embedded server (a running demo's).
    from ledger.cli import app

    result = CliRunner().invoke(app, ["db", "stop"], env={**WIDE, "LEDGER_DATA_DIR": None, "LEDGER_DATABASE_URL": None,
                                                          **env})

    assert result.exit_code == 2, result.output
    assert f"error: bad setting: {next(iter(env))}: empty; unset the variable for its default" in result.output


@pytest.mark.parametrize("command", [["watch", "--health-port", "-1"], ["jobs", "--once"], ["serve"]])
def test_the_commands_other_packages_register_refuse_an_empty_database_url_and_config(tmp_path: Path,
                                                                                      command: list[str]) -> None:
    # watch declared its own --database-url, which took "" for unset and watched into the default embedded ledger.
    with plugin_commands() as app:
        url = CliRunner().invoke(app, [*command, "--database-url", ""], env={**WIDE, "LEDGER_DATABASE_URL": None})
        config = CliRunner().invoke(app, [*command, "--config", " "], env={**WIDE, "LEDGER_CONFIG": None})

    assert url.exit_code == 2, url.output
    assert "Invalid value for --database-url: empty;" in " ".join(url.output.split())
    assert config.exit_code == 2, config.output
    assert "Invalid value for --config: empty;" in " ".join(config.output.split())


@pytest.mark.parametrize(("suffix", "text"), [
    (".toml", "x = " + "[" * 2000 + "]" * 2000),
    (".yaml", "x: " + "[" * 2000 + "]" * 2000),
    (".yml", "x: " + "{a: " * 2000 + "}" * 2000),
])
def test_a_configuration_file_nested_too_deeply_is_one_line_naming_it_not_a_traceback(tmp_path: Path, suffix: str,
                                                                                     text: str) -> None:
    from ledger.cli import app

    config = tmp_path / f"deep{suffix}"
    config.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["quotas", "--config", str(config), "--database-url", NOWHERE], env=WIDE)

    assert not isinstance(result.exception, RecursionError), result.exception
    assert result.exit_code == 2, result.output
    assert f"{config}: nested too deeply to read" in " ".join(result.output.split())


@pytest.mark.parametrize("command", [["occupancy"], ["replay", "HISTORY"], ["demo", "--no-serve"], ["db", "start"],
                                     ["db", "upgrade"], ["db", "current"], ["rebuild"], ["watch"], ["jobs", "--once"],
                                     ["serve"]])
@pytest.mark.parametrize("source", ["option", "environment"])
def test_a_data_dir_that_is_a_file_is_refused_naming_it_and_the_file_is_left_alone(tmp_path: Path,
                                                                                 command: list[str],
                                                                                 source: str) -> None:
    # It was "cannot read <file>/postmaster.pid: [Errno 20] Not a directory", or advice to record a ledger into it.
    from ledger.cli import app as ledger_app

    afile = tmp_path / "notes.txt"
    afile.write_text("not a ledger\n", encoding="utf-8")
    history = tmp_path / "h.jsonl"
    history.write_text("")
    words = [str(history) if w == "HISTORY" else w for w in command]
    given = ["--data-dir", str(afile)] if source == "option" else []
    env = {**WIDE, "LEDGER_DATABASE_URL": None, "LEDGER_DATA_DIR": str(afile) if source == "environment" else None}
    with plugin_commands() as plugins:
        app = plugins if command[0] in ("watch", "jobs", "serve") else ledger_app
        result = CliRunner().invoke(app, [*words, *given], env=env)

    assert result.exit_code == 2, result.output
    assert (f"error: the data directory {afile} is not a directory (from --data-dir or LEDGER_DATA_DIR): name a "
            "directory, new or holding a ledger") in result.output
    assert afile.read_text(encoding="utf-8") == "not a ledger\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.jsonl", "notes.txt"]
