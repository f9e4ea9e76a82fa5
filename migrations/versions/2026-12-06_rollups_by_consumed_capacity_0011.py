"""Shared devices billed by consumedCapacity: the hourly rollups are emptied to be computed again.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 23:30:00

Usage used to divide every second of a device held by several allocations equally among them. It now bills
each allocation its ``consumedCapacity`` fraction of the device's capacity when every allocation holding the
device states one (``ledger.projections.split``), as the shared-usage report already did. The rolled hours in
``usage_rollups`` and ``usage_rollups_by_team`` were summed by the old rule, so the upgrade deletes them (they
are derived from ``device_allocations``, which it keeps): until the hourly job rolls them up again, from the
first allocation on and in bounded chunks, usage answers the hours from the live intervals (the same figures,
more slowly), and the Grafana view ``reporting.team_usage_hourly`` is empty for the hours not rolled yet. The
downgrade empties them as well, for the older release to roll them up by its own rule.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

OLD_COMMENT = "allocated device-seconds in the hour, split equally among concurrent allocations"
NEW_COMMENT = ("allocated device-seconds in the hour; concurrent allocations of a device split it by their "
               "consumedCapacity fractions when all state one, else equally (migration 0011)")


def _empty_rollups(comment: str) -> None:
    # Both tables in one statement: they always hold the same hours (ledger.projections.rollups).
    op.execute("TRUNCATE usage_rollups, usage_rollups_by_team")
    op.execute(sa.text("COMMENT ON COLUMN usage_rollups.device_seconds IS " + "'" + comment.replace("'", "''") + "'"))


def upgrade() -> None:
    _empty_rollups(NEW_COMMENT)


def downgrade() -> None:
    _empty_rollups(OLD_COMMENT)
