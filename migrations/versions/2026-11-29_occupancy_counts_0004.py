"""Occupancy counts: the step function of occupancy totals per cluster, and how far it is exact.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 15:30:00

Clusters that already have events get a coverage row at ``-infinity`` (nothing answered from the
counts yet), so totals over all clusters never sum a cluster the counts do not know; the next refresh
(hourly job, ``dra-ledger rebuild``) fills them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "occupancy_counts",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("at", TS, nullable=False, comment="the totals hold from here until the cluster's next row"),
        sa.Column("devices", sa.Integer(), nullable=False,
                  comment="units present (a device, or the devices of one counter set)"),
        sa.Column("allocated", sa.Integer(), nullable=False, comment="units held by a non-adminAccess allocation"),
        sa.Column("shared", sa.Integer(), nullable=False,
                  comment="units held twice, or by a claim with several live consumers"),
        sa.Column("off_slice", sa.Integer(), nullable=False,
                  comment="devices held while no inventory row covers them"),
        sa.PrimaryKeyConstraint("cluster", "at", name="occupancy_counts_pkey"),
    )
    op.create_table(
        "occupancy_count_coverage",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("valid_before", TS, nullable=False,
                  comment="occupancy_counts answers instants before this (-infinity: none yet, infinity: all)"),
        sa.PrimaryKeyConstraint("cluster", name="occupancy_count_coverage_pkey"),
    )
    op.create_index("claim_consumers_consumer_idx", "claim_consumers", ["cluster", "uid"], unique=False)
    op.execute("INSERT INTO occupancy_count_coverage (cluster, valid_before) "
               "SELECT DISTINCT cluster, '-infinity'::timestamptz FROM events")


def downgrade() -> None:
    op.drop_index("claim_consumers_consumer_idx", table_name="claim_consumers")
    op.drop_table("occupancy_count_coverage")
    op.drop_table("occupancy_counts")
