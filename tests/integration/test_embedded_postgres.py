"""The embedded server is PostgreSQL 18, is shared by every handle on its data dir, and stops cleanly.

Run as root, these tests also cover the server running as ``nobody``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ledger.embedded import EmbeddedPostgres, EmbeddedPostgresError
from ledger.testing import pg

pytestmark = pytest.mark.integration


@pytest.fixture
def data_dir() -> Iterator[Path]:
    with pg.temporary_data_dir() as path:
        yield path


@pytest.fixture
def server(data_dir: Path) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(data_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def admin_url() -> Iterator[str]:
    with pg.test_server() as url:
        yield url


def _scalar(url: str, query: str) -> object:
    with psycopg.connect(pg.to_libpq_url(url)) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_the_embedded_server_is_postgresql_18_on_loopback(server: EmbeddedPostgres) -> None:
    url = server.start()

    assert url.startswith("postgresql+psycopg://postgres@127.0.0.1:")
    assert url.endswith("/postgres")
    version = _scalar(url, "SELECT version()")
    assert isinstance(version, str)
    assert version.startswith("PostgreSQL 18.")


def test_a_second_handle_on_the_same_data_dir_reuses_the_running_server(
    server: EmbeddedPostgres, data_dir: Path
) -> None:
    url = server.start()
    first = server.postmaster()

    second = EmbeddedPostgres(data_dir)

    assert second.start() == url
    assert second.postmaster() == first
    assert first is not None
    assert first.status == "ready"
    assert second.url("ledger") == url.removesuffix("/postgres") + "/ledger"


def test_a_stopped_server_is_not_running_and_starts_again_on_its_data(server: EmbeddedPostgres) -> None:
    server.start()

    server.stop()

    assert not server.is_running()
    server.stop()  # idempotent
    with pytest.raises(EmbeddedPostgresError):
        server.url("postgres")
    assert _scalar(server.start(), "SELECT 1") == 1


def test_a_restart_while_clients_hold_connections_keeps_the_port(server: EmbeddedPostgres) -> None:
    # A running API holds the URL and pooled connections. Stopping the server closes them from its side, and
    # until the clients close theirs the server's ends stay in FIN-WAIT-2 / TIME-WAIT on the port; the check
    # that the previous port is free must still accept it (PostgreSQL binds with SO_REUSEADDR), or the API
    # keeps knocking on a dead port after `db stop` / `db start`.
    url = server.start()
    client = psycopg.connect(pg.to_libpq_url(url))
    try:
        assert client.execute("SELECT 1").fetchone() == (1,)
        server.stop()

        assert server.start() == url
    finally:
        client.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another account")
def test_a_data_dir_the_server_account_cannot_reach_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)

    with pytest.raises(EmbeddedPostgresError, match="--data-dir"):
        EmbeddedPostgres(closed / "pgdata").start()
    assert not (closed / "pgdata").exists()


def test_a_created_database_accepts_connections_and_dropping_it_forces_them_out(admin_url: str) -> None:
    name = f"ledger_test_{uuid.uuid4().hex}"
    url = pg.create_database(admin_url, name)
    try:
        with psycopg.connect(pg.to_libpq_url(url), autocommit=True) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (name,)
            pg.drop_database(admin_url, name)  # while this connection is still open
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
    finally:
        pg.drop_database(admin_url, name)  # idempotent

    assert _scalar(admin_url, f"SELECT count(*) FROM pg_database WHERE datname = '{name}'") == 0


def test_a_database_created_from_a_template_has_the_template_tables(admin_url: str) -> None:
    template, copy = f"ledger_tpl_{uuid.uuid4().hex}", f"ledger_copy_{uuid.uuid4().hex}"
    template_url = pg.create_database(admin_url, template)
    try:
        with psycopg.connect(pg.to_libpq_url(template_url)) as conn:
            conn.execute("CREATE TABLE marker (id int)")
        copy_url = pg.create_database(admin_url, copy, template=template)
        assert _scalar(copy_url, "SELECT to_regclass('marker') IS NOT NULL") is True
    finally:
        pg.drop_database(admin_url, copy)
        pg.drop_database(admin_url, template)
