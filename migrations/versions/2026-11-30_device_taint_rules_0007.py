"""Read model ``device_taint_rules``: the spec of each DeviceTaintRule over time.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 04:00:00

DESIGN §11.9: a device tainted ``NoSchedule`` / ``NoExecute`` by a DeviceTaintRule is not free for pending
demand, as one tainted in its ResourceSlice is not. The translator records the rules as
``DeviceTaintRuleDefined`` / ``Changed`` / ``Deleted``; this table keeps one interval per rule spec, as
``device_classes`` does for DeviceClasses. It starts empty: a rebuild (or catch-up from the events) fills it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "device_taint_rules",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("device_selector", postgresql.JSONB(astext_type=sa.Text()), nullable=True,
                  comment="DeviceTaintRule.spec.deviceSelector; NULL: no selector, matches no device"),
        sa.Column("effect", sa.Text(), nullable=False, comment="DeviceTaintRule.spec.taint.effect"),
        sa.Column("taint", postgresql.JSONB(astext_type=sa.Text()), nullable=False,
                  comment="DeviceTaintRule.spec.taint {key, value, effect, timeAdded}"),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("device_taint_rules_pkey")),
    )
    op.create_index("device_taint_rules_key_idx", "device_taint_rules", ["cluster", "name"], unique=False)
    op.create_index("device_taint_rules_valid_gist", "device_taint_rules", ["valid"], unique=False,
                    postgresql_using="gist")


def downgrade() -> None:
    op.drop_index("device_taint_rules_valid_gist", table_name="device_taint_rules", postgresql_using="gist")
    op.drop_index("device_taint_rules_key_idx", table_name="device_taint_rules")
    op.drop_table("device_taint_rules")
