"""``record``, ``watch`` and ``fake-apiserver`` refuse bad input on one line with exit code 2, naming what is
wrong: an output that cannot be written or a duration not above 0 before the cluster is contacted, a kubeconfig
that is not one by its file name, a history that is a directory as a directory."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import config as k8s_config
from typer.testing import CliRunner, Result

from ledger.testing.handle import LedgerHandle
from tests.factories import plugin_commands, taken_port
from tests.workers.harness import SEED_LAB, kubeconfig
from workers.cli import api_client_for
from workers.testing import ThreadedFakeApiServer

Start = Callable[..., ThreadedFakeApiServer]
WIDE = {"COLUMNS": "300"}
"""A terminal wide enough that Typer's error box keeps each message on one line."""


def _invoke(args: list[str]) -> Result:
    with plugin_commands() as app:
        return CliRunner().invoke(app, args, env=WIDE)


def test_record_into_a_folder_that_does_not_exist_is_refused_before_the_cluster_is_contacted(
        fake_apiserver: Start, tmp_path: Path) -> None:
    server = fake_apiserver(SEED_LAB)
    out = tmp_path / "nonexistent-dir" / "x.jsonl"

    result = _invoke(["record", "--kubeconfig", str(kubeconfig(tmp_path / "kc", server.url)), "--output", str(out),
                      "--duration", "1"])

    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: cannot write {out}: no such directory: {out.parent}"
    assert server.requests == []  # not even discovery
    assert not out.parent.exists()


def test_record_with_an_empty_output_is_refused_by_name(fake_apiserver: Start, tmp_path: Path) -> None:
    server = fake_apiserver(SEED_LAB)

    result = _invoke(["record", "--kubeconfig", str(kubeconfig(tmp_path / "kc", server.url)), "--output", ""])

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--output' / '-o': is empty; give the file to write" in " ".join(result.output.split())
    assert server.requests == []


def test_record_onto_a_directory_is_refused(fake_apiserver: Start, tmp_path: Path) -> None:
    server = fake_apiserver(SEED_LAB)

    result = _invoke(["record", "--kubeconfig", str(kubeconfig(tmp_path / "kc", server.url)), "--output",
                      str(tmp_path)])

    assert result.exit_code == 2, result.output
    assert f"error: cannot write {tmp_path}: it is a directory" in result.output
    assert server.requests == []


def test_record_onto_a_recording_is_refused_unless_appending_and_appends_after_a_cut_line(
        fake_apiserver: Start, ledger: LedgerHandle, tmp_path: Path) -> None:
    # A restarted recorder emptied the file it had recorded into. Its first session was killed inside a line.
    server = fake_apiserver(SEED_LAB)
    server.advance(None)  # the whole history is there to list
    out = tmp_path / "recorded.jsonl"
    lines = SEED_LAB.read_text(encoding="utf-8").splitlines(keepends=True)
    earlier = "".join(lines[:3]) + lines[3][:40]  # three lines, then a line cut short
    out.write_text(earlier, encoding="utf-8")
    config = str(kubeconfig(tmp_path / "kc", server.url))

    refused = _invoke(["record", "--kubeconfig", config, "--output", str(out), "--duration", "1"])

    assert refused.exit_code == 2, refused.output
    assert refused.output.strip() == (
        f"error: cannot write {out}: it is not empty ({len(earlier.encode())} bytes); pass --append to go on with the "
        "recording in it (replay reads the two sessions as one history), or remove it first")
    assert server.requests == []
    assert out.read_text(encoding="utf-8") == earlier

    appended = _invoke(["record", "--kubeconfig", config, "--output", str(out), "--duration", "1", "--append"])

    assert appended.exit_code == 0, appended.output
    text = out.read_text(encoding="utf-8")
    assert text.startswith(earlier + "\n")
    session = text[len(earlier) + 1:].splitlines()
    assert len(session) >= 10  # the second session's list of every object: namespaces, class, slice, claims, pods
    report = ledger.replay(out)
    assert [r.origin for r in report.rejected] == [f"{out}:4"]  # the cut line alone; the lines around it recorded
    assert (report.lines, report.recorded) == (4 + len(session), 3 + len(session))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any directory")
def test_record_into_a_folder_it_may_not_write_is_refused(fake_apiserver: Start, tmp_path: Path) -> None:
    server = fake_apiserver(SEED_LAB)
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)

    result = _invoke(["record", "--kubeconfig", str(kubeconfig(tmp_path / "kc", server.url)), "--output",
                      str(folder / "x.jsonl")])

    assert result.exit_code == 2, result.output
    assert f"error: cannot write {folder / 'x.jsonl'}: the directory {folder} is not writable" in result.output
    assert server.requests == []


