"""Two writers of one cluster, one of them with a translator state loaded before the other's commit (a standby that
took the Lease while the former leader's write was still to commit; a replay beside a watch): the stale writer
loads the state again, and the ledger ends as one writer would have left it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger import services
from ledger.errors import StateConflict
from ledger.recorded import BrokenLine, WatchLine, read_history
from ledger.store.database import PreparedAppend
from ledger.store.postgres import StateRows
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES
from tests.workers.harness import assert_same_ledger

CLUSTER = "default"
ALLOCATED = 7
"""Line of seed-lab (0-based) that allocates claim train-0-gpu-4fj8q; line 31 deallocates it (the allocation leaves
its status, the events' release), line 32 deletes it."""


def seed_lab() -> list[WatchLine | BrokenLine]:
    return list(read_history(HISTORIES / "seed-lab.jsonl"))


@pytest.mark.parametrize("pipelined", [False, True], ids=["sequential", "pipelined"])
def test_a_writer_whose_state_another_writer_moved_on_records_every_later_event(
        ledger_factory: Callable[[], LedgerHandle], pipelined: bool) -> None:
    # The stale writer never sees the allocation (line 7, recorded by the other writer; delivered again it is a
    # duplicate), so to its state the deallocation (line 31) changes nothing: no event, and the claim's entry was
    # saved as the stale one, at stream position 1 where the stream was at 3. The deletion (line 32) was then
    # refused as a StreamConflict at every attempt, and so was every later event of the claim, for good.
    lines = seed_lab()
    live, clean = ledger_factory(), ledger_factory()
    services.ingest(clean.db, lines, cluster=CLUSTER)
    services.ingest(live.db, lines[:ALLOCATED], cluster=CLUSTER)
    former, standby = services.load_state(live.db, CLUSTER), services.load_state(live.db, CLUSTER)

    services.ingest(live.db, lines[ALLOCATED:ALLOCATED + 1], cluster=CLUSTER, state=former, pipelined=False)
    # One line a transaction, as a watch writes single events: the deallocation commits before the deletion comes.
    again = services.ingest(live.db, lines[ALLOCATED:], cluster=CLUSTER, state=standby, pipelined=pipelined,
                            batch_size=1)

    assert (again.duplicates, again.recorded) == (1, len(lines) - ALLOCATED - 1)
    assert_same_ledger(live, clean)


def test_only_appends_that_change_the_translator_state_are_counted(ledger: LedgerHandle) -> None:
    # A bookmark's checkpoint, or a batch of lines already recorded, changes no entry: counted, it made a second
    # writer load its whole state again for nothing.
    lines = seed_lab()
    services.ingest(ledger.db, lines[:3], cluster=ledger.cluster, pipelined=False)
    state = services.load_state(ledger.db, ledger.cluster)
    assert state.appends == 1
    services.record_watch_batch(ledger.db, [], cluster=ledger.cluster, state=state, checkpoint=services.WatchCheckpoint(
        kind="Namespace", api_version="v1", resource_version="7"))
    for pipelined in (False, True):
        assert services.ingest(ledger.db, lines[:3], cluster=ledger.cluster, state=state,
                               pipelined=pipelined).duplicates == 3
    assert services.load_state(ledger.db, ledger.cluster).appends == state.appends == 1
    services.ingest(ledger.db, lines[3:6], cluster=ledger.cluster, state=state)
    assert services.load_state(ledger.db, ledger.cluster).appends == state.appends == 2


def test_a_batch_translated_ahead_against_an_older_count_is_refused_whole(ledger: LedgerHandle) -> None:
    lines = seed_lab()
    stale = services.load_state(ledger.db, ledger.cluster)
    services.ingest(ledger.db, lines[:3], cluster=ledger.cluster)
    before = ledger.rows("translator_state")
    with pytest.raises(StateConflict):
        ledger.db.write(ledger.cluster, PreparedAppend(
            observations=[], events=[], state=StateRows(upserts={"namespace:x": '{"team": "x"}'}, deletes=[]),
            appends=stale.appends))
    assert ledger.rows("translator_state") == before
    assert services.load_state(ledger.db, ledger.cluster).appends == stale.appends + 1  # the ingest's one batch
