"""``dra-ledger watch`` records into the embedded ledger of ``--data-dir``, and refuses a kubeconfig that is not
a file before it opens (and so starts) any ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ledger import embedded
from ledger.embedded import EmbeddedPostgres
from ledger.testing import pg
from tests.factories import plugin_commands

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


def test_watch_opens_the_embedded_ledger_of_its_data_dir(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kube.yaml"
    kubeconfig.write_text("{}\n")  # a file, but no configuration in it: the watch stops once the ledger is open
    with pg.temporary_data_dir() as data_dir:
        try:
            with plugin_commands() as app:
                result = CliRunner().invoke(app, ["watch", "--kubeconfig", str(kubeconfig), "--data-dir",
                                                  str(data_dir), "--no-leader-election", "--health-port", "-1"],
                                            env={**WIDE, "LEDGER_DATABASE_URL": None})

            assert result.exit_code == 2, result.output
            assert "error: ConfigException: Invalid kube-config file" in result.output
            assert embedded.initialised(data_dir)  # the ledger was made in --data-dir
        finally:
            EmbeddedPostgres(data_dir).stop()
