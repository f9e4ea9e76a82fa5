"""Durations asked for an instant after the present stop at the present: no hour that has not happened counts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ledger import services
from ledger.config import DEFAULT
from ledger.projections import pending, queries
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

FUTURE = parse_time("2100-01-01T00:00:00Z")


def _shared_gpu(body: Any) -> Any:
    [row] = [r for r in body["claims"] if (r["namespace"], r["name"]) == ("ml-serve", "shared-gpu")]
    return row


def test_wasted_device_hours_of_an_idle_claim_stop_at_the_present(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    now = parse_time("2026-11-02T12:30:01Z")
    with ledger.db.reading() as conn:
        future = _shared_gpu(queries.idle_claims(conn, at=FUTURE, now=now, cluster=ledger.cluster))
        past = _shared_gpu(queries.idle_claims(conn, at=parse_time("2026-11-02T12:00:01Z"), now=now,
                                               cluster=ledger.cluster))

    since = parse_time(future["idleSince"])
    assert future["idleSince"] == past["idleSince"]
    assert future["devices"] == past["devices"] == ["gpu.example.com/lab-node/gpu-1"]
    # One GPU idle from idleSince to the present (12:30:01), not to 2100 (about 641,000 hours).
    assert future["wastedDeviceHours"] == round((now - since).total_seconds() / 3600, 6)
    # An instant before the present is measured up to itself, as before.
    assert past["wastedDeviceHours"] == round((parse_time("2026-11-02T12:00:01Z") - since).total_seconds() / 3600, 6)


def test_the_idle_report_for_a_future_instant_counts_up_to_the_databases_now(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")

    before = datetime.now(UTC)
    row = _shared_gpu(services.idle_report(ledger.db, at=FUTURE, config=DEFAULT, cluster=ledger.cluster))
    after = datetime.now(UTC)

    since = parse_time(row["idleSince"])
    hours = row["wastedDeviceHours"]
    assert (before - since).total_seconds() / 3600 - 1e-3 <= hours <= (after - since).total_seconds() / 3600 + 1e-3


def test_a_pending_claims_age_stops_at_the_present(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    now = parse_time("2026-11-02T10:00:00Z")
    with ledger.db.reading() as conn:
        body: Any = pending.pending(conn, at=FUTURE, now=now, cluster=ledger.cluster)

    [big] = [r for r in body["claims"] if (r["namespace"], r["name"]) == ("ml-train", "big")]
    # Pending from its creation (09:25:00, seed-lab.jsonl) up to the present: 35 minutes.
    assert big["pendingSince"] == "2026-11-02T09:25:00Z"
    assert big["ageSeconds"] == 35 * 60
