"""Throwaway PostgreSQL servers and databases for test sessions.

Why this module exists: integration tests need a real PostgreSQL. A session gets one from
:func:`test_server` (the server in ``LEDGER_TEST_DATABASE_URL``, or an embedded one in a temporary
directory), then makes a database per purpose with :func:`create_database`. No pytest import
here, so the pytest plugin, scripts and the CLI can all use it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from ledger.embedded import EmbeddedPostgres, server_account
from ledger.errors import Invalid

__all__ = [
    "TEST_DATABASE_URL_ENV",
    "create_database",
    "drop_database",
    "temporary_data_dir",
    "test_server",
    "to_libpq_url",
]

TEST_DATABASE_URL_ENV = "LEDGER_TEST_DATABASE_URL"
"""Names a server where tests may ``CREATE DATABASE``; unset means an embedded server is started."""

_CONNECT_TIMEOUT_S = 10
_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}


@contextmanager
def temporary_data_dir() -> Iterator[Path]:
    """A fresh, not yet existing data dir path inside a new temporary directory.

    The temporary directory (``tempfile.mkdtemp``, mode 0700) is handed to the server account
    when running as root, so ``nobody`` can reach the data dir; it is deleted, with everything
    in it, when the block ends. Stop any server on the data dir before then.

    Yields:
        ``<tmp>/pgdata``; :class:`~ledger.embedded.EmbeddedPostgres` creates it on start.
    """
    base = Path(tempfile.mkdtemp(prefix="dra-ledger-pg-"))
    try:
        account = server_account()
        if account is not None:
            os.chown(base, account.uid, account.gid)
        yield base / "pgdata"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def test_server() -> Iterator[str]:
    """A PostgreSQL server for one test session, as an admin URL.

    If ``LEDGER_TEST_DATABASE_URL`` is set, yields it unchanged and manages nothing. Otherwise
    starts an :class:`~ledger.embedded.EmbeddedPostgres` in a temporary data dir on a free port
    and, however the block ends, stops it and deletes the directory.

    Yields:
        A URL (``postgresql+psycopg://...`` for the embedded server) of a database on a server
        where the user may ``CREATE DATABASE``.

    Raises:
        EmbeddedPostgresError: the embedded server could not start or stop.
    """
    external = os.environ.get(TEST_DATABASE_URL_ENV)
    if external:
        yield external
        return
    with temporary_data_dir() as data_dir:
        server = EmbeddedPostgres(data_dir)
        try:
            yield server.start()
        finally:
            server.stop()  # before temporary_data_dir deletes the directory under it


# A function named test_* is collected by pytest wherever it is imported into a test module.
test_server.__test__ = False  # type: ignore[attr-defined]  # pytest's opt-out attribute


def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` on the server of ``admin_url``.

    Args:
        admin_url: ``postgresql://`` or ``postgresql+psycopg://`` URL of any database on the
            server, as a user allowed to ``CREATE DATABASE``.
        name: The new database's name (quoted as an identifier; at most 63 bytes).
        template: Database to copy (``CREATE DATABASE ... TEMPLATE``); it must have no other
            connections. ``None`` uses the server's default, ``template1``.

    Returns:
        ``admin_url`` with its database replaced by ``name`` (same scheme, user, host, query).

    Raises:
        Invalid: ``admin_url`` is not a PostgreSQL URL.
        psycopg.Error: the server refused, e.g. ``DuplicateDatabase`` or a busy template.
    """
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
    with psycopg.connect(
        to_libpq_url(admin_url), autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S
    ) as conn:
        conn.execute(query)
    return _with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting its sessions (``DROP DATABASE IF EXISTS ... WITH (FORCE)``).

    Idempotent: a missing database is not an error.

    Args:
        admin_url: As for :func:`create_database`; must not point at ``name`` itself.
        name: The database to drop.

    Raises:
        Invalid: ``admin_url`` is not a PostgreSQL URL.
        psycopg.Error: the server refused, e.g. ``admin_url`` is connected to ``name``.
    """
    query = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(
        to_libpq_url(admin_url), autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S
    ) as conn:
        conn.execute(query)


def to_libpq_url(url: str) -> str:
    """The URL as libpq/psycopg takes it: a SQLAlchemy ``postgresql+psycopg://`` becomes ``postgresql://``.

    Raises:
        Invalid: the scheme is not ``postgresql``, ``postgres`` or ``postgresql+psycopg``.
    """
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES:
        raise Invalid(f"not a PostgreSQL URL (scheme {parts.scheme!r}); expected postgresql[+psycopg]://")
    return urlunsplit(parts._replace(scheme="postgresql"))


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))
