"""Read models that applied nothing yet are built from the whole history when the store is large, with the rows the
batches would have written; a build that fails falls back to the batches, which stop before the bad event."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger import services
from ledger.projections import runner
from ledger.projections import whole_history as whole
from ledger.recorded import parse_time, read_history
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES, REAL

SEED = HISTORIES / "seed-lab.jsonl"
AT = parse_time("2026-11-02T13:00:00Z")
"""Receive time of the kubectl Lists (they carry none): the same in every ledger compared."""


def _recorded_only(ledger: LedgerHandle, paths: list[Path]) -> int:
    """Ingest ``paths`` without catching the read models up; returns the events appended."""
    return sum(services.ingest(ledger.db, read_history(p, at=AT), cluster=ledger.cluster, at=AT).events
               for p in paths)


def _histories() -> list[Path]:
    return [SEED, *sorted(REAL.glob("*.yaml"))]


def test_a_first_catch_up_of_a_large_store_builds_the_whole_history_with_the_batches_rows(
        ledger_factory: Callable[[], LedgerHandle], monkeypatch: pytest.MonkeyPatch) -> None:
    batches, whole_built = ledger_factory(), ledger_factory()
    batches.replay(*_histories(), at=AT)  # a small store: the batches apply it (below WHOLE_HISTORY_FROM)
    events = _recorded_only(whole_built, _histories())
    assert events < runner.WHOLE_HISTORY_FROM
    progress: list[int] = []

    def no_batches(*_: Any, **__: Any) -> None:
        raise AssertionError("the batch path ran")

    monkeypatch.setattr(runner, "_apply_batch", no_batches)
    applied = runner.catch_up(whole_built.engine, progress=progress.append, whole_history_from=events)
    monkeypatch.undo()

    assert applied == events and progress == [events]  # one build of every event, no batch
    assert runner.lag(whole_built.engine) == dict.fromkeys(runner.lag(whole_built.engine), 0)
    assert whole_built.snapshot() == batches.snapshot()


def test_a_store_smaller_than_the_bound_or_read_models_already_built_keep_the_batches(
        ledger: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    events = _recorded_only(ledger, [SEED])
    built: list[object] = []
    monkeypatch.setattr(whole, "build", lambda *a, **k: built.append(a))

    assert runner.catch_up(ledger.engine, whole_history_from=events + 1) == events
    assert built == []  # one event short of the bound: batches
    more = _recorded_only(ledger, sorted(REAL.glob("*.yaml")))
    assert runner.catch_up(ledger.engine, whole_history_from=1) == more
    assert built == []  # the read models had applied events already: batches from their checkpoint


def test_a_whole_history_build_that_fails_falls_back_to_the_batches(
        ledger_factory: Callable[[], LedgerHandle], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    reference, fallen_back = ledger_factory(), ledger_factory()
    reference.replay(SEED, at=AT)
    events = _recorded_only(fallen_back, [SEED])

    def broken_build(*_: Any, **__: Any) -> None:
        raise ValueError("an event the build cannot take")

    monkeypatch.setattr(whole, "build", broken_build)
    with caplog.at_level(logging.WARNING, logger="ledger.projections.runner"):
        applied = runner.catch_up(fallen_back.engine, whole_history_from=1)
    monkeypatch.undo()

    assert applied == events
    assert "building the read models from the whole history failed (ValueError: an event the build cannot take)" \
           in caplog.text
    assert fallen_back.snapshot() == reference.snapshot()


def test_a_whole_history_build_tells_each_table_as_it_is_written_and_the_batch_paths_tell_none(
        ledger: LedgerHandle) -> None:
    ledger.replay(SEED)
    told: list[str] = []
    runner.rebuild(ledger.engine, built=told.append)
    # The SQL-built tables as their statements finish, then the fold's; device_allocations after the tables it reads.
    assert told == ["pod_phases", "claims", "claim_states", "claim_consumers", "namespace_teams", "device_inventory",
                    "device_classes", "device_taint_rules", "device_allocations"]
    assert sorted(told) == sorted(runner.table_names())

    batches: list[str] = []
    runner.rebuild(ledger.engine, built=batches.append, whole_history=False)
    assert batches == []
