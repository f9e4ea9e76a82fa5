"""``dra-ledger serve``: refuses to be open to the network without tokens; the demo serves the API."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import typer
from litestar.testing import TestClient
from sqlalchemy import text
from typer.testing import CliRunner

from api.app import WORKER_SPEC_ENV, WorkerSpec, create_app, create_app_for_worker
from api.cli import register, serve_api
from api.server import LifespanEndsOnCancel
from ledger import cli
from ledger.config import DEFAULT, LedgerConfig, load_config
from ledger.errors import Invalid, LedgerError
from ledger.settings import Settings
from ledger.store.database import LedgerDatabase
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI, free_port, run_while_locked, served_api, taken_port


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_serving_without_tokens_on_a_non_loopback_address_is_refused(host: str) -> None:
    # Addresses every machine can listen on (every interface): the host is checked first, so one that is not
    # this machine's is named as the problem instead (tests/unit/test_cli_ports.py).
    with pytest.raises(LedgerError, match="no API tokens are configured: refusing to serve"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host=host, port=free_port(),
                  allow_open=False)


@pytest.fixture()
def registered() -> Iterator[tuple[typer.Typer, int]]:
    """A Typer app with the API's commands registered, and how many demo follow-ups there were before."""
    app = typer.Typer()
    before = len(cli.DEMO_FOLLOWUPS)
    register(app)
    try:
        yield app, before
    finally:
        del cli.DEMO_FOLLOWUPS[before:]


def test_registering_adds_serve_and_makes_the_demo_serve_the_api(registered: tuple[typer.Typer, int]) -> None:
    app, before = registered
    assert [c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands] == ["serve"]
    assert len(cli.DEMO_FOLLOWUPS) == before + 1


def test_a_port_another_process_listens_on_is_a_clear_error_before_the_database_is_touched() -> None:
    # The database URL leads nowhere: the port check must come first and name what to do.
    with taken_port() as port, pytest.raises(LedgerError, match=f"cannot listen on 127.0.0.1:{port}: .*pass --port"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host="127.0.0.1", port=port,
                  allow_open=False)


def test_the_demo_serves_on_its_port_option(registered: tuple[typer.Typer, int]) -> None:
    followup = cli.DEMO_FOLLOWUPS[registered[1]]
    # A taken port: serve_api stops at its port check, naming the port it was given.
    with taken_port() as port, pytest.raises(LedgerError, match=f"127.0.0.1:{port}"):
        followup(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), port)


def test_an_empty_cluster_is_refused_before_the_database_is_touched() -> None:
    # An empty name would filter on a cluster called "" and serve nothing; the URL leads nowhere on purpose.
    with pytest.raises(LedgerError, match=r"^--cluster is empty; leave it out to serve every cluster$"):
        serve_api(Settings(database_url="postgresql://nobody@127.0.0.1:1/none"), host="127.0.0.1", port=8472,
                  allow_open=False, cluster="")