@pytest.mark.parametrize(("duration", "said"), [
    ("-5", "Input should be greater than 0"),
    ("0", "Input should be greater than 0"),
    ("nan", "Input should be a finite number"),
    ("inf", "Input should be a finite number"),
])
def test_record_refuses_a_duration_that_is_not_a_finite_number_above_zero(
        fake_apiserver: Start, tmp_path: Path, duration: str, said: str) -> None:
    server = fake_apiserver(SEED_LAB)
    out = tmp_path / "x.jsonl"

    result = _invoke(["record", "--kubeconfig", str(kubeconfig(tmp_path / "kc", server.url)), "--output", str(out),
                      "--duration", duration])

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '--duration': {said}" in result.output
    assert server.requests == []
    assert not out.exists()


BAD_KUBECONFIGS = [
    ("apiVersion: v1\nclusters: [{name: fake\n",
     "is not valid YAML: while parsing a flow mapping: expected ',' or '}', but got '<stream end>' "
     "(line 3, column 1)"),
    ("apiVersion: v1\nclusters: {name: fake, cluster: {server: http://x}\n", "is not valid YAML: "),
    ("- one\n- two\n", "is not a kubeconfig (a YAML mapping of clusters, users and contexts)"),
    ("", "is not a kubeconfig (a YAML mapping of clusters, users and contexts)"),
]


@pytest.mark.parametrize(("text", "said"), BAD_KUBECONFIGS)
def test_record_names_a_kubeconfig_that_is_not_one(tmp_path: Path, text: str, said: str) -> None:
    bad = tmp_path / "kube.yaml"
    bad.write_text(text, encoding="utf-8")

    result = _invoke(["record", "--kubeconfig", str(bad), "--output", str(tmp_path / "x.jsonl")])

    assert result.exit_code == 2, result.output
    assert f"error: ConfigException: kubeconfig {bad} {said}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("text", "said"), BAD_KUBECONFIGS)
def test_the_client_of_watch_and_record_names_a_kubeconfig_that_is_not_one(tmp_path: Path, text: str,
                                                                             said: str) -> None:
    bad = tmp_path / "kube.yaml"
    bad.write_text(text, encoding="utf-8")

    with pytest.raises(k8s_config.ConfigException) as refused:
        asyncio.run(api_client_for(bad, None))

    assert f"kubeconfig {bad} {said}" in str(refused.value)


@pytest.mark.parametrize(("server", "said"), [
    ("not a url", "is not an http(s) URL with a host"),
    ("127.0.0.1:6443", "is not an http(s) URL with a host"),  # no scheme: kubernetes-asyncio adds none
    ("ftp://10.0.0.1", "is not an http(s) URL with a host"),
    ("https://", "is not an http(s) URL with a host"),
    ("http://[::1", "is not a URL (Invalid IPv6 URL)"),
    ("http://a b:6443", "has a host 'a b' that is no name nor address"),
])
def test_watch_and_record_refuse_a_cluster_server_that_is_no_url(tmp_path: Path, server: str, said: str) -> None:
    # aiohttp refused each request as an invalid URL, and the worker retried that as a connection fault for ever.
    # watch says so before it opens the ledger: the database named here does not exist.
    config = kubeconfig(tmp_path / "kube.yaml", server)
    out = tmp_path / "x.jsonl"

    watch = _invoke(["watch", "--kubeconfig", str(config), "--health-port", "-1", "--no-leader-election",
                     "--database-url", "postgresql://nobody@127.0.0.1:1/none"])
    record = _invoke(["record", "--kubeconfig", str(config), "--output", str(out)])

    shown = server.rstrip("/")  # as kubernetes-asyncio keeps it
    problem = f"kubeconfig {config}: the cluster's server {shown!r} {said}, such as https://10.0.0.1:6443"
    # Each command's way of naming a bad kubeconfig (watch checks it before the ledger, as it checks the file).
    for result, line in ((watch, f"error: {problem}"), (record, f"error: ConfigException: {problem}")):
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [line]
    assert not out.exists()


def test_record_names_a_kubeconfig_that_is_not_utf_8(tmp_path: Path) -> None:
    bad = tmp_path / "kube.yaml"
    bad.write_bytes(b"\xff\xfeapiVersion: v1\n")  # UTF-16's byte-order mark: 0xff at offset 0

    result = _invoke(["record", "--kubeconfig", str(bad), "--output", str(tmp_path / "x.jsonl")])

    assert result.exit_code == 2, result.output
    assert (f"error: ConfigException: kubeconfig {bad} is not UTF-8 text (byte 0xff at offset 0); a kubeconfig is "
            "YAML, which is UTF-8") in result.output
    assert "Traceback" not in result.output


