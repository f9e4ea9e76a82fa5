"""Rows of the claim reports name their cluster, so a report over every cluster tells same-named claims apart."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from ledger import services
from ledger.cli import app
from ledger.config import DEFAULT
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

EXPECTED: Any = json.loads((HISTORIES / "seed-lab.expected.json").read_text(encoding="utf-8"))
WIDE = {"COLUMNS": "250"}  # one table row per line


def _seed_lab_twice(ledger: LedgerHandle) -> LedgerHandle:
    other = LedgerHandle(engine=ledger.engine, cluster=f"{ledger.cluster}-b")
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    other.replay(HISTORIES / "seed-lab.jsonl")
    return other


def test_idle_claims_over_every_cluster_carry_each_rows_cluster(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)
    [check] = [c for c in EXPECTED["checks"] if c.get("idle_claims")]
    names = set(check["idle_claims"])  # "namespace/name" of each claim the fixture expects idle

    rows = services.idle_report(ledger.db, at=parse_time(check["at"]), config=DEFAULT)["claims"]

    assert isinstance(rows, list)
    found = sorted((r["cluster"], f"{r['namespace']}/{r['name']}") for r in rows if isinstance(r, dict))
    assert found == sorted((c, n) for c in (ledger.cluster, other.cluster) for n in names)
    one = services.idle_report(ledger.db, at=parse_time(check["at"]), config=DEFAULT, cluster=other.cluster)
    assert {r["cluster"] for r in one["claims"] if isinstance(r, dict)} == {other.cluster}  # type: ignore[union-attr]


def test_the_idle_claim_csv_starts_with_the_cluster(ledger: LedgerHandle) -> None:
    _seed_lab_twice(ledger)
    [check] = [c for c in EXPECTED["checks"] if c.get("idle_claims")]

    text = services.idle_report_csv(services.idle_report(ledger.db, at=parse_time(check["at"]), config=DEFAULT))

    header, *rows = [line.split(",") for line in text.splitlines()]
    assert header[:3] == ["cluster", "namespace", "name"]
    assert sorted(row[0] for row in rows) == sorted([ledger.cluster, f"{ledger.cluster}-b"] * len(check["idle_claims"]))


def test_pending_claims_over_every_cluster_carry_each_rows_cluster(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)

    # The seed lab's claim for 4 GPUs (ml-train/big) is pending from its creation on (README, "What the demo shows").
    body: Any = services.pending(ledger.db, at=parse_time("2026-11-02T09:30:00Z"))

    assert sorted((r["cluster"], r["namespace"], r["name"]) for r in body["claims"]) == [
        (ledger.cluster, "ml-train", "big"), (other.cluster, "ml-train", "big")]
    assert body["classes"][0]["claims"] == 2  # one pending claim of the class in each cluster


def _table_rows(output: str) -> list[list[str]]:
    """The cells of each body row of the Rich tables in ``output`` (header rows are drawn with ``┃``)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("command", [["idle-claims"], ["report", "idle-claims"]])
def test_the_idle_claim_table_over_every_cluster_names_each_rows_cluster(ledger: LedgerHandle,
                                                                         command: list[str]) -> None:
    other = _seed_lab_twice(ledger)
    # The seed lab's one idle claim at 12:00: ml-serve/shared-gpu of team nlp, holding gpu-1, its reservedFor
    # emptied by the line observed at 11:00:01 (seed-lab.jsonl line 38) -> 1 device x 3599 s = 0.99972 h.
    row = ["ml-serve/shared-gpu", "nlp", "unreserved", "2026-11-02T11:00:01Z", "gpu.example.com/lab-node/gpu-1",
           "1.000"]
    args = [*command, "--at", "2026-11-02T12:00:00Z", "--database-url", ledger.db.url]

    every = CliRunner().invoke(app, args, env=WIDE)
    one = CliRunner().invoke(app, [*args, "--cluster", other.cluster], env=WIDE)

    assert every.exit_code == 0, every.output
    assert "┃ cluster " in every.output
    # Same-named claims come in cluster order (the name of the other cluster is this one's with "-b" added).
    assert _table_rows(every.output) == [[ledger.cluster, *row], [other.cluster, *row]]
    # One cluster's rows cannot be confused: the table keeps its columns of before.
    assert one.exit_code == 0, one.output
    assert "cluster" not in one.output
    assert _table_rows(one.output) == [row]


@pytest.mark.parametrize("command", [["occupancy"], ["claims"]])
def test_the_occupancy_and_claim_tables_over_every_cluster_name_each_rows_cluster(ledger: LedgerHandle,
                                                                                  command: list[str]) -> None:
    other = _seed_lab_twice(ledger)
    args = [*command, "--at", "2026-11-02T09:30:00Z", "--database-url", ledger.db.url]

    every = CliRunner().invoke(app, args, env=WIDE)
    mine = CliRunner().invoke(app, [*args, "--cluster", ledger.cluster], env=WIDE)
    theirs = CliRunner().invoke(app, [*args, "--cluster", other.cluster], env=WIDE)

    assert every.exit_code == mine.exit_code == theirs.exit_code == 0, every.output + mine.output + theirs.output
    # Both clusters recorded the same history, so each cluster's own table is the same, without a cluster column.
    assert _table_rows(mine.output) == _table_rows(theirs.output)
    assert "cluster" not in mine.output
    assert len(_table_rows(mine.output)) > 1
    # Over every cluster, each of those rows appears once per cluster, led by its cluster's name.
    assert "┃ cluster " in every.output
    assert sorted(_table_rows(every.output)) == sorted(
        [[ledger.cluster, *r] for r in _table_rows(mine.output)]
        + [[other.cluster, *r] for r in _table_rows(theirs.output)])
