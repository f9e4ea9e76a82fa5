"""Usage rollups without the node: table ``usage_rollups_by_team``, filled from ``usage_rollups``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 16:00:00

``GET /v1/usage`` summed every rolled row of its window from ``usage_rollups``, whose key includes the
node: 1.79 M rows for 52 hours of a 5,000-node fleet. Every grouping but ``node`` is answered from this
table instead, the same sums without the node column (one row per hour, team, namespace, DeviceClass,
model and driver). The hourly job writes and forgets both tables in one transaction; the upgrade fills
this one from the hours already rolled up, so both hold the same hours from the start.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "usage_rollups_by_team",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("hour", TS, nullable=False, comment="start of the hour [hour, hour + 1h)"),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("device_class", sa.Text(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("driver", sa.Text(), nullable=False),
        sa.Column("device_seconds", sa.Float(), nullable=False,
                  comment="sum of usage_rollups.device_seconds over the nodes of the hour"),
        sa.Column("computed_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("usage_rollups_by_team_pkey")),
    )
    op.create_index("usage_rollups_by_team_hour_idx", "usage_rollups_by_team", ["cluster", "hour"], unique=False)
    # Hours rolled up before this revision: without their rows here the usage query would take them from
    # the live intervals until a rebuild, and the two tables would disagree on which hours are rolled.
    op.execute(
        "INSERT INTO usage_rollups_by_team (cluster, hour, team, namespace, device_class, model, driver, "
        "device_seconds, computed_at) "
        "SELECT cluster, hour, team, namespace, device_class, model, driver, sum(device_seconds), max(computed_at) "
        "FROM usage_rollups GROUP BY cluster, hour, team, namespace, device_class, model, driver")


def downgrade() -> None:
    op.drop_index("usage_rollups_by_team_hour_idx", table_name="usage_rollups_by_team")
    op.drop_table("usage_rollups_by_team")
