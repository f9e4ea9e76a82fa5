"""``dra-ledger watch`` records into the embedded ledger of ``--data-dir``, and refuses a kubeconfig that is not
a file before it opens (and so starts) any ledger."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger import cli, embedded
from ledger.embedded import EmbeddedPostgres
from ledger.testing import pg
from tests.factories import CLI, plugin_commands
from tests.workers.harness import FAST_ENV, SEED_LAB, WAIT_S, kubeconfig
from workers.testing import ThreadedFakeApiServer

WIDE = {"COLUMNS": "300"}


def test_watch_refuses_a_missing_kubeconfig_before_it_makes_a_ledger(tmp_path: Path) -> None:
    data_dir, missing = tmp_path / "ledger", tmp_path / "kube.yaml"

    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["watch", "--kubeconfig", str(missing), "--data-dir", str(data_dir),
                                          "--no-leader-election", "--health-port", "-1"], env=WIDE)

    assert result.exit_code == 2, result.output
    assert f"error: kubeconfig {missing} does not exist or is not a file" in result.output
    assert not data_dir.exists()  # no server was made or started there


@pytest.mark.parametrize(("content", "said"), [
    # The tester's file: 0xff can start no UTF-8 sequence; offset 11 is the 12th byte.
    (b"apiVersion:\xff v1\n", "is not UTF-8 text (byte 0xff at offset 11); a kubeconfig is YAML, which is UTF-8"),
    (b"clusters: [{name: fake\n", "is not valid YAML: while parsing a flow mapping: expected ',' or '}', but got "
                                  "'<stream end>' (line 2, column 1)"),
    (b"- one\n- two\n", "is not a kubeconfig (a YAML mapping of clusters, users and contexts): it holds a list"),
    (b"", "is not a kubeconfig (a YAML mapping of clusters, users and contexts): it holds nothing"),
])
def test_watch_refuses_a_kubeconfig_it_cannot_read_as_yaml_before_it_makes_a_ledger(
        tmp_path: Path, content: bytes, said: str) -> None:
    data_dir, bad = tmp_path / "ledger", tmp_path / "kube.yaml"
    bad.write_bytes(content)

    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["watch", "--kubeconfig", str(bad), "--data-dir", str(data_dir),
                                          "--no-leader-election", "--health-port", "-1"],
                                    env={**WIDE, "LEDGER_DATABASE_URL": None})

    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"error: kubeconfig {bad} {said}" in result.output
    assert "UnicodeDecodeError" not in result.output
    assert not data_dir.exists()  # refused before any ledger was made or opened


def test_watch_refuses_a_kubeconfig_with_no_configuration_in_it_before_it_makes_a_ledger(tmp_path: Path) -> None:
    # A mapping, but no context: kubernetes-asyncio refused it only after the ledger was made and started.
    data_dir, empty = tmp_path / "ledger", tmp_path / "kube.yaml"
    empty.write_text("{}\n")

    with plugin_commands() as app:
        result = CliRunner().invoke(app, ["watch", "--kubeconfig", str(empty), "--data-dir", str(data_dir),
                                          "--no-leader-election", "--health-port", "-1"],
                                    env={**WIDE, "LEDGER_DATABASE_URL": None})

    assert result.exit_code == 2, result.output
    assert result.output.strip() == f"error: Invalid kube-config file. Expected key current-context in {empty}"
    assert not data_dir.exists()


def test_watch_records_into_the_embedded_ledger_of_its_data_dir(
        fake_apiserver: Callable[..., ThreadedFakeApiServer], tmp_path: Path) -> None:
    server = fake_apiserver(SEED_LAB)
    server.advance(None)  # the whole history: five claims at its end
    config = kubeconfig(tmp_path / "kube.yaml", server.url)
    env = {k: v for k, v in os.environ.items() if k != "LEDGER_DATABASE_URL"}
    with pg.temporary_data_dir() as data_dir:
        log = tmp_path / "watch.log"
        try:
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [*CLI, "watch", "--kubeconfig", str(config), "--data-dir", str(data_dir), "--no-leader-election",
                     "--no-jobs", "--health-port", "-1", "--clock-url", server.url],
                    stdout=out, stderr=subprocess.STDOUT, env={**env, **FAST_ENV})
            try:
                deadline = time.monotonic() + WAIT_S * 4  # the first start of an embedded server runs initdb
                while b"following ResourceClaim" not in log.read_bytes():
                    assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
                claims: list[str] = []
                while len(claims) < 5:  # the list is recorded once it is read: wait for it
                    assert time.monotonic() < deadline, log.read_text()
                    result = CliRunner().invoke(cli.app, ["claims", "--data-dir", str(data_dir), "--at",
                                                          "2026-11-02T12:00:00Z", "--output", "json"],
                                                env={**WIDE, "LEDGER_DATABASE_URL": None})
                    assert result.exit_code == 0, result.output
                    claims = [c["name"] for c in json.loads(result.stdout)["claims"]]
                    time.sleep(0.2)
            finally:
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=WAIT_S) == 0, log.read_text()
            assert embedded.initialised(data_dir)  # the ledger was made in --data-dir
            assert sorted(claims) == ["big", "ext-0-extended-resources-q9w7d", "pair-0-gpus-m2xzt", "pick-seven",
                                      "shared-gpu"]
        finally:
            EmbeddedPostgres(data_dir).stop()
