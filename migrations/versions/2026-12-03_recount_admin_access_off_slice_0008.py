"""Occupancy counts: forget the stored step functions, so they are computed again with the off-slice rule.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 10:00:00

A device that has left its ResourceSlice and is held only by ``adminAccess`` allocations is no longer a
unit of the totals (DESIGN §5: ``adminAccess`` never occupies; §11.4: devices still *held* after leaving
their slice count off-slice). Rows of ``occupancy_counts`` written before counted it in ``devices`` (and
so as free), and a covered instant is never computed again by itself. This revision deletes the rows and
lowers every cluster's coverage to ``-infinity``, as a rebuild does (``ledger.projections.counts.forget_all``):
until the next refresh (the ``occupancy-counts`` job, ``dra-ledger rebuild``) totals come from the
aggregate of the intervals, which applies the rule. No schema change; the downgrade forgets them too, so
that the older code computes them again with its own rule.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _forget_counts() -> None:
    op.execute("DELETE FROM occupancy_counts")
    op.execute("UPDATE occupancy_count_coverage SET valid_before = '-infinity'")


def upgrade() -> None:
    _forget_counts()


def downgrade() -> None:
    _forget_counts()
