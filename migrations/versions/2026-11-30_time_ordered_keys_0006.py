"""Observations deduplicated on a key that follows time: ``(cluster, observed_at, digest)``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 01:00:00

Every ingest batch looks up its lines' digests and inserts the new ones. Digests are SHA-256 hashes, so
under the old key ``(cluster, digest)`` a batch of 5,000 lines needed 5,000 pages spread over the whole
index: once the index outgrew the page cache (past ~7 M events on a 2-core, 24 GB machine; about two
days of a 5,000-node fleet) every lookup and insert waited on a disk read. With the receive time first,
a batch's keys land on the last pages of the index whatever its size. The digest already covers the
receive time (``ledger.recorded.WatchLine.digest``), so the new key accepts and refuses exactly the rows
the old one did; ``NULLS NOT DISTINCT`` keeps lines without a receive time (broken lines, kubectl output
replayed without ``--at``) unique by digest alone, as before. Needs PostgreSQL 15 or later.

The upgrade builds the new index before it drops the old one, so the table is never without a key
(it holds a lock that blocks ingest while the index builds: minutes on a ledger of 10 M events).
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE observations ADD CONSTRAINT observations_cluster_observed_at_digest_key "
               "UNIQUE NULLS NOT DISTINCT (cluster, observed_at, digest)")
    op.drop_constraint("observations_cluster_digest_key", "observations", type_="unique")


def downgrade() -> None:
    op.create_unique_constraint("observations_cluster_digest_key", "observations", ["cluster", "digest"])
    op.drop_constraint("observations_cluster_observed_at_digest_key", "observations", type_="unique")
