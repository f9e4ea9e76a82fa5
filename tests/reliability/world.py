"""Small hand-made clusters for the reliability tests: valid neighbours around a bad line, and two teams.

Every builder takes fresh names and uids from :mod:`tests.factories`, so tests never share ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.testing import TestClient

from api.app import create_app
from ledger.config import DEFAULT, LedgerConfig
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests import factories as f

READ_PATHS = ("/v1/occupancy", "/v1/claims", "/v1/quotas", "/v1/shared", "/v1/pending", "/v1/reports/idle-claims")
"""Read endpoints that take only optional parameters (plus ``/v1/usage``, which needs a window)."""


def line(event_type: str, obj: JSONObject | Any, minutes: float) -> str:
    """One recorded line (DESIGN §9) observed at ``T0 + minutes``."""
    return json.dumps({"observedAt": f.stamp(minutes), "type": event_type, "object": obj})


@dataclass(slots=True)
class Sandwich:
    """Valid lines before and after the line under test: a namespace, a pool of two GPUs, two claims.

    ``before``: the team's namespace, a slice publishing gpu-0 and gpu-1, and claim ``first`` allocated
    gpu-0 at minute 2. ``after``: claim ``second`` allocated gpu-1 at minute 20, observed at minute 21.
    """

    pool: str = field(default_factory=lambda: f.uid("pool"))
    namespace: str = field(default_factory=lambda: f.uid("ns"))
    first_uid: str = field(default_factory=lambda: f.uid("claim"))
    second_uid: str = field(default_factory=lambda: f.uid("claim"))

    @property
    def before(self) -> list[str]:
        """The lines written before the line under test."""
        return [
            line("ADDED", f.namespace(self.namespace, "neighbours"), 0),
            line("ADDED", f.resource_slice(name=f.uid("slice"), pool=self.pool,
                                           devices=[f.gpu("gpu-0"), f.gpu("gpu-1")]), 1),
            line("ADDED", f.claim(name="first", namespace=self.namespace, claim_uid=self.first_uid,
                                  results=["gpu-0"], allocated_at=2, pool=self.pool), 3),
        ]

    @property
    def after(self) -> list[str]:
        """The lines written after the line under test."""
        return [line("ADDED", f.claim(name="second", namespace=self.namespace, claim_uid=self.second_uid,
                                      results=["gpu-1"], allocated_at=20, pool=self.pool), 21)]

    def write(self, path: Path, middle: Sequence[str]) -> Path:
        """Write ``before + middle + after`` to ``path``; the middle starts at line 4."""
        path.write_text("\n".join([*self.before, *middle, *self.after]) + "\n")
        return path

    def assert_kept(self, ledger: LedgerHandle) -> None:
        """Every neighbour's events exist, and both claims hold their GPU at minute 30."""
        streams = {(e.stream, e.type) for e in ledger.events()}
        for device in ("gpu-0", "gpu-1"):
            assert (f"device:gpu.example.com/{self.pool}/{device}", "DevicePublished") in streams
        for uid in (self.first_uid, self.second_uid):
            assert (f"claim:{uid}", "ClaimCreated") in streams
            assert (f"claim:{uid}", "ClaimAllocated") in streams
        assert (f"namespace:{self.namespace}", "TeamAssigned") in streams
        body: Any = ledger.occupancy(at=f.at(30), pool=self.pool)
        held = {d["device"]: [a["claim"] for a in d["allocations"]] for d in body["devices"]}
        assert held == {"gpu-0": ["first"], "gpu-1": ["second"]}


def client(ledger: LedgerHandle, config: LedgerConfig = DEFAULT) -> TestClient[Litestar]:
    """A test client of the real app over ``ledger`` (enter it with ``with``)."""
    return TestClient(create_app(db=ledger.db, config=config))


def assert_api_answers(ledger: LedgerHandle, at: datetime | None = None) -> None:
    """Every read endpoint answers 200 with JSON over whatever the ledger holds."""
    when = f.stamp(30) if at is None else at.isoformat()
    with client(ledger) as api:
        for path in READ_PATHS:
            response = api.get(path, params={"at": when})
            assert response.status_code == 200, (path, response.text)
        usage = api.get("/v1/usage", params={"from": f.stamp(0), "to": f.stamp(600)})
        assert usage.status_code == 200, usage.text
        assert api.get("/v1/usage", params={"from": f.stamp(0), "to": f.stamp(600)},
                       headers={"Accept": "text/csv"}).status_code == 200
