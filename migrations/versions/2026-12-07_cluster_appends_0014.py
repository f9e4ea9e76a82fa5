"""Table ``cluster_appends``: each cluster's count of committed append transactions that changed its translator state.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 12:30:00

A writer translates against the translator state it loaded; when another writer committed in between (a former
leader's write that committed after a standby took the Lease and loaded the state, a replay beside a watch), the
state in hand is behind what is stored. Streams refuse an event at a stale position, but a line that appends no
event (a ``resourceVersion`` moved) wrote the stale entry back, and ``translator_state`` stayed behind the
object's stream for good: every later event of it was refused as a ``StreamConflict``. Every append that changes
the translator state now counts itself here under the append lock, and one that finds a count other than the one
its state was loaded at loads the state again first (``ledger.store.database.LedgerDatabase.append``).

The table starts empty: a cluster without a row has count 0, which is what a state loaded now reflects. Quick.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cluster_appends",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("appends", sa.BigInteger(), nullable=False,
                  comment="append transactions that changed the cluster's translator_state"),
        sa.PrimaryKeyConstraint("cluster", name="cluster_appends_pkey"),
    )


def downgrade() -> None:
    op.drop_table("cluster_appends")
