"""``[[api.tokens]]``: one entry per token and per name, refused by naming the entries, never the token itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.config import LedgerConfig, load_config
from ledger.errors import Invalid
from tests.factories import config_error

SECRET = "0123456789abcdef"


def _entry(name: str, source: str, teams: str = "") -> str:
    return f'[[api.tokens]]\nname = "{name}"\n{source}\n{teams}\n'


LIMITED = _entry("a", f'token = "{SECRET}"', 'teams = ["nlp"]')
UNLIMITED = _entry("b", f'token = "{SECRET}"')


@pytest.mark.parametrize(("body", "first", "second"), [
    (LIMITED + UNLIMITED, "api.tokens[0] 'a'", "api.tokens[1] 'b'"),
    (UNLIMITED + LIMITED, "api.tokens[0] 'b'", "api.tokens[1] 'a'"),  # the order decided the token's access
])
def test_two_entries_with_one_token_are_refused_naming_both_but_not_the_token(tmp_path: Path, body: str,
                                                                               first: str, second: str) -> None:
    message = config_error(tmp_path, body)

    assert f"api.tokens: {first} and {second} have the same token" in message
    assert SECRET not in message


def test_one_token_environment_variable_named_by_two_entries_is_refused_without_reading_it(tmp_path: Path) -> None:
    shared = 'tokenEnv = "SHARED_TOKEN"'  # unset: the names alone say the two entries are one token
    message = config_error(tmp_path, _entry("a", shared) + _entry("b", shared))

    assert ("api.tokens[0] 'a' (tokenEnv SHARED_TOKEN) and api.tokens[1] 'b' (tokenEnv SHARED_TOKEN) have the same "
            "token") in message


@pytest.mark.parametrize(("first", "second", "says"), [
    ('tokenEnv = "TOKEN_A"', 'tokenEnv = "TOKEN_B"',
     "api.tokens[0] 'a' (tokenEnv TOKEN_A) and api.tokens[1] 'b' (tokenEnv TOKEN_B) have the same token"),
    (f'token = "{SECRET}"', 'tokenEnv = "TOKEN_B"',
     "api.tokens[0] 'a' and api.tokens[1] 'b' (tokenEnv TOKEN_B) have the same token"),
])
def test_two_entries_whose_tokens_turn_out_equal_when_read_from_the_environment_are_refused(
        first: str, second: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN_A", SECRET)
    monkeypatch.setenv("TOKEN_B", SECRET)
    path = tmp_path / "ledger.toml"
    path.write_text(_entry("a", first) + _entry("b", second), encoding="utf-8")
    config = load_config(path)  # the values are not known until the variables are read

    with pytest.raises(Invalid) as caught:
        config.api.secrets()

    assert str(caught.value).startswith(f"api.tokens: {says}")
    assert SECRET not in str(caught.value)


def test_a_token_name_given_twice_is_refused_naming_both_entries(tmp_path: Path) -> None:
    message = config_error(tmp_path, _entry("a", f'token = "{SECRET}"') + _entry("a", f'token = "{SECRET}x"'))

    assert "api.tokens: the name 'a' is given twice (api.tokens[0] and api.tokens[1])" in message


def test_distinct_tokens_and_names_still_load_in_order() -> None:
    config = LedgerConfig.model_validate({"api": {"tokens": [
        {"name": "a", "token": SECRET, "teams": ["nlp"]},
        {"name": "A", "token": SECRET + "x"},  # names are compared as written, as team names are
    ]}})

    assert config.api.secrets() == [SECRET, SECRET + "x"]


@pytest.mark.parametrize("token", [f" {SECRET}", f"{SECRET}\\n", " " * 16])  # the second: TOML's escape of a line end
def test_a_token_padded_with_blanks_which_no_request_could_present_is_refused(tmp_path: Path, token: str) -> None:
    message = config_error(tmp_path, _entry("a", f'token = "{token}"'))

    assert message.endswith("api.tokens.0.token: a blank at the start or the end (a line end, perhaps): the API "
                            "strips the token a request sends, so this one could never be presented")
    assert SECRET not in message


def test_a_token_variable_padded_with_blanks_is_refused_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_A_FILE", f"{SECRET}\n")  # a Secret made from a file that ends in a line end
    config = LedgerConfig.model_validate({"api": {"tokens": [{"name": "a", "tokenEnv": "FROM_A_FILE"}]}})

    with pytest.raises(Invalid, match=r"^api\.tokens\[a\]: environment variable FROM_A_FILE has a blank at the "
                                      r"start or the end") as caught:
        config.api.secrets()

    assert SECRET not in str(caught.value)


def test_an_empty_teams_list_is_refused_rather_than_read_as_every_team_or_none(tmp_path: Path) -> None:
    message = config_error(tmp_path, _entry("a", f'token = "{SECRET}"', "teams = []"))

    assert message.endswith("api.tokens.0.teams: an empty list: leave teams out for a token that sees every team, "
                            "or list the teams it sees")


def test_a_yaml_teams_key_left_empty_is_refused_rather_than_read_as_every_team(tmp_path: Path) -> None:
    # `teams:` whose items were commented out reads as null in YAML: it used to mean every team (and /v1/events).
    path = tmp_path / "ledger.yaml"
    path.write_text(f"api:\n  tokens:\n  - name: a\n    token: {SECRET}\n    teams:\n    # - vision\n",
                    encoding="utf-8")
    with pytest.raises(Invalid) as caught:
        load_config(path)

    assert str(caught.value).endswith("api.tokens.0.teams: empty (null): leave teams out for a token that sees every "
                                      "team, or list the teams it sees")
    # Left out, the key still means every team.
    path.write_text(f"api:\n  tokens:\n  - name: a\n    token: {SECRET}\n", encoding="utf-8")
    assert load_config(path).api.tokens[0].teams is None


@pytest.mark.parametrize("token", [SECRET + "Ä", SECRET + "\\u0000", SECRET + "\\t1"])
def test_a_token_no_http_client_could_send_as_written_is_refused(tmp_path: Path, token: str) -> None:
    message = config_error(tmp_path, _entry("a", f'token = "{token}"'))

    assert "api.tokens.0.token: a character outside printable ASCII" in message
    assert SECRET not in message


def test_a_token_variable_with_a_non_ascii_character_is_refused_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCENTED", SECRET + "é")
    config = LedgerConfig.model_validate({"api": {"tokens": [{"name": "a", "tokenEnv": "ACCENTED"}]}})

    with pytest.raises(Invalid, match=r"^api\.tokens\[a\]: environment variable ACCENTED has a character outside "
                                      r"printable ASCII") as caught:
        config.api.secrets()

    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(("name", "reason"), [
    ("", "empty: name the environment variable that holds the token"),
    ("TOKEN=x", "'TOKEN=x' is refused as an environment variable name: use printable ASCII without blanks or '='"),
    ("MY TOKEN", "'MY TOKEN' is refused as an environment variable name: use printable ASCII without blanks or '='"),
    ("TÖKEN", "'TÖKEN' is refused as an environment variable name: use printable ASCII without blanks or '='"),
])
def test_a_token_variable_name_no_environment_could_hold_is_refused_in_the_file(tmp_path: Path, name: str,
                                                                               reason: str) -> None:
    message = config_error(tmp_path, _entry("a", f'tokenEnv = "{name}"'))

    assert message.endswith(f"api.tokens.0.tokenEnv: {reason}")
