"""Claims listed by key: index ``claims_listing_idx`` on ``(cluster, namespace, name, uid)``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 02:00:00

``GET /v1/claims`` lists every claim a ledger ever recorded, in the order (cluster, namespace, name, uid). Its
pages used to be offsets into that order, sorted anew for every page: page 800 read and dropped the 79,900
claims before it, and the first page sorted every claim created by T. A page now starts after the key of the
previous page's last claim; with this index the database walks the claims in that order from the key and stops
when the page is full. The index replaces ``claims_name_idx`` on ``(cluster, namespace, name)``, which the
lookups by namespace and name (a claim's history) now find as the prefix of this one.

The upgrade builds the new index before it drops the old one, under a lock that holds back the claims
projection (not ingest) while it builds: seconds for 100,000 claims, about a minute for ten million.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("claims_listing_idx", "claims", ["cluster", "namespace", "name", "uid"], unique=False)
    op.drop_index("claims_name_idx", table_name="claims")


def downgrade() -> None:
    op.create_index("claims_name_idx", "claims", ["cluster", "namespace", "name"], unique=False)
    op.drop_index("claims_listing_idx", table_name="claims")
