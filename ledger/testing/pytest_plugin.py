"""pytest plugin shipped with dra-ledger (entry point ``pytest11``): a real ledger per test.

Fixtures:
    ``ledger_server`` (session): admin URL of a PostgreSQL server: ``LEDGER_TEST_DATABASE_URL`` when
        set, else an embedded PostgreSQL 18 started for the session and stopped at its end.
    ``ledger_template`` (session): name of a database migrated to head once per session.
    ``ledger_engine``: a fresh database copied from the template for one test (dropped afterwards).
    ``ledger``: a :class:`~ledger.testing.handle.LedgerHandle` on that database with ``replay()``
        and the query layer.
    ``ledger_factory``: a callable making more fresh ledgers within one test.

Tests that use these fixtures are marked ``ledger_db`` automatically, so ``-m ledger_db`` selects
them. Example::

    def test_gpu_held(ledger):
        ledger.replay("histories/my-cluster.jsonl")
        body = ledger.occupancy(at=datetime(2026, 11, 2, 9, 30, tzinfo=UTC))
        assert body["totals"]["allocated"] == 6
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from ledger.store import schema
from ledger.store.postgres import make_engine
from ledger.testing.handle import LedgerHandle
from ledger.testing.pg import create_database, drop_database, test_server

DB_FIXTURES = frozenset({"ledger", "ledger_engine", "ledger_template", "ledger_server", "ledger_factory"})


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``ledger_db`` marker."""
    config.addinivalue_line("markers", "ledger_db: uses a real PostgreSQL through the dra-ledger fixtures")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that requests a database fixture with ``ledger_db``."""
    for item in items:
        if DB_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker("ledger_db")


@pytest.fixture(scope="session")
def ledger_server() -> Iterator[str]:
    """Admin URL of the test PostgreSQL server (see module docstring)."""
    with test_server() as url:
        yield url


@pytest.fixture(scope="session")
def ledger_template(ledger_server: str) -> Iterator[str]:
    """A database at the head schema revision, used as a template for per-test databases."""
    name = f"ledger_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    url = create_database(ledger_server, name)
    engine = make_engine(url)
    try:
        schema.upgrade(engine)
    finally:
        engine.dispose()
    try:
        yield name
    finally:
        drop_database(ledger_server, name)


@pytest.fixture()
def ledger_engine(ledger_server: str, ledger_template: str) -> Iterator[Engine]:
    """An engine on a fresh, migrated database of its own (dropped after the test)."""
    name = f"ledger_t_{uuid.uuid4().hex[:12]}"
    url = create_database(ledger_server, name, template=ledger_template)
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
        drop_database(ledger_server, name)


@pytest.fixture()
def ledger(ledger_engine: Engine) -> LedgerHandle:
    """A :class:`LedgerHandle` on a fresh database."""
    return LedgerHandle(engine=ledger_engine)


@pytest.fixture()
def ledger_factory(ledger_server: str, ledger_template: str) -> Iterator[Callable[[], LedgerHandle]]:
    """A callable that makes further fresh ledgers in one test (to compare two replays, say)."""
    made: list[tuple[str, Engine]] = []

    def make() -> LedgerHandle:
        name = f"ledger_t_{uuid.uuid4().hex[:12]}"
        engine = make_engine(create_database(ledger_server, name, template=ledger_template))
        made.append((name, engine))
        return LedgerHandle(engine=engine)

    try:
        yield make
    finally:
        for name, engine in made:
            engine.dispose()
            drop_database(ledger_server, name)


def database_name(engine: Engine) -> str:
    """Return the database name an engine points at (for messages)."""
    return str(make_url(str(engine.url)).database)
