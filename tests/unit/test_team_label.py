"""Which namespace label names a team when objects are recorded: the configuration file's ``teams.label``,
else ``LEDGER_TEAM_LABEL``, else ``team``; the two disagreeing is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import services
from ledger.config import load_config
from ledger.errors import Invalid
from ledger.settings import Settings


@pytest.mark.parametrize(("file_label", "env_label", "expected"), [
    (None, None, "team"),
    ("cost-center", None, "cost-center"),
    (None, "owner", "owner"),
    ("owner", "owner", "owner"),
    ("team", None, "team"),
])
def test_the_label_comes_from_the_file_else_the_environment_else_team(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_label: str | None, env_label: str | None,
        expected: str) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text("" if file_label is None else f'[teams]\nlabel = "{file_label}"\n', encoding="utf-8")
    monkeypatch.delenv("LEDGER_TEAM_LABEL", raising=False)
    if env_label is not None:
        monkeypatch.setenv("LEDGER_TEAM_LABEL", env_label)

    chosen = services.translator_settings(Settings(), load_config(path), config_path=path)

    assert chosen.team_label == expected


def test_a_file_and_an_environment_that_name_different_labels_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text("teams:\n  label: cost-center\n", encoding="utf-8")
    monkeypatch.setenv("LEDGER_TEAM_LABEL", "team")  # the default's value, but set: still a second answer

    with pytest.raises(Invalid, match=f"LEDGER_TEAM_LABEL is 'team' but teams.label in {path} is 'cost-center'"):
        services.translator_settings(Settings(), load_config(path), config_path=path)


def test_a_file_label_that_is_no_label_key_is_refused_as_the_environment_variable_is(tmp_path: Path) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text('[teams]\nlabel = "cost center"\n', encoding="utf-8")

    with pytest.raises(Invalid, match=r"teams\.label: .*is not a label key"):
        load_config(path)


@pytest.mark.parametrize(("label", "taken"), [
    ("a" * 63, True), ("a" * 64, False),  # the name part: at most 63, as Kubernetes allows
    ("b" * 253 + "/team", True), ("b" * 254 + "/team", False),  # the prefix: at most 253
    ("example.com/" + "c" * 63, True), ("example.com/" + "c" * 64, False),
])
def test_a_label_key_longer_than_kubernetes_allows_in_either_part_is_refused(tmp_path: Path, label: str,
                                                                             taken: bool) -> None:
    path = tmp_path / "ledger.toml"
    path.write_text(f'[teams]\nlabel = "{label}"\n', encoding="utf-8")

    if taken:
        assert load_config(path).teams.label == label
    else:
        with pytest.raises(Invalid, match="the name after '/' at most 63 characters, the prefix before it at most 253"):
            load_config(path)
