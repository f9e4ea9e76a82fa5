"""Ledger core schema: observations, events, translator state, checkpoints and read models.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 09:11:09.054860
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("projection", sa.Text(), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False, comment="last global position applied (0 = none)"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("projection", name=op.f("checkpoints_pkey")),
    )
    op.create_table(
        "claim_consumers",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("claim_uid", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("api_group", sa.Text(), nullable=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("uid", sa.Text(), nullable=True),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("claim_consumers_pkey")),
    )
    op.create_index("claim_consumers_key_idx", "claim_consumers", ["cluster", "claim_uid"], unique=False)
    op.create_index("claim_consumers_valid_gist", "claim_consumers", ["valid"], unique=False, postgresql_using="gist")
    op.create_table(
        "claim_states",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("claim_uid", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, comment="pending | allocated"),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("claim_states_pkey")),
    )
    op.create_index("claim_states_key_idx", "claim_states", ["cluster", "claim_uid"], unique=False)
    op.create_index("claim_states_valid_gist", "claim_states", ["valid"], unique=False, postgresql_using="gist")
    op.create_table(
        "claims",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("uid", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("origin", sa.Text(), nullable=False, comment="manual | template | extended"),
        sa.Column("owner_pod", sa.Text(), nullable=True),
        sa.Column("owner_pod_uid", sa.Text(), nullable=True),
        sa.Column("requests", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, comment="pending | allocated | deleted (now)"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deletion_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("cluster", "uid", name="claims_pkey"),
    )
    op.create_index("claims_name_idx", "claims", ["cluster", "namespace", "name"], unique=False)
    op.create_table(
        "device_allocations",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("claim_uid", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("claim", sa.Text(), nullable=False),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("request", sa.Text(), nullable=False),
        sa.Column("device_class", sa.Text(), nullable=True),
        sa.Column("driver", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("device", sa.Text(), nullable=False),
        sa.Column("share_id", sa.Text(), nullable=True),
        sa.Column("consumed_capacity", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("admin_access", sa.Boolean(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column(
            "conflict",
            sa.Boolean(),
            nullable=False,
            comment="another non-shareable allocation of the device overlapped",
        ),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("device_allocations_pkey")),
    )
    op.create_index("device_allocations_claim_idx", "device_allocations", ["cluster", "claim_uid"], unique=False)
    op.create_index(
        "device_allocations_key_idx", "device_allocations", ["cluster", "driver", "pool", "device"], unique=False
    )
    op.create_index(
        "device_allocations_valid_gist", "device_allocations", ["valid"], unique=False, postgresql_using="gist"
    )
    op.create_table(
        "device_classes",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("spec", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("device_classes_pkey")),
    )
    op.create_index("device_classes_key_idx", "device_classes", ["cluster", "name"], unique=False)
    op.create_index("device_classes_valid_gist", "device_classes", ["valid"], unique=False, postgresql_using="gist")
    op.create_table(
        "device_inventory",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("driver", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("device", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("slice_name", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column(
            "counter_set",
            sa.Text(),
            nullable=True,
            comment="first consumesCounters counterSet: devices sharing it are one piece of hardware",
        ),
        sa.Column("allow_multiple_allocations", sa.Boolean(), nullable=False),
        sa.Column("attributes", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("capacity", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("consumes_counters", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("taints", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("device_inventory_pkey")),
    )
    op.create_index(
        "device_inventory_key_idx", "device_inventory", ["cluster", "driver", "pool", "device"], unique=False
    )
    op.create_index("device_inventory_valid_gist", "device_inventory", ["valid"], unique=False, postgresql_using="gist")
    op.create_table(
        "events",
        sa.Column("global_position", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("event_id", sa.UUID(), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("stream_position", sa.Integer(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("source", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("global_position", name=op.f("events_pkey")),
        sa.UniqueConstraint("cluster", "stream", "stream_position", name="events_stream_position_key"),
        sa.UniqueConstraint("event_id", name="events_event_id_key"),
    )
    op.create_index("events_type_idx", "events", ["cluster", "type"], unique=False)
    op.create_table(
        "namespace_teams",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("namespace_teams_pkey")),
    )
    op.create_index("namespace_teams_key_idx", "namespace_teams", ["cluster", "namespace"], unique=False)
    op.create_index("namespace_teams_valid_gist", "namespace_teams", ["valid"], unique=False, postgresql_using="gist")
    op.create_table(
        "observations",
        sa.Column("observation_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False, comment="sha256 of the line: a re-delivered line is a no-op"),
        sa.Column("status", sa.Text(), nullable=False, comment="recorded | rejected"),
        sa.Column("kind", sa.Text(), nullable=True),
        sa.Column("api_version", sa.Text(), nullable=True),
        sa.Column("namespace", sa.Text(), nullable=True),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("uid", sa.Text(), nullable=True),
        sa.Column("resource_version", sa.Text(), nullable=True),
        sa.Column("watch_type", sa.Text(), nullable=True),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("origin", sa.Text(), nullable=False, comment="where the line came from: FILE:LINE or watch:KIND"),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "body",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=True,
            comment="the object as received; the raw text (as a JSON string) when rejected",
        ),
        sa.PrimaryKeyConstraint("observation_id", name=op.f("observations_pkey")),
        sa.UniqueConstraint("cluster", "digest", name="observations_cluster_digest_key"),
    )
    op.create_table(
        "pod_phases",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("pod_uid", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("phase", sa.Text(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column(
            "claims",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="names of the claims the pod references",
        ),
        sa.Column("valid", postgresql.TSTZRANGE(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("pod_phases_pkey")),
    )
    op.create_index("pod_phases_key_idx", "pod_phases", ["cluster", "pod_uid"], unique=False)
    op.create_index("pod_phases_namespace_idx", "pod_phases", ["cluster", "namespace"], unique=False)
    op.create_index("pod_phases_valid_gist", "pod_phases", ["valid"], unique=False, postgresql_using="gist")
    op.create_table(
        "translator_state",
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("state", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "key", name="translator_state_pkey"),
    )


def downgrade() -> None:
    op.drop_table("translator_state")
    op.drop_index("pod_phases_valid_gist", table_name="pod_phases", postgresql_using="gist")
    op.drop_index("pod_phases_namespace_idx", table_name="pod_phases")
    op.drop_index("pod_phases_key_idx", table_name="pod_phases")
    op.drop_table("pod_phases")
    op.drop_table("observations")
    op.drop_index("namespace_teams_valid_gist", table_name="namespace_teams", postgresql_using="gist")
    op.drop_index("namespace_teams_key_idx", table_name="namespace_teams")
    op.drop_table("namespace_teams")
    op.drop_index("events_type_idx", table_name="events")
    op.drop_table("events")
    op.drop_index("device_inventory_valid_gist", table_name="device_inventory", postgresql_using="gist")
    op.drop_index("device_inventory_key_idx", table_name="device_inventory")
    op.drop_table("device_inventory")
    op.drop_index("device_classes_valid_gist", table_name="device_classes", postgresql_using="gist")
    op.drop_index("device_classes_key_idx", table_name="device_classes")
    op.drop_table("device_classes")
    op.drop_index("device_allocations_valid_gist", table_name="device_allocations", postgresql_using="gist")
    op.drop_index("device_allocations_key_idx", table_name="device_allocations")
    op.drop_index("device_allocations_claim_idx", table_name="device_allocations")
    op.drop_table("device_allocations")
    op.drop_index("claims_name_idx", table_name="claims")
    op.drop_table("claims")
    op.drop_index("claim_states_valid_gist", table_name="claim_states", postgresql_using="gist")
    op.drop_index("claim_states_key_idx", table_name="claim_states")
    op.drop_table("claim_states")
    op.drop_index("claim_consumers_valid_gist", table_name="claim_consumers", postgresql_using="gist")
    op.drop_index("claim_consumers_key_idx", table_name="claim_consumers")
    op.drop_table("claim_consumers")
    op.drop_table("checkpoints")
