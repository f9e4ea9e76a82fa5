"""Alembic environment: the schema comes only from ``ledger.store.tables.metadata``.

The database URL is ``config.attributes["url"]`` when called from ``dra-ledger db upgrade`` or the
``LEDGER_DATABASE_URL`` environment variable otherwise.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from ledger.store.tables import metadata

target_metadata = metadata


def run_migrations_online() -> None:
    """Run the migrations on one connection, in one transaction."""
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.attributes.get("url") or os.environ.get("LEDGER_DATABASE_URL")
    if not url:
        raise SystemExit("set LEDGER_DATABASE_URL to the database to migrate")
    engine = create_engine(str(url))
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported: run against a database")
run_migrations_online()