def test_fake_apiserver_says_a_history_that_is_a_directory_is_one(tmp_path: Path) -> None:
    result = _invoke(["fake-apiserver", "--history", str(tmp_path), "--port", "0"])

    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: {tmp_path} is a directory; give a history file (JSON Lines)"


def test_fake_apiserver_still_says_a_missing_history_is_missing(tmp_path: Path) -> None:
    result = _invoke(["fake-apiserver", "--history", str(tmp_path / "h.jsonl"), "--port", "0"])

    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: no such file: {tmp_path / 'h.jsonl'}"


@pytest.mark.parametrize("command", [["watch", "--cluster", "w1"], ["jobs", "--once"], ["jobs"]])
def test_a_worker_names_a_database_it_cannot_reach_in_one_line_and_exits_2(tmp_path: Path,
                                                                          command: list[str]) -> None:
    import subprocess

    from tests.factories import CLI

    config = kubeconfig(tmp_path / "kubeconfig.yaml", "http://127.0.0.1:1")  # never reached: the ledger is first
    extra = ["--kubeconfig", str(config)] if command[0] == "watch" else []
    result = subprocess.run([*CLI, *command, *extra, "--database-url", "postgresql://nobody@127.0.0.1:1/none"],
                            capture_output=True, text=True, timeout=120)

    # They printed psycopg's traceback and exited 1, where every other command says one line.
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: database unavailable: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_watch_names_a_health_port_in_use_before_it_contacts_the_database_or_the_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_WATCH_HEALTH_HOST", "127.0.0.1")
    config = kubeconfig(tmp_path / "kubeconfig.yaml", "http://127.0.0.1:1")  # never reached
    with taken_port() as port:
        result = _invoke(["watch", "--kubeconfig", str(config), "--health-port", str(port),
                          "--database-url", "postgresql://nobody@127.0.0.1:1/none"])

    # It said "OSError: [Errno 98] error while attempting to bind ..." once connected, then "Unclosed client session".
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: cannot serve the health checks on 127.0.0.1:{port}: Address already in use; another process may hold "
        "the port: stop it or pass --health-port (-1: none)"]


@pytest.mark.parametrize(("election", "grace", "refused"), [
    ("--leader-election", "5", True), ("--leader-election", "4.9", False), ("--no-leader-election", "60", False)])
def test_watch_refuses_a_stop_grace_that_could_outlive_the_lease_with_leader_election(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, election: str, grace: str, refused: bool) -> None:
    # With the default Lease timings (15 s, renewed within 10 s) a standby may take over 5 s after the leader gave
    # up: a grace of 5 s or more let a former leader's write commit while the standby wrote.
    monkeypatch.setenv("LEDGER_WATCH_STOP_GRACE_S", grace)
    config = kubeconfig(tmp_path / "kubeconfig.yaml", "http://127.0.0.1:1")  # never reached
    result = _invoke(["watch", "--kubeconfig", str(config), election, "--health-port", "-1",
                      "--database-url", "postgresql://nobody@127.0.0.1:1/none"])

    assert result.exit_code == 2, result.output
    said = result.output.strip().splitlines()
    if refused:
        assert said == ["error: bad setting: LEDGER_WATCH_STOP_GRACE_S (5 s) must be below "
                        "LEDGER_WATCH_LEASE_DURATION_S - LEDGER_WATCH_RENEW_DEADLINE_S (15 - 10 = 5 s) with leader "
                        "election, so that a former leader's write ends before a standby may take over"]
    else:  # the grace passes; what stops the worker is the database, which the test never gives it
        assert said[0].startswith("error: database unavailable: ")


