"""Schema management through Alembic: ``dra-ledger db upgrade`` and the "is the schema current" check.

Runtime code never issues DDL; it calls :func:`upgrade` (an explicit step) or :func:`require_current`
which fails with a message telling the operator what to run.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

from ledger.errors import Invalid, SchemaNotReady

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
"""The Alembic script directory shipped beside the ``ledger`` package (also inside the wheel)."""


MIGRATION_LOCK_KEY = 0x4C45444745520001
"""Advisory lock held while migrating ("LEDGER" + 1), so concurrent upgrades run one after another."""


def alembic_config() -> Config:
    """Return an Alembic configuration pointing at :data:`MIGRATIONS` (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    """Return the newest migration revision id shipped with this code."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "the migrations directory has no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    """Return the revision recorded in ``alembic_version`` (``None`` for an empty database)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


OLDEST_SERVER = 150000
"""Oldest PostgreSQL the schema needs (``server_version_num``): 15, for ``UNIQUE NULLS NOT DISTINCT``."""


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database behind ``engine`` to ``revision`` (idempotent when already there).

    Raises:
        Invalid: the server is older than :data:`OLDEST_SERVER` (checked before any migration runs).
    """
    config = alembic_config()
    with engine.begin() as conn:
        number, version = conn.execute(text("SELECT current_setting('server_version_num')::int, "
                                            "current_setting('server_version')")).one()
        if number < OLDEST_SERVER:
            raise Invalid(f"the database server runs PostgreSQL {version}; the ledger needs PostgreSQL "
                          f"{OLDEST_SERVER // 10000} or later")
        # Two processes starting on a fresh database must not both run the migrations: the second waits
        # here, then finds the schema at head and does nothing.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrate the database down to ``revision`` (``"base"`` removes every ledger table)."""
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def require_current(engine: Engine) -> None:
    """Check that the schema is at the head revision of this code.

    Raises:
        SchemaNotReady: the database is empty or at another revision; the message says what to run.
    """
    current, head = current_revision(engine), head_revision()
    if current != head:
        found = "no ledger schema" if current is None else f"schema revision {current}"
        raise SchemaNotReady(f"the database has {found}, this dra-ledger needs {head}: "
                             "run `dra-ledger db upgrade`")


def ensure_database(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``admin_url`` unless it exists; return its URL.

    Used for the embedded server, where the ledger owns the whole server.
    """
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    url = make_url(admin_url)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
            if not exists:
                quoted = conn.dialect.identifier_preparer.quote(name)
                try:
                    conn.execute(text(f"CREATE DATABASE {quoted}"))
                except (IntegrityError, ProgrammingError):
                    # Another process created it between our check and our CREATE: that is what we wanted.
                    if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar():
                        raise
    finally:
        engine.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` (closing its connections) if it exists."""
    from sqlalchemy import create_engine

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(name)
            conn.execute(text(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
    finally:
        engine.dispose()