def _children(pid: int) -> dict[int, str]:
    """Pid and command line of each live process whose parent is ``pid`` (from ``/proc``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue  # gone meanwhile, or not a process
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="counts worker processes through /proc")
def test_serving_with_two_workers_answers_from_two_processes_what_one_answers(seeded: LedgerHandle) -> None:
    urls = ["/v1/occupancy?at=2026-11-02T09:30:00Z", "/v1/usage?from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z",
            "/v1/occupancy?limit=0"]
    with served_api("--workers", "2", "--cluster", seeded.cluster, database_url=seeded.db.url) as server:
        workers = [pid for pid, command in _children(server.process.pid).items() if "spawn_main" in command]
        served = [httpx.get(server.base + url, timeout=30) for url in urls for _ in range(4)]
        with seeded.engine.connect() as conn:  # the workers' pooled sessions, named for the command as serve's are
            named = set(conn.execute(text(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()")).scalars())
        # h11's limit on a request head still incomplete past 16 KiB, before any token or route: a 1 MiB header
        # (many reads) is refused; the server closes the connection, so the client may see the 400 or a reset.
        try:
            big_head: int | str = httpx.get(f"{server.base}/healthz", headers={"X-Padding": "x" * 2**20}, timeout=30
                                            ).status_code
        except httpx.TransportError as e:
            big_head = type(e).__name__
    output = server.output
    assert len(workers) == 2, (workers, output)
    # serve's own engine is disposed before the workers start, and this test's sessions carry the default name.
    assert named - {"dra-ledger"} == {"dra-ledger serve"}
    assert big_head in (400, "ReadError", "WriteError", "RemoteProtocolError"), big_head
    assert "2 worker processes" in output
    with TestClient(create_app(db=seeded.db, config=DEFAULT, cluster=seeded.cluster)) as client:
        expected = [client.get(url) for url in urls for _ in range(4)]
    assert [r.status_code for r in served] == [r.status_code for r in expected] == [200] * 8 + [422] * 4
    assert served[0].json()["at"] == "2026-11-02T09:30:00Z" and served[0].json()["totals"]["devices"] > 0
    assert [r.json() for r in served] == [r.json() for r in expected]
    assert server.process.returncode == 0
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]  # Ctrl-C stopped the workers too


def test_serve_names_a_database_it_cannot_use_in_one_line_and_exits_2() -> None:
    result = subprocess.run([*CLI, "serve", "--port", str(free_port()), "--database-url",
                             "postgresql://nobody@127.0.0.1:1/none"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: database unavailable: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


TWIN = "twin-token-0123456789"


@pytest.mark.parametrize("source", ["token", "tokenEnv"])
def test_two_token_entries_with_one_value_start_no_server_and_no_app(source: str, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The user's case: "a" limited to nlp, "b" unlimited, one token; the last entry's access used to win.
    monkeypatch.setenv("TOKEN_A", TWIN)
    monkeypatch.setenv("TOKEN_B", TWIN)
    a, b = (f'token = "{TWIN}"',) * 2 if source == "token" else ('tokenEnv = "TOKEN_A"', 'tokenEnv = "TOKEN_B"')
    path = tmp_path / "c7.toml"
    path.write_text(f'[[api.tokens]]\nname = "a"\n{a}\nteams = ["nlp"]\n\n[[api.tokens]]\nname = "b"\n{b}\n')

    # The database URL leads nowhere: the tokens are refused before it is tried, and nothing listens.
    result = subprocess.run([*CLI, "serve", "--config", str(path), "--port", str(free_port()), "--database-url",
                             "postgresql://nobody@127.0.0.1:1/none"], capture_output=True, text=True, timeout=120)

    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "api.tokens[0] 'a'" in result.stderr and "api.tokens[1] 'b'" in result.stderr
    assert "have the same token" in result.stderr
    assert TWIN not in result.stderr + result.stdout
    with pytest.raises(Invalid, match=r"api\.tokens\[0\] 'a'.* and api\.tokens\[1\] 'b'.* have the same token"):
        create_app(db=LedgerDatabase.from_url("postgresql://nobody@127.0.0.1:1/none"), config=load_config(path))


TOKEN = "worker-token-0123456789"


def test_a_worker_answers_with_the_configuration_serve_read_even_after_the_file_changed(
        seeded: LedgerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(f'[[api.tokens]]\nname = "ops"\ntoken = "{TOKEN}"\n\n'
                    '[teams.overrides]\n"ml-serve" = "research"\n')
    config = load_config(path)
    monkeypatch.setenv(WORKER_SPEC_ENV, WorkerSpec(database_url=seeded.db.url, cluster=None,
                                                   config=config.model_dump_json(by_alias=True)).to_json())
    path.write_text('[[api.tokens]]\nname = "ops"\ntoken = "another-token-0123456789"\nbogus = 1\n')  # edited later
    with TestClient(create_app_for_worker()) as client:
        assert client.get("/v1/occupancy").status_code == 401
        assert client.get("/v1/occupancy", headers={"Authorization": "Bearer another-token-0123456789"}
                          ).status_code == 401
        answer = client.get("/v1/usage?from=2026-11-02T00:00:00Z&to=2026-11-03T00:00:00Z&groupBy=team",
                            headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200, answer.text
    assert {row["team"] for row in answer.json()["rows"]} >= {"research"}  # the override serve read


def test_the_whole_configuration_survives_the_hand_over_to_the_workers() -> None:
    config = load_config(Path(__file__).resolve().parents[2] / "deploy" / "ledger.toml")
    assert config.quotas and config.prices and config.device_class_mappings  # a configuration using every part
    assert LedgerConfig.model_validate_json(config.model_dump_json(by_alias=True)) == config


@pytest.mark.parametrize("spec", [None, "not json", '{"databaseUrl": "postgresql://x@h/d", "cluster": null}',
                                  '{"databaseUrl": "postgresql://x@h/d", "cluster": null, "config": "{\\"x\\": 1}"}'])
def test_a_worker_without_a_spec_serve_wrote_is_refused_by_name(spec: str | None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if spec is None:
        monkeypatch.delenv(WORKER_SPEC_ENV, raising=False)
    else:
        monkeypatch.setenv(WORKER_SPEC_ENV, spec)
    with pytest.raises(Invalid, match=f"^{WORKER_SPEC_ENV}"):
        create_app_for_worker()


def test_serving_a_cluster_the_ledger_holds_nothing_of_warns_and_serves(
        ledger: LedgerHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import uvicorn

    import api.app
    from tests.paths import HISTORIES

    ledger.replay(HISTORIES / "seed-lab.jsonl")
    served: list[object] = []
    # Neither built nor run: a Litestar app sets up logging to the stderr of the moment, which capsys closes after.
    monkeypatch.setattr(api.app, "create_app", lambda **kwargs: kwargs["cluster"])
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(_app_in(app)))
    settings = Settings(database_url=ledger.db.url)

    serve_api(settings, host="127.0.0.1", port=free_port(), allow_open=False, cluster="nope")
    serve_api(settings, host="127.0.0.1", port=free_port(), allow_open=False, cluster=ledger.cluster)

    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert ("warning: the ledger holds no event of cluster 'nope' yet: every answer will be empty until something "
            "is recorded under that name") in err
    assert served == ["nope", ledger.cluster]  # served anyway: the workers may record it later


def _app_in(served: object) -> object:
    """What ``serve`` built the served app from: uvicorn is handed :func:`api.app.create_app`'s app in a wrapper."""
    assert isinstance(served, LifespanEndsOnCancel)
    return served.app