def test_watch_names_a_renew_deadline_not_below_the_lease_duration(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # It blamed the grace: "LEDGER_WATCH_STOP_GRACE_S (3 s) must be below ... (5 - 10 = -5 s)", even with a grace of 0.
    monkeypatch.setenv("LEDGER_WATCH_LEASE_DURATION_S", "5")
    monkeypatch.setenv("LEDGER_WATCH_RENEW_DEADLINE_S", "10")
    monkeypatch.setenv("LEDGER_WATCH_STOP_GRACE_S", "0")
    config = kubeconfig(tmp_path / "kubeconfig.yaml", "http://127.0.0.1:1")  # never reached
    result = _invoke(["watch", "--kubeconfig", str(config), "--health-port", "-1",
                      "--database-url", "postgresql://nobody@127.0.0.1:1/none"])

    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: bad setting: LEDGER_WATCH_RENEW_DEADLINE_S (10 s) must be below LEDGER_WATCH_LEASE_DURATION_S (5 s), "
        "so that a leader steps down before a standby may take over"]


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("LEDGER_WATCH_REQUEST_TIMEOUT_S", "inf", "Input should be a finite number"),  # aiohttp's OverflowError
    ("LEDGER_WATCH_REQUEST_TIMEOUT_S", "0", "Input should be greater than 0"),
    ("LEDGER_WATCH_SERVER_TIMEOUT_S", "-5", "Input should be greater than or equal to 1"),
    ("LEDGER_WATCH_LIST_PAGE_SIZE", "0", "Input should be greater than or equal to 1"),
    ("LEDGER_WATCH_BATCH_SIZE", "-1", "Input should be greater than or equal to 1"),
    ("LEDGER_WATCH_ERROR_BACKOFFS_S", "[]", "Tuple should have at least 1 item after validation, not 0"),
    ("LEDGER_WATCH_ERROR_BACKOFFS_S", "[0.5, NaN]", "Input should be a finite number"),
    ("LEDGER_WATCH_ERROR_BACKOFFS_S", "1,2", "not a JSON list (write it as [0.5, 1, 5])"),
    ("LEDGER_WATCH_RETRY_PERIOD_S", "0", "Input should be greater than 0"),  # a standby polled the Lease non-stop
    ("LEDGER_WATCH_RENEW_DEADLINE_S", "nan", "Input should be a finite number"),
    ("LEDGER_WATCH_CATCH_UP_INTERVAL_S", "nan", "Input should be a finite number"),  # never caught up, silent
    # the API server refuses these names, and every attempt to take the Lease was retried as transient
    ("LEDGER_WATCH_LEASE_NAME", "Bad_Name!", "'Bad_Name!' is not a Lease name (a DNS subdomain: "
     "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"),
    ("LEDGER_WATCH_LEASE_NAME", "a" * 254, f"'{'a' * 254}' is not a Lease name (a DNS subdomain: "
     "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters)"),
    ("LEDGER_WATCH_LEASE_NAMESPACE", "my.ns", "'my.ns' is not a namespace name (a DNS label: lowercase "
     "letters, digits and '-', starting and ending with a letter or digit, at most 63 characters)"),
    ("LEDGER_JOBS_SNAPSHOT_INTERVAL_S", "0", "Input should be greater than or equal to 10"),
    ("LEDGER_JOBS_ROLLUP_MINUTE", "99", "Input should be less than or equal to 59"),
])
def test_watch_refuses_a_setting_it_cannot_use_in_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    variable: str, value: str, said: str) -> None:
    # Each was taken (and misbehaved later) or ended in a traceback, the jobs' ones after the Lease was taken.
    monkeypatch.setenv(variable, value)
    config = kubeconfig(tmp_path / "kubeconfig.yaml", "http://127.0.0.1:1")  # never reached
    result = _invoke(["watch", "--kubeconfig", str(config), "--health-port", "-1",
                      "--database-url", "postgresql://nobody@127.0.0.1:1/none"])

    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: bad setting: {variable}: {said}"]


@pytest.mark.parametrize("command", [["jobs"], ["jobs", "--once"]])
@pytest.mark.parametrize(("variable", "value", "said"), [
    ("LEDGER_JOBS_SNAPSHOT_INTERVAL_S", "abc", "Input should be a valid integer, unable to parse string as an integer"),
    ("LEDGER_JOBS_COUNTS_INTERVAL_S", "1", "Input should be greater than or equal to 5"),
])
def test_jobs_refuses_a_schedule_it_cannot_use_in_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                     command: list[str], variable: str, value: str,
                                                                     said: str) -> None:
    # A pydantic traceback and exit code 1 when the scheduler was built; --once did not read them at all.
    monkeypatch.setenv(variable, value)
    result = _invoke([*command, "--database-url", "postgresql://nobody@127.0.0.1:1/none"])

    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: bad setting: {variable}: {said}"]


def test_record_refuses_a_watch_setting_it_cannot_use_before_it_opens_the_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # It opened (emptied) the output, then ended in a pydantic traceback naming no variable.
    monkeypatch.setenv("LEDGER_WATCH_REQUEST_TIMEOUT_S", "inf")
    config = kubeconfig(tmp_path / "kubeconfig.yaml", "http://127.0.0.1:1")  # never reached
    output = tmp_path / "out.jsonl"
    result = _invoke(["record", "--output", str(output), "--kubeconfig", str(config)])

    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: bad setting: LEDGER_WATCH_REQUEST_TIMEOUT_S: Input should be a finite number"]
    assert not output.exists()
