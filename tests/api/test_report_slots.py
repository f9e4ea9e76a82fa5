"""Report slots: an API process computes a bounded number of whole-fleet reports at once, and a request that
cannot get a slot, or a pooled database connection, in time is a 503 with ``Retry-After``, never a 500."""

from __future__ import annotations

import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from litestar.testing import TestClient
from sqlalchemy import create_engine

from api.app import WORKER_SPEC_ENV, WorkerSpec, create_app, create_app_for_worker
from api.deps import AppState, ReportSlots
from api.limits import DEFAULT_REPORT_SLOTS
from ledger.config import DEFAULT
from ledger.errors import Busy, Invalid, StoreUnavailable
from ledger.store.database import LedgerDatabase
from ledger.testing.handle import LedgerHandle
from tests.factories import CLI

REPORTS = ["/v1/quotas?at=2026-11-02T09:30:00Z", "/v1/shared?at=2026-11-02T09:30:00Z",
           "/v1/pending?at=2026-11-02T09:30:00Z", "/v1/reports/idle-claims?at=2026-11-02T09:30:00Z"]
"""The four whole-fleet reports, at an instant of the seed-lab history."""


def test_no_more_reports_than_slots_run_at_once_and_every_one_runs() -> None:
    slots = ReportSlots(2, wait_s=30)
    inside, most, ran = 0, 0, []
    lock = threading.Lock()
    pair = threading.Barrier(2, timeout=10)  # the first two in wait for each other: two at once is reached

    def report(n: int) -> None:
        nonlocal inside, most
        with slots.held():
            with lock:
                inside += 1
                most = max(most, inside)
            pair.wait()
            with lock:
                inside -= 1
                ran.append(n)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(report, range(8)))
    assert most == 2
    assert sorted(ran) == list(range(8))


def test_a_request_that_gets_no_slot_in_time_is_busy_and_the_slot_is_free_again_after() -> None:
    slots = ReportSlots(1, wait_s=0.05)

    def another_report() -> None:
        with slots.held():
            pass

    with slots.held(), ThreadPoolExecutor(1) as pool, pytest.raises(Busy) as raised:
        pool.submit(another_report).result()
    assert raised.value.retry_after_s == 1  # the wait rounded, at least a second
    assert str(raised.value) == ("this API process is computing as many whole-fleet reports at once as it may (1, "
                                 "serve --report-slots) and none finished within 0.05 s; retry later")
    with slots.held():  # released on the way out, and a failed wait took nothing
        pass


def test_zero_slots_is_refused() -> None:
    with pytest.raises(Invalid, match="report slots: 0; at least 1"):
        ReportSlots(0)


def test_each_whole_fleet_report_waits_for_a_slot_and_says_503_when_none_comes(seeded: LedgerHandle) -> None:
    slots = ReportSlots(1, wait_s=0.05)
    with TestClient(create_app(db=seeded.db, config=DEFAULT, reports=slots)) as client:
        with slots.held():  # another report holds the only slot
            busy = [client.get(url) for url in REPORTS]
            paged = client.get("/v1/occupancy?at=2026-11-02T09:30:00Z")
        after = [client.get(url) for url in REPORTS]
    assert [r.status_code for r in busy] == [503] * 4
    assert {r.headers["retry-after"] for r in busy} == {"1"}
    assert {r.headers["content-type"] for r in busy} == {"application/problem+json"}
    assert {r.json()["title"] for r in busy} == {"Service Unavailable"}
    assert all("as many whole-fleet reports at once as it may (1, " in r.json()["detail"] for r in busy)
    assert paged.status_code == 200  # occupancy is paged, and no report
    assert [r.status_code for r in after] == [200] * 4  # each 503 left the slot free


def test_a_pool_with_no_free_connection_in_time_is_a_503_not_a_500(seeded: LedgerHandle) -> None:
    engine = create_engine(seeded.db.url, pool_size=1, max_overflow=0, pool_timeout=0.05)
    db = LedgerDatabase(engine=engine)
    try:
        with TestClient(create_app(db=db, config=DEFAULT)) as client:
            with engine.connect():  # the pool's only connection, in use
                with pytest.raises(StoreUnavailable, match=r"^no free database connection"), db.reading():
                    pass
                answer = client.get("/v1/occupancy?at=2026-11-02T09:30:00Z")
            again = client.get("/v1/occupancy?at=2026-11-02T09:30:00Z")
    finally:
        engine.dispose()
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "5"
    assert again.status_code == 200


def test_the_app_has_the_default_slots_unless_given_and_a_worker_takes_serves_number(
        seeded: LedgerHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    state: AppState = create_app(db=seeded.db, config=DEFAULT).state.ledger
    assert state.reports.count == DEFAULT_REPORT_SLOTS == 2
    spec = WorkerSpec(database_url=seeded.db.url, cluster=None, report_slots=5,
                      config=DEFAULT.model_dump_json(by_alias=True))
    monkeypatch.setenv(WORKER_SPEC_ENV, spec.to_json())
    app = create_app_for_worker()
    try:
        assert app.state.ledger.reports.count == 5
    finally:
        app.state.ledger.db.dispose()


@pytest.mark.parametrize(("value", "bound"), [("0", "greater than or equal to 1"), ("65", "less than or equal to 64")])
def test_serve_refuses_report_slots_out_of_range_before_anything_else(value: str, bound: str) -> None:
    result = subprocess.run([*CLI, "serve", "--report-slots", value, "--database-url",
                             "postgresql://nobody@127.0.0.1:1/none"], capture_output=True, text=True, timeout=60)
    said = " ".join(result.stderr.replace("│", " ").split())  # the error box's lines joined
    assert result.returncode == 2
    assert "Invalid value for '--report-slots' (env var: 'LEDGER_API_REPORT_SLOTS'): Input should be " + bound in said
