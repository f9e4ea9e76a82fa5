"""Rows of the claim reports name their cluster, so a report over every cluster tells same-named claims apart."""

from __future__ import annotations

import json
from typing import Any

from ledger import services
from ledger.config import DEFAULT
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

EXPECTED: Any = json.loads((HISTORIES / "seed-lab.expected.json").read_text(encoding="utf-8"))


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
