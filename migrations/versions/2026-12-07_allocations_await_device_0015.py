"""``device_allocations.awaiting_device_from``: allocations applied before their device's ResourceSlice was recorded.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 18:30:00

An allocation takes ``model`` and ``node`` from the device's ``device_inventory`` row at its start. When the
ClaimAllocated came before the DevicePublished in global order (a watch started on a running cluster lists claims
and slices at once; a recording with bursts interleaved), there was no row yet, and the allocation kept no model
for good: usage by model, and prices by model, missed its hours. Such rows now keep the allocation's start in
``awaiting_device_from`` (a relabel's piece keeps it too), and the device's next DevicePublished / DeviceUpdated
dated at or before that start fills them (``ledger.projections.models.DeviceAllocations``).

Existing rows: those with no model whose device no inventory row holds at their start are marked (with their own
start: the allocation's, unless a relabel split it, which only a rebuild knows), so a slice recorded later still
fills them; rows whose slice was recorded already keep their missing model until ``dra-ledger rebuild`` (README,
*Upgrading*). Quick: one pass over ``device_allocations`` rows without a model. The downgrade drops the column and
its index.
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
        "awaiting_device_from", sa.DateTime(timezone=True), nullable=True,
        comment="the allocation's start, while no device_inventory row held the device then when it was applied: "
                "model and node wait for its DevicePublished / DeviceUpdated; NULL otherwise"))
    op.execute(
        "UPDATE device_allocations a SET awaiting_device_from = lower(a.valid) WHERE a.model IS NULL "
        "AND NOT isempty(a.valid) AND NOT EXISTS (SELECT 1 FROM device_inventory i WHERE i.cluster = a.cluster "
        " AND i.driver = a.driver AND i.pool = a.pool AND i.device = a.device AND i.valid @> lower(a.valid))")
    op.create_index("device_allocations_awaiting_device_idx", "device_allocations",
                    ["cluster", "driver", "pool", "device"],
                    postgresql_where=sa.text("awaiting_device_from IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("device_allocations_awaiting_device_idx", table_name="device_allocations")
    op.drop_column("device_allocations", "awaiting_device_from")
