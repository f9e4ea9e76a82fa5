"""A device held by one claim alone is billed to it whole: the hourly rollups are emptied to be computed again.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 02:40:00

Two changes to the split of a device held by several allocations at once (``ledger.projections.split``):

- a device that one claim alone holds through several allocation results (two requests of the claim given shares
  of one consumable-capacity device) is billed to that claim whole, as one result would be; it was billed the sum
  of the results' ``consumedCapacity`` fractions (2 x 30 of 100 made 0.6 of the device's hours);
- shares that all state a ``consumedCapacity`` of 0 split the device equally; they were billed nothing.

The rolled hours in ``usage_rollups`` and ``usage_rollups_by_team`` were summed by the old rule, so the upgrade
deletes them (they are derived from ``device_allocations``, which it keeps), as 0011 did: until the hourly job rolls
them up again, from the first allocation on and in bounded chunks, usage answers the hours from the live intervals
(the same figures, more slowly), and the Grafana view ``reporting.team_usage_hourly`` is empty for the hours not
rolled yet. The downgrade empties them as well, for the older release to roll them up by its own rule.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

OLD_COMMENT = ("allocated device-seconds in the hour; concurrent allocations of a device split it by their "
               "consumedCapacity fractions when all state one, else equally (migration 0011)")
NEW_COMMENT = ("allocated device-seconds in the hour; concurrent allocations of a device split it by their "
               "consumedCapacity fractions when all state one, else equally; one claim alone is billed it whole "
               "(migration 0012)")


def _empty_rollups(comment: str) -> None:
    # Both tables in one statement: they always hold the same hours (ledger.projections.rollups).
    op.execute("TRUNCATE usage_rollups, usage_rollups_by_team")
    op.execute(sa.text("COMMENT ON COLUMN usage_rollups.device_seconds IS " + "'" + comment.replace("'", "''") + "'"))


def upgrade() -> None:
    _empty_rollups(NEW_COMMENT)


def downgrade() -> None:
    _empty_rollups(OLD_COMMENT)
