"""Watch checkpoints: the resourceVersion each watch resumes from, per cluster and kind.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 09:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "watch_checkpoints",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("api_version", sa.Text(), nullable=False),
        sa.Column("resource_version", sa.Text(), nullable=False, comment="opaque; compared only for equality"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "kind", name="watch_checkpoints_pkey"),
    )


def downgrade() -> None:
    op.drop_table("watch_checkpoints")