def test_serve_and_quotas_warn_of_a_quota_for_a_cluster_the_ledger_never_recorded(
        ledger: LedgerHandle, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    import uvicorn

    import api.app
    from tests.paths import HISTORIES

    ledger.replay(HISTORIES / "seed-lab.jsonl")
    served: list[object] = []
    monkeypatch.setattr(api.app, "create_app", lambda **kwargs: kwargs["cluster"])
    monkeypatch.setattr(uvicorn, "run", lambda app, **_: served.append(_app_in(app)))
    path = tmp_path / "ledger.toml"
    quota = '[[quotas]]\ncluster = "{}"\nteam = "vision"\nresourceName = "example.com/gpu"\nnominalQuota = 3\n'
    path.write_text(quota.format("lab-2") + quota.format(ledger.cluster) + quota.format("lab-0"))
    warnings = [f"warning: [[quotas]] names cluster {name!r}, which the ledger holds no event of: its quotas show no "
                "row until something is recorded under that name" for name in ("lab-0", "lab-2")]

    serve_api(Settings(database_url=ledger.db.url, config=path), host="127.0.0.1", port=free_port(), allow_open=False)
    quotas = CliRunner().invoke(cli.app, ["quotas", "--config", str(path), "--database-url", ledger.db.url,
                                      "--output", "json"])

    assert served == [None]  # served all the same
    assert capsys.readouterr().err.splitlines()[:2] == warnings
    assert quotas.exit_code == 0, quotas.output
    assert quotas.stderr.splitlines() == warnings
    # The recorded cluster's quota has its row; the two others none.
    assert [(r["cluster"], r["nominalQuota"]) for r in json.loads(quotas.stdout)["rows"]
            if r["resourceName"] == "example.com/gpu"] == [(ledger.cluster, 3.0)]


def test_an_unset_token_variable_is_named_with_the_configuration_file_it_comes_from(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[[api.tokens]]\nname = "chargeback"\ntokenEnv = "DRA_LEDGER_TEST_UNSET_TOKEN"\n')
    env = {k: v for k, v in os.environ.items() if k != "DRA_LEDGER_TEST_UNSET_TOKEN"}

    result = subprocess.run([*CLI, "serve", "--config", str(path), "--port", str(free_port()), "--database-url",
                             "postgresql://nobody@127.0.0.1:1/none"], capture_output=True, text=True, timeout=120,
                            env=env)

    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"error: {path}: api.tokens[chargeback]: environment variable "
                                     "DRA_LEDGER_TEST_UNSET_TOKEN is unset or shorter than 16 characters")


def test_serve_says_how_many_events_it_applies_before_it_listens(ledger: LedgerHandle,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # A ledger whose read models are behind (the seed lab's 51 events recorded, none applied) stands for one far
    # behind: serve caught it up for ~40 s without a word before it listened. uvicorn is stopped where it would
    # start listening; what serve said before is what an operator sees.
    import uvicorn

    from ledger import services
    from tests.paths import HISTORIES

    class Listening(Exception):
        pass

    def listening(*args: object, **kwargs: object) -> None:
        raise Listening

    assert services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=ledger.cluster,
                                 catch_up=False).events == 51
    monkeypatch.setattr(cli, "PROGRESS_MIN_LINES", 10)  # 51 events stand for a large backlog
    monkeypatch.setattr(uvicorn, "run", listening)
    with pytest.raises(Listening):
        serve_api(Settings(database_url=ledger.db.url), host="127.0.0.1", port=free_port(), allow_open=False)

    said = capsys.readouterr().err.splitlines()
    assert said[0] == "read models: applying 51 events ..."
    assert said[-2].startswith("read models: 51 events applied in ")
    assert said[-1].startswith("dra-ledger API on http://127.0.0.1:")
    assert services.events_to_apply(ledger.db) == 0


def test_serve_stopped_while_it_applies_events_says_what_was_kept(ledger: LedgerHandle) -> None:
    # The server's lock_timeout, with another session holding a read model, stops the catch-up serve runs before it
    # listens: the error line came alone, where a replay stopped there says what was kept.
    from ledger import services
    from tests.paths import HISTORIES

    assert services.replay_files(ledger.db, [HISTORIES / "seed-lab.jsonl"], cluster=ledger.cluster,
                                 catch_up=False).events == 51
    result = run_while_locked(ledger.db.engine, "LOCK TABLE claims IN ACCESS EXCLUSIVE MODE",
                              [*CLI, "serve", "--port", str(free_port()), "--database-url", ledger.db.url],
                              "lock_timeout=300")

    assert result.returncode == 2, result.stderr
    error, kept = result.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: the database cancelled a statement: canceling statement due to lock timeout (")
    assert kept == ("stopped before the server listened, while applying events to the read models: the batches "
                    "applied so far are kept with their checkpoints; the next command that reads them, or a running "
                    "`serve`, applies the rest")
    assert "dra-ledger API on" not in result.stderr


@pytest.mark.parametrize(("given", "said"), [
    ("0.05", "0.05 s is too short: 0 for none, else 0.1 to 3600 seconds"),  # 1e-9 kept a core busy
    ("3601", "less than or equal to 3600"),
    ("1e308", "less than or equal to 3600"),  # read as never, silently
    ("-1", "greater than or equal to 0"),
    ("nan", "finite number"),
])
def test_a_catch_up_interval_out_of_range_is_refused_before_the_database_is_touched(
        registered: tuple[typer.Typer, int], given: str, said: str) -> None:
    result = CliRunner().invoke(registered[0], ["--catch-up-interval", given, "--database-url",
                                                "postgresql://nobody@127.0.0.1:1/none"])
    assert result.exit_code == 2
    assert said in " ".join(result.output.replace("│", " ").split())
    assert "database" not in result.output
