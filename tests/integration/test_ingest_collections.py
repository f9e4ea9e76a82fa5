"""An ingest runs with the garbage collector's automatic runs off, collects young objects on a fixed spacing,
and leaves the collector as it found it (``services._no_automatic_collections``, ``services._chunks``)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ledger import services
from ledger.recorded import read_history
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

SEED = HISTORIES / "seed-lab.jsonl"
SEED_LINES = 39
"""Watch lines of the seed-lab history (its expected file's replay counts)."""


@pytest.fixture()
def collector_on() -> Iterator[None]:
    """The collector on for the test, and as it was after."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


@contextmanager
def young_collections_here() -> Iterator[list[int]]:
    """Counts, in a one-item list, the young collections that start in this thread while automatic runs are off,
    within the block: the ones the ingest asks for itself.

    Counted through ``gc.callbacks``, which run in the thread that collects, rather than from ``gc.get_stats()``:
    the stats are process-wide, so a collection made by another thread (a writer thread, a thread an earlier
    test left behind) would be counted too. Not counted: an automatic run just after the ingest turned them on
    again, which the objects allocated since the last asked-for collection may or may not set off (it did on
    one run in CI).
    """
    here = threading.get_ident()
    count = [0]

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0 and threading.get_ident() == here and not gc.isenabled():
            count[0] += 1

    gc.callbacks.append(seen)
    try:
        yield count
    finally:
        gc.callbacks.remove(seen)


def test_automatic_collections_are_off_during_an_ingest_and_on_again_after(ledger: LedgerHandle,
                                                                           collector_on: None) -> None:
    seen: list[bool] = []
    report = services.ingest(ledger.db, read_history(SEED), cluster=ledger.cluster, batch_size=10,
                             progress=lambda _: seen.append(gc.isenabled()))
    assert report.lines == SEED_LINES
    assert seen == [False, False, False, False]  # 39 lines in batches of 10: four progress calls
    assert gc.isenabled()


def test_an_ingest_leaves_a_collector_that_was_off_off(ledger: LedgerHandle, collector_on: None) -> None:
    gc.disable()
    services.ingest(ledger.db, read_history(SEED), cluster=ledger.cluster)
    assert not gc.isenabled()


def test_a_young_collection_runs_every_collect_every_lines(ledger: LedgerHandle, collector_on: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "COLLECT_EVERY_LINES", 10)
    with young_collections_here() as young:
        services.ingest(ledger.db, read_history(SEED), cluster=ledger.cluster, batch_size=5, pipelined=False)
    # With automatic runs off, only _chunks collects: 39 lines in batches of 5 hand over 5, 10 (collect),
    # 15, 20 (collect), 25, 30 (collect), 35, then the short last batch of 4.
    assert young == [3]


def test_overlapping_ingests_turn_the_collector_on_only_when_the_last_one_ends(ledger: LedgerHandle,
                                                                               collector_on: None) -> None:
    first_inside = threading.Event()
    release_first = threading.Event()
    during: list[bool] = []

    def hold(_: int) -> None:
        first_inside.set()
        assert release_first.wait(timeout=60)

    first = threading.Thread(target=services.ingest, args=(ledger.db, read_history(SEED)),
                             kwargs={"cluster": "first", "progress": hold, "pipelined": False})
    first.start()
    try:
        assert first_inside.wait(timeout=60)
        # A second ingest starts and ends while the first is still inside its own.
        services.ingest(ledger.db, read_history(SEED), cluster="second")
        during.append(gc.isenabled())
    finally:
        release_first.set()
        first.join(timeout=60)
    assert during == [False]
    assert gc.isenabled()
