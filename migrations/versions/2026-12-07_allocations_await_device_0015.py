"""``device_allocations.device_published``: allocations applied before their device's ResourceSlice was recorded.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 18:30:00

An allocation takes ``model`` and ``node`` from the device's ``device_inventory`` row at its start. When the
ClaimAllocated came before the DevicePublished in global order (a watch started on a running cluster lists claims
and slices at once; a recording with bursts interleaved), there was no row yet, and the allocation kept no model
for good: usage by model, and prices by model, missed its hours. Such rows are now marked
``device_published = false`` and the device's next DevicePublished / DeviceUpdated dated at or before their start
fills them (``ledger.projections.models.DeviceAllocations``).

Existing rows: those with no model whose device no inventory row holds at their start are marked, so a slice
recorded later still fills them; rows whose slice was recorded already keep their missing model until
``dra-ledger rebuild`` (README, *Upgrading*). Quick: one pass over ``device_allocations`` rows without a model.
The downgrade drops the column and its index.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("device_allocations", sa.Column(
        "device_published", sa.Boolean(), server_default=sa.text("true"), nullable=False,
        comment="false: no device_inventory row held the device at the start when the allocation was applied; "
                "model and node wait for its DevicePublished / DeviceUpdated"))
    op.execute(
        "UPDATE device_allocations a SET device_published = false WHERE a.model IS NULL AND NOT isempty(a.valid) "
        "AND NOT EXISTS (SELECT 1 FROM device_inventory i WHERE i.cluster = a.cluster AND i.driver = a.driver "
        " AND i.pool = a.pool AND i.device = a.device AND i.valid @> lower(a.valid))")
    op.create_index("device_allocations_unpublished_idx", "device_allocations",
                    ["cluster", "driver", "pool", "device"], postgresql_where=sa.text("NOT device_published"))


def downgrade() -> None:
    op.drop_index("device_allocations_unpublished_idx", table_name="device_allocations")
    op.drop_column("device_allocations", "device_published")
