"""Allocations recorded before their device's ResourceSlice get the device's model and node once it comes.

A watch started on a running cluster lists ResourceClaims and ResourceSlices at once, so a claim's allocation
may be recorded before the slice that publishes its devices (dated earlier, by its creationTimestamp). The seed
lab with its one ResourceSlice line moved to the end is that case: every allocation is applied with no inventory
row, and the slice fills them afterwards. The oracle is the seed lab in its own order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import text

from ledger import services
from ledger.projections import runner
from ledger.recorded import parse_time
from ledger.store import schema
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONValue
from tests.paths import HISTORIES

SEED = HISTORIES / "seed-lab.jsonl"
FROM, TO = parse_time("2026-11-02T09:00:00Z"), parse_time("2026-11-02T12:00:00Z")


def _slice_last(tmp_path: Path) -> tuple[Path, Path]:
    """The seed lab without its ResourceSlice line, and that line alone."""
    lines = SEED.read_text().splitlines(keepends=True)
    slices = [n for n, line in enumerate(lines)
              if (event := json.loads(line))["type"] != "BOOKMARK" and event["object"].get("kind") == "ResourceSlice"]
    assert len(slices) == 1 and slices[0] < 10  # one slice, published before the first claim in the file
    rest, late = tmp_path / "claims-first.jsonl", tmp_path / "slice.jsonl"
    rest.write_text("".join(line for n, line in enumerate(lines) if n != slices[0]))
    late.write_text(lines[slices[0]])
    return rest, late


def _usage(ledger: LedgerHandle) -> dict[str, JSONValue]:
    return {by: ledger.usage(FROM, TO, group_by=by)["rows"] for by in ("model", "node", "team")}


def _models(rows: JSONValue) -> set[JSONValue]:
    """The ``model`` of each usage row."""
    assert isinstance(rows, list)
    return {row["model"] for row in rows if isinstance(row, dict)}


def _waiting(ledger: LedgerHandle) -> list[tuple[object, ...]]:
    with ledger.engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT claim, device, model, node FROM device_allocations WHERE awaiting_device_from IS NOT NULL "
            "OR model IS NULL "
            "ORDER BY claim, device")).all())


def test_a_slice_recorded_after_the_claims_gives_their_allocations_its_model_and_node(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    in_order, reordered = ledger_factory(), ledger_factory()
    in_order.replay(SEED)
    expected = _usage(in_order)
    models = _models(expected["model"])
    assert models and None not in models and "" not in models  # the oracle bills every hour to a model

    rest, late = _slice_last(tmp_path)
    reordered.replay(rest)
    waiting = _waiting(reordered)
    assert waiting and all(model is None for _, _, model, _ in waiting)  # applied before any inventory row
    reordered.replay(late)
    assert _waiting(reordered) == []
    assert _usage(reordered) == expected
    # The same rows from the whole history, event by event, and in batches of 7 (the batch path's segments).
    live = reordered.snapshot()
    assert runner.rebuild(reordered.engine) > 0 and reordered.snapshot() == live
    assert runner.rebuild(reordered.engine, set_based=False) > 0 and reordered.snapshot() == live
    assert runner.rebuild(reordered.engine, whole_history=False, batch_size=7) > 0 and reordered.snapshot() == live


def test_hours_rolled_up_before_the_slice_came_are_rolled_again_with_its_model(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    in_order, reordered = ledger_factory(), ledger_factory()
    in_order.replay(SEED)
    expected = in_order.usage(FROM, TO, group_by="model")["rows"]
    rest, late = _slice_last(tmp_path)
    reordered.replay(rest)
    assert services.rollup_usage(reordered.db, start=FROM, end=TO) == 3  # 09:00, 10:00, 11:00, without a model
    before = services.usage_from_rollups(reordered.db, start=FROM, end=TO, group_by="model")["rows"]
    assert _models(before) == {None}
    reordered.replay(late)
    # The fill forgot the rolled hours from the first allocation it filled; the rollups give what the intervals
    # give, before the next rollup run and after it.
    assert services.usage_from_rollups(reordered.db, start=FROM, end=TO, group_by="model")["rows"] == expected
    services.rollup_usage(reordered.db, start=FROM, end=TO)
    assert services.usage_from_rollups(reordered.db, start=FROM, end=TO, group_by="model")["rows"] == expected


def test_upgrading_to_0015_marks_the_allocations_still_waiting_for_their_slice(
        ledger_factory: Callable[[], LedgerHandle], tmp_path: Path) -> None:
    # Rows written before 0015 (taken down to 0014 and up again): those without a model whose device no inventory
    # row holds at their start are marked, and the slice recorded after the upgrade fills them.
    in_order, reordered = ledger_factory(), ledger_factory()
    in_order.replay(SEED)
    rest, late = _slice_last(tmp_path)
    reordered.replay(rest)
    waiting = _waiting(reordered)
    schema.downgrade(reordered.engine, "0014")
    schema.upgrade(reordered.engine)
    with reordered.engine.connect() as conn:
        marked = conn.execute(text(
            "SELECT count(*) FROM device_allocations WHERE awaiting_device_from = lower(valid)")).scalar_one()
    assert marked == len(waiting) > 0
    reordered.replay(late)
    assert _waiting(reordered) == []
    assert reordered.usage(FROM, TO, group_by="model") == in_order.usage(FROM, TO, group_by="model")
