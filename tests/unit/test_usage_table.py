"""The usage table of the CLI shows the cost the JSON and CSV carry."""

from __future__ import annotations

import pytest
from rich.console import Console

from ledger import cli
from ledger.types import JSONObject


def body(*rows: JSONObject) -> JSONObject:
    return {"from": "2026-11-02T09:00:00Z", "to": "2026-11-02T12:00:00Z", "groupBy": "team", "rows": list(rows),
            "nextPageToken": None}


ROW: JSONObject = {"team": "ml", "deviceClass": "gpu.example.com", "driver": "gpu.example.com", "deviceHours": 9.3825}


def printed(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], usage: JSONObject) -> list[str]:
    monkeypatch.setattr(cli, "out", Console(width=200, no_color=True))
    cli.render_usage(usage)
    return [" ".join(line.replace("│", " ").replace("┃", " ").split()) for line in capsys.readouterr().out.splitlines()]


def test_priced_rows_print_their_cost_with_the_currency_and_unpriced_rows_a_dash(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # 9.3825 device-hours at 2 USD a device-hour: 18.765, printed to two decimals.
    lines = printed(monkeypatch, capsys, body({**ROW, "cost": 18.765, "currency": "USD"},
                                              {**ROW, "team": "infra", "deviceClass": "nic.example.com",
                                               "driver": "nic.example.com", "deviceHours": 2.0}))

    assert "team deviceClass driver device-hours cost" in lines
    assert "ml gpu.example.com gpu.example.com 9.383 18.77 USD" in lines
    assert "infra nic.example.com nic.example.com 2.000 -" in lines


def test_without_prices_the_table_has_no_cost_column(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    lines = printed(monkeypatch, capsys, body(ROW))

    assert "team deviceClass driver device-hours" in lines
    assert "ml gpu.example.com gpu.example.com 9.383" in lines
    assert not any("cost" in line for line in lines)


def test_a_value_with_control_characters_or_markup_is_printed_as_written_and_harmless(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A model attribute a driver published: an escape that would turn the terminal red and retitle it, and
    # text that Rich would read as markup (printed "b" in bold, the brackets gone).
    model = "A100\x1b[31m\x1b]0;owned\x07 [bold]b[/bold]"
    monkeypatch.setattr(cli, "out", Console(width=200, no_color=True))

    cli.render_usage({**body({**ROW, "model": model}), "groupBy": "model"})

    output = capsys.readouterr().out
    assert "\x1b" not in output and "\x07" not in output
    assert "A100\\x1b[31m\\x1b]0;owned\\x07 [bold]b[/bold]" in output


def test_a_newline_in_a_value_is_escaped_so_it_cannot_draw_a_row_of_its_own(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # A namespace label (the team) a cluster user wrote: on two lines, the second read like another team's row.
    lines = printed(monkeypatch, capsys, body({**ROW, "team": "nlp\ninfra gpu.example.com gpu.example.com 99.000"}))

    assert "nlp\\ninfra gpu.example.com gpu.example.com 99.000 gpu.example.com gpu.example.com 9.383" in lines
    assert not any(line.startswith("infra") for line in lines)


def test_a_quota_rows_reasons_are_stacked_one_a_line_each_escaped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "out", Console(width=200, no_color=True))
    cli.render_quotas({"at": "2026-11-02T09:30:00Z", "rows": [
        {"cluster": "lab", "team": "ml", "resourceName": "gpus", "used": 3, "nominalQuota": 2, "overQuota": True,
         "reasons": ["first reason", "second\nreason"]}]})
    lines = [" ".join(line.replace("│", " ").split()) for line in capsys.readouterr().out.splitlines()]

    assert "ml gpus 3 2 OVER first reason" in lines
    assert "second\\nreason" in lines  # the next line of the same cell, its newline escaped
