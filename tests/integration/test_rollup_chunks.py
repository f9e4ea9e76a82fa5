"""The hourly rollup in bounded chunks: an allocation dated years back, stopping between chunks, Ctrl-C.

A claim created and allocated years before anything else (a user trial set its times to year 1) makes
the rollup cover every hour since then. The run must stay bounded in memory (chunks of at most
``max_pieces`` interval-hours, each its own transaction), add up to the hand-computed device-hours, and
stop between chunks with what it committed kept, so that the next run resumes and ends with the same rows.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import signal
import subprocess
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from sqlalchemy import Engine, event, text
from typer.testing import CliRunner

from ledger import cli, services
from ledger.projections import rollups
from ledger.projections.rollups import HOUR, floor_hour
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI, T0, at, claim, dig, gpu, history, namespace, resource_slice, signalled, uid
from workers import jobs_cli
from workers.jobs import run_rollups

YEARS_BACK_H = 3 * 365 * 24
"""The claim is allocated this many hours (and 30 minutes) before T0."""
HELD_AFTER_T0_MIN = 90
"""... and deleted 90 minutes after T0."""
END = at(180)
"""Rolled up to 12:00: the hour 11:00 is the last whole one."""
FIRST_HOUR = floor_hour(T0 - YEARS_BACK_H * HOUR - timedelta(minutes=30))
TOTAL_HOURS = (END - FIRST_HOUR) // HOUR
# By hand: [T0 - 26,280 h - 30 min, T0 + 90 min) is 26,282 h of one GPU, one device-hour in each whole hour
# and a half hour at each end (08:30-09:00 three years back; 10:00-10:30 on the day).
HAND_DEVICE_HOURS = YEARS_BACK_H + 0.5 + HELD_AFTER_T0_MIN / 60
HOURS_WITH_USAGE = (at(HELD_AFTER_T0_MIN) - FIRST_HOUR) // HOUR + 1
SMALL_BOUND = 1000
"""Pieces per chunk in these tests: ~27 chunks over the three years."""
ROW_COLUMNS = "cluster, hour, team, namespace, device_class, model, node, driver, device_seconds"


@pytest.fixture()
def years_back(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    """One GPU held by one claim allocated three years (and 30 minutes) before T0, released at T0 + 90 min."""
    held = claim(name="pick-seven", namespace="ml-train", claim_uid=uid("claim"), results=["gpu-0"],
                 allocated_at=-(YEARS_BACK_H * 60 + 30), created_at=-(YEARS_BACK_H * 60 + 30))
    lines: list[tuple[str, Any, float]] = [
        ("ADDED", namespace("ml-train", "vision"), 0.0),
        ("ADDED", resource_slice(name="node-a-gpus", devices=[gpu("gpu-0")]), 0.0),
        ("ADDED", held, 1.0), ("DELETED", held, HELD_AFTER_T0_MIN)]
    assert not ledger.replay(history(tmp_path / "years-back.jsonl", lines)).rejected
    with ledger.engine.connect() as conn:
        assert rollups.first_allocation(conn) == T0 - YEARS_BACK_H * HOUR - timedelta(minutes=30)
    return ledger


def stored_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT {ROW_COLUMNS} FROM usage_rollups ORDER BY {ROW_COLUMNS}"))]


def stored_hours(engine: Engine) -> dict[str, list[Any]]:
    with engine.connect() as conn:
        return {table: list(conn.execute(text(f"SELECT DISTINCT hour FROM {table} ORDER BY hour")).scalars())
                for table in rollups.ROLLUP_TABLES}


def rolled(engine: Engine) -> list[tuple[Any, ...]]:
    """(distinct hours, first hour, last hour) of each rollup table, in :data:`rollups.ROLLUP_TABLES` order."""
    with engine.connect() as conn:
        return [tuple(conn.execute(text(f"SELECT count(DISTINCT hour), min(hour), max(hour) FROM {table}")).one())
                for table in rollups.ROLLUP_TABLES]


def forget_everything(engine: Engine) -> None:
    with engine.begin() as conn:
        rollups.forget_all_rolled_hours(conn)


@pytest.fixture()
def inserted_rows(years_back: LedgerHandle) -> Iterator[list[int]]:
    """Rows sent by each INSERT statement into ``usage_rollups`` (executemany: one count per statement)."""
    counts: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, parameters: Sequence[Any], context: Any,
              executemany: bool) -> None:
        if statement.startswith("INSERT INTO usage_rollups "):
            counts.append(len(parameters) if executemany else 1)

    event.listen(years_back.engine, "before_cursor_execute", count)
    try:
        yield counts
    finally:
        event.remove(years_back.engine, "before_cursor_execute", count)


def test_an_allocation_dated_years_back_rolls_up_in_bounded_chunks_to_the_hand_computed_hours(
        years_back: LedgerHandle, inserted_rows: list[int]) -> None:
    chunks: list[services.RollupChunk] = []
    tracemalloc.start()
    try:
        hours = services.rollup_usage(years_back.db, end=END, max_pieces=SMALL_BOUND, progress=chunks.append)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert hours == TOTAL_HOURS
    # Every statement wrote at most the bound; together they wrote one row per hour with usage.
    assert inserted_rows and max(inserted_rows) <= SMALL_BOUND
    assert sum(inserted_rows) == HOURS_WITH_USAGE
    assert len(chunks) >= TOTAL_HOURS // SMALL_BOUND
    assert [c.start for c in chunks] == [FIRST_HOUR, *(c.end for c in chunks[:-1])]  # contiguous, in order
    assert chunks[-1].end == floor_hour(END) and chunks[-1].done_hours == chunks[-1].total_hours == TOTAL_HOURS
    # All 26,284 hours in one statement peaked at ~38 MB of Python objects; chunks of 1,000 pieces at ~2 MB.
    assert peak_bytes < 8 * 1024 * 1024, peak_bytes
    with years_back.engine.connect() as conn:
        per_table = {t: conn.execute(text(f"SELECT sum(device_seconds) / 3600, count(*) FROM {t}")).one()
                     for t in rollups.ROLLUP_TABLES}
    for device_hours, rows in per_table.values():
        assert float(device_hours) == pytest.approx(HAND_DEVICE_HOURS, abs=1e-6)
        assert rows == HOURS_WITH_USAGE
    body: Any = services.usage(years_back.db, start=FIRST_HOUR, end=END, group_by="team")
    assert [r["deviceHours"] for r in body["rows"]] == [round(HAND_DEVICE_HOURS, 6)]


def test_a_chunk_never_reads_more_than_the_bound_or_one_whole_hour(years_back: LedgerHandle) -> None:
    with years_back.engine.connect() as conn:
        every = rollups.hour_pieces(conn, start=FIRST_HOUR, end=floor_hour(END))
        stop, pieces = rollups.next_chunk(conn, start=FIRST_HOUR, end=floor_hour(END), hours=TOTAL_HOURS,
                                          max_pieces=SMALL_BOUND)
        one, uncounted = rollups.next_chunk(conn, start=FIRST_HOUR, end=floor_hour(END), hours=TOTAL_HOURS,
                                            max_pieces=0)
    assert every == HOURS_WITH_USAGE  # one GPU, one piece an hour
    assert pieces is not None and 0 < pieces <= SMALL_BOUND and stop - FIRST_HOUR == pieces * HOUR
    assert (one, uncounted) == (FIRST_HOUR + HOUR, None)  # a single hour is rolled up whole


def test_a_run_stopped_between_chunks_keeps_them_and_the_next_run_resumes_to_the_same_rows(
        years_back: LedgerHandle) -> None:
    assert services.rollup_usage(years_back.db, end=END, max_pieces=SMALL_BOUND) == TOTAL_HOURS
    whole = stored_rows(years_back.engine)
    forget_everything(years_back.engine)

    chunks = services.rollup_chunks(years_back.db, end=END, max_pieces=SMALL_BOUND)
    done = [next(chunks) for _ in range(3)]
    chunks.close()  # stopped between chunks, as Ctrl-C stops `jobs --once`
    stopped_at = done[-1].end
    hours = stored_hours(years_back.engine)
    assert hours["usage_rollups"] == hours["usage_rollups_by_team"]
    assert hours["usage_rollups"][0] == FIRST_HOUR and hours["usage_rollups"][-1] == stopped_at - HOUR
    assert len(hours["usage_rollups"]) == (stopped_at - FIRST_HOUR) // HOUR  # every hour of the three chunks

    resumed = services.rollup_usage(years_back.db, end=END, max_pieces=SMALL_BOUND)
    assert resumed == (floor_hour(END) - (stopped_at - HOUR)) // HOUR  # from the last rolled hour, not the first
    assert stored_rows(years_back.engine) == whole


def test_cancelling_the_rollup_job_stops_it_between_chunks(years_back: LedgerHandle,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "rollup_chunks", partial(services.rollup_chunks, max_pieces=SMALL_BOUND))
    seen: list[services.RollupChunk] = []

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None

        def progress(chunk: services.RollupChunk) -> None:
            seen.append(chunk)
            if len(seen) == 2:
                task.cancel()  # what the scheduler's shutdown, or Ctrl-C under asyncio.run, does

        await run_rollups(years_back.db, clock=lambda: END, progress=progress)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())  # returns once the chunk in flight, if any, has committed or been cancelled
    hours = stored_hours(years_back.engine)["usage_rollups"]
    assert len(seen) == 2
    # Chunks 1 and 2 committed; the third had started in its thread when the task was cancelled: whole (committed
    # before the cancel reached it) or absent (cancelled), and none after it.
    assert hours[0] == FIRST_HOUR and len(hours) == (hours[-1] + HOUR - FIRST_HOUR) // HOUR
    assert seen[1].end <= hours[-1] + HOUR < floor_hour(END)


def _jobs_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """A group, so that ``jobs`` stays a subcommand."""

    jobs_cli.register(app)
    return app


def test_ctrl_c_in_jobs_once_is_exit_130_with_one_line_and_the_rerun_finishes_the_rows(
        years_back: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    assert services.rollup_usage(years_back.db, end=END, max_pieces=SMALL_BOUND) == TOTAL_HOURS
    whole = stored_rows(years_back.engine)
    forget_everything(years_back.engine)
    bounded = partial(services.rollup_chunks, max_pieces=SMALL_BOUND)

    def interrupted_after_two(db: Any, **kwargs: Any) -> Iterator[services.RollupChunk]:
        for n, chunk in enumerate(bounded(db, **kwargs), 1):
            yield chunk
            if n == 2:
                raise KeyboardInterrupt  # what Ctrl-C raises

    url = years_back.engine.url.render_as_string(hide_password=False)
    monkeypatch.setattr(services, "rollup_chunks", interrupted_after_two)
    stopped = CliRunner().invoke(_jobs_app(), ["jobs", "--once", "--database-url", url])
    hours = stored_hours(years_back.engine)["usage_rollups"]
    monkeypatch.setattr(services, "rollup_chunks", bounded)
    rerun = CliRunner().invoke(_jobs_app(), ["jobs", "--once", "--database-url", url])

    assert stopped.exit_code == 130, stopped.output
    assert [line for line in stopped.output.splitlines() if line] == [
        "interrupted: the rollup hours committed so far are kept; run `dra-ledger jobs --once` again to roll up "
        "the rest (it resumes from the last rolled hour)"]
    assert hours[0] == FIRST_HOUR and len(hours) == (hours[-1] + HOUR - FIRST_HOUR) // HOUR < TOTAL_HOURS
    assert rerun.exit_code == 0, rerun.output
    assert stored_rows(years_back.engine) == whole


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                      (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_signal_stops_jobs_once_between_chunks_of_a_rollup_from_year_one(
        ledger: LedgerHandle, tmp_path: Path, signum: int, code: int, said: str) -> None:
    # The user trial: a claim created and allocated 0001-01-01T00:00:00Z, ~17.7 M hours to roll up. SIGINT must
    # end the run with exit code 130 while it rolls up, keeping whole chunks only; SIGTERM (a CronJob's deadline)
    # the same way with 143, where the process died without a word.
    held = claim(name="pick-seven", namespace="ml-train", claim_uid=uid("claim"), results=["gpu-0"])
    dig(held, "status", "allocation")["allocationTimestamp"] = "0001-01-01T00:00:00Z"
    dig(held, "metadata")["creationTimestamp"] = "0001-01-01T00:00:00Z"
    lines: list[tuple[str, Any, float]] = [
        ("ADDED", namespace("ml-train", "vision"), 0.0),
        ("ADDED", resource_slice(name="node-a-gpus", devices=[gpu("gpu-0")]), 0.0), ("ADDED", held, 1.0)]
    assert not ledger.replay(history(tmp_path / "year-one.jsonl", lines)).rejected
    url = ledger.engine.url.render_as_string(hide_password=False)
    process = subprocess.Popen(
        [*CLI, "jobs", "--once", "--database-url", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell's background job starts with SIGINT ignored; Ctrl-C in a terminal reaches a process that is not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120  # the process's start-up on a busy machine, not a timing assertion
    while process.poll() is None and time.monotonic() < deadline and not rolled(ledger.engine)[0][0]:
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()
    out, err = signalled(process, signum)
    assert process.returncode == code, (out, err)
    assert err.strip().startswith(f"{said}: the rollup hours committed so far are kept") and "\n" not in err.strip()
    [(count, first, last), by_team] = rolled(ledger.engine)
    assert by_team == (count, first, last)  # both tables hold the same hours
    # Whole chunks from the first hour on: every hour of them, and far from done.
    assert first.year == 1 and count == (last - first) // HOUR + 1 and last.year < 2026


def test_a_long_rollup_draws_a_bar_of_hours_on_a_terminal_and_a_short_one_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def chunks(total: int) -> list[services.RollupChunk]:
        ends = [FIRST_HOUR + h * HOUR for h in (0, total // 2, total)]
        return [services.RollupChunk(start=s, end=e, hours=(e - s) // HOUR, done_hours=(e - FIRST_HOUR) // HOUR,
                                     total_hours=total) for s, e in itertools.pairwise(ends)]

    drawn = []
    for total in (jobs_cli.ROLLUP_PROGRESS_MIN_HOURS * 3, 2):
        screen = io.StringIO()
        monkeypatch.setattr(cli, "err", Console(file=screen, force_terminal=True, width=100))
        with jobs_cli._rollup_progress() as progress:
            for chunk in chunks(total):
                progress(chunk)
        drawn.append(screen.getvalue())
    assert "rollup hours" in drawn[0] and "3000/3000" in drawn[0]
    assert drawn[1] == ""  # the hourly run's hour or two: no bar


def test_jobs_once_for_a_cluster_the_ledger_holds_nothing_of_warns_and_writes_nothing(years_back: LedgerHandle) -> None:
    url = years_back.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(_jobs_app(), ["jobs", "--once", "--cluster", "nope", "--rollup-from",
                                              "2026-11-02T09:00:00Z", "--database-url", url])

    assert result.exit_code == 0, result.output
    assert "rolled up 0 hour(s); snapshots: 0 idle claims, 0 quota rows, 0 pending classes" in result.output
    assert "warning: the ledger holds no event of cluster 'nope': nothing to roll up or count" in result.output
    assert "rolled up 0 hour(s)" in result.output and "0 occupancy count rows" in result.output
    with years_back.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM occupancy_count_coverage WHERE cluster = 'nope'")).scalar() == 0
