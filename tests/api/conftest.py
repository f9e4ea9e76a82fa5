"""Fixtures: the real Litestar app on a real, replayed ledger, through Litestar's test client."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from api.app import create_app
from ledger.config import DEFAULT, LedgerConfig
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

SEED = HISTORIES / "seed-lab.jsonl"


@pytest.fixture()
def seeded(ledger: LedgerHandle) -> LedgerHandle:
    """A ledger holding the seed-lab history."""
    ledger.replay(SEED)
    return ledger


@pytest.fixture()
def make_client(seeded: LedgerHandle) -> Iterator[Callable[[LedgerConfig], TestClient[Litestar]]]:
    """Build test clients of the app over the seeded ledger with a given configuration."""
    clients: list[TestClient[Litestar]] = []

    def make(config: LedgerConfig = DEFAULT) -> TestClient[Litestar]:
        client = TestClient(create_app(db=seeded.db, config=config))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture()
def client(make_client: Callable[[LedgerConfig], TestClient[Litestar]]) -> TestClient[Litestar]:
    """A test client of the open app (no tokens) over the seed-lab ledger."""
    return make_client(DEFAULT)
