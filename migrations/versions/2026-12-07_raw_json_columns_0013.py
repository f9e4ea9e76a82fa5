"""``observations.body`` and ``events.source`` are stored as ``json`` (the text) instead of ``jsonb``.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 12:00:00

Both columns are written on every ingest and only ever read whole (``observations.body`` is the object as it was
received, kept for audit and for nothing the ledger queries; ``events.source`` is decoded whole with its event), so
the tree that ``jsonb`` builds of each value on input was never used. Parsing it was the largest single item of
the server's CPU a watch event: on a simulated 50-node day (38,294 lines, bodies of ~710 bytes) the server took
~12.9 µs a line to store the bodies as ``jsonb`` and ~4.5 µs as ``json``, which only checks the text is JSON.
``events.payload`` stays ``jsonb``: the read models' rebuild queries into it.

What an operator may notice: the columns' SQL type in ad hoc queries (``body->>'kind'`` works on both;
``@>`` and the other ``jsonb``-only operators need ``body::jsonb``), and the upgrade's time: it rewrites both
tables and their indexes under a lock that blocks ingest and ``/v1/events`` meanwhile (the read models, and so
the other queries, answer throughout): about 0.7 s for 38,000 observations and 0.5 s for 48,000 events on a busy
2-core machine, so minutes for a ledger of 10 M events. The downgrade converts back, as long.
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE observations ALTER COLUMN body TYPE json USING body::json")
    op.execute("ALTER TABLE events ALTER COLUMN source TYPE json USING source::json")


def downgrade() -> None:
    op.execute("ALTER TABLE observations ALTER COLUMN body TYPE jsonb USING body::jsonb")
    op.execute("ALTER TABLE events ALTER COLUMN source TYPE jsonb USING source::jsonb")
