"""The summary line of ``replay`` says when its counts overlap: a line an earlier run stored as rejected counts
both as already recorded and as rejected (``IngestReport.rejected``), so the counts can add up to more than
the lines read, and the line says which of the rejected lines those are."""

from __future__ import annotations

import io

import pytest

from ledger.cli import summarise_report
from ledger.services import IngestReport, Rejection


def test_a_first_run_of_a_file_with_a_bad_line_reports_the_counts_alone() -> None:
    # 40 lines, one of them bad: 39 recorded + 1 rejected = 40.
    report = IngestReport(lines=40, recorded=39, duplicates=0, events=52,
                          rejected=[Rejection(origin="h.jsonl:7", reason="invalid JSON")])

    assert summarise_report(report) == "40 lines: 39 recorded, 0 already recorded, 1 rejected; 52 events appended"


def test_a_second_run_says_the_rejected_line_is_among_the_already_recorded() -> None:
    # The same 40 lines again: all 40 are stored, and the bad one is reported again -> 40 + 1 = 41 counted.
    report = IngestReport(lines=40, recorded=0, duplicates=40, events=0, rejected=[
        Rejection(origin="h.jsonl:7", reason="invalid JSON (already recorded as rejected)", already_recorded=True)])

    assert summarise_report(report) == ("40 lines: 0 recorded, 40 already recorded, 1 rejected (already recorded "
                                        "as rejected, so also among the 40 already recorded); 0 events appended")


def test_a_run_with_old_and_new_bad_lines_says_how_many_of_them_were_recorded_before() -> None:
    # 3 lines: one new good line (recorded), one new bad line, one bad line an earlier run stored:
    # 1 recorded + 1 already recorded + 2 rejected = 4 counted, 1 of them twice.
    report = IngestReport(lines=3, recorded=1, duplicates=1, events=2, rejected=[
        Rejection(origin="h.jsonl:2", reason="invalid JSON"),
        Rejection(origin="h.jsonl:3", reason="invalid JSON (already recorded as rejected)", already_recorded=True)])

    assert summarise_report(report) == ("3 lines: 1 recorded, 1 already recorded, 2 rejected (1 of them already "
                                        "recorded as rejected, so also among the 1 already recorded); "
                                        "2 events appended")


def test_a_single_line_is_one_line() -> None:
    # A single YAML object replays as one watch event.
    report = IngestReport(lines=1, recorded=1, duplicates=0, events=2, rejected=[])

    assert summarise_report(report) == "1 line: 1 recorded, 0 already recorded, 0 rejected; 2 events appended"


def test_large_counts_are_grouped_in_thousands_as_the_progress_lines_are() -> None:
    report = IngestReport(lines=775_804, recorded=775_803, duplicates=1, events=964_127)

    assert summarise_report(report) == ("775,804 lines: 775,803 recorded, 1 already recorded, 0 rejected; "
                                        "964,127 events appended")


def test_a_table_the_statistics_refresh_gave_up_is_said_as_a_warning_after_the_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    from ledger import cli
    from ledger.store.postgres import Analyzed

    stream = io.StringIO()
    monkeypatch.setattr(cli, "err", Console(file=stream, width=200, no_color=True))
    cli._say_statistics(Analyzed(analyzed=("claims", "observations"), skipped=(),
                                 failed=(("events", "canceling statement due to lock timeout"),)), 11.04)

    assert stream.getvalue().splitlines() == [
        "statistics: 2 tables analyzed for the query planner in 11.0 s",
        "warning: statistics of table events left to autovacuum: ANALYZE failed: canceling statement due to lock "
        "timeout"]
