"""Reporting: report tables, the ``reporting`` schema of views for Grafana, and role ``ledger_reader``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 10:00:00

The views are the stable interface Grafana reads (DESIGN §6); they are documented with COMMENT ON
and are not part of ``ledger.store.tables.metadata``. ``ledger_reader`` is a cluster-wide role:
it is created only when missing, granted per database, and can read only schema ``reporting`` (the
views run with their owner's rights, so the reader needs none on the tables behind them). The
downgrade revokes what this database granted and leaves the role itself for other databases.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)

VIEWS: dict[str, tuple[str, str]] = {
    "device_inventory": (
        "Devices published in ResourceSlices (highest pool generation), one row per interval in which "
        "a device kept the same attributes; published_to NULL = still published.",
        "SELECT cluster, driver, pool, device, node, model, counter_set, allow_multiple_allocations, "
        "lower(valid) AS published_from, upper(valid) AS published_to "
        "FROM public.device_inventory WHERE NOT isempty(valid)"),
    "device_occupancy": (
        "Allocation intervals per device (ResourceClaim.status.allocation.devices.results[]): who held "
        "which device from allocated_from to allocated_to (NULL = still held). admin_access rows occupy "
        "nothing; conflict = another non-shareable allocation overlapped.",
        "SELECT cluster, driver, pool, device, node, model, namespace, claim, team, request, "
        "device_class, share_id, consumed_capacity, admin_access, conflict, "
        "lower(valid) AS allocated_from, upper(valid) AS allocated_to "
        "FROM public.device_allocations WHERE NOT isempty(valid)"),
    "team_usage_hourly": (
        "Allocated device-hours per hour per (cluster, team, namespace, DeviceClass, model, node, "
        "driver), from the hourly rollup job. Never add rows of different device_class together.",
        "SELECT cluster, hour, team, namespace, device_class, model, node, driver, "
        "device_seconds / 3600.0 AS device_hours, computed_at FROM public.usage_rollups"),
    "quota_usage": (
        "Kueue-style counted usage per (team, resource name) versus nominal quota, as snapshotted by "
        "the report job at taken_at. reasons lists claims Kueue itself would refuse (still counted).",
        "SELECT cluster, taken_at, team, resource_name, used, nominal_quota, over_quota, reasons "
        "FROM public.quota_usage_snapshots"),
    "idle_claims": (
        "Idle-claim report snapshots (DESIGN §5): category unreserved | inactive-consumers | "
        "unreferenced, idle since, devices held and device-hours wasted so far at taken_at.",
        "SELECT cluster, taken_at, namespace, claim, team, category, idle_since, devices, "
        "jsonb_array_length(devices) AS device_count, wasted_device_hours "
        "FROM public.idle_claim_snapshots"),
    "pending_demand": (
        "Pending demand snapshots per DeviceClass: claims waiting, devices requested, devices of the "
        "class free (unallocated, untainted, selected by the class CEL selectors) at taken_at.",
        "SELECT cluster, taken_at, device_class, claims, requested, free, "
        "greatest(requested - free, 0) AS shortfall FROM public.pending_demand_snapshots"),
    "shared_devices": (
        "Allocations of devices held by more than one allocation at some instant (shareID / "
        "allowMultipleAllocations, or a double booking), with consumed capacity; overlap_from/to is "
        "the period in which another allocation of the same device was also held.",
        "SELECT a.cluster, a.driver, a.pool, a.device, a.node, a.namespace, a.claim, a.team, "
        "a.device_class, a.share_id, a.consumed_capacity, a.conflict, "
        "lower(a.valid * b.valid) AS overlap_from, upper(a.valid * b.valid) AS overlap_to, "
        "b.namespace AS other_namespace, b.claim AS other_claim "
        "FROM public.device_allocations a JOIN public.device_allocations b "
        "ON a.cluster = b.cluster AND a.driver = b.driver AND a.pool = b.pool AND a.device = b.device "
        "AND a.row_id <> b.row_id AND a.valid && b.valid AND a.claim_uid <> b.claim_uid "
        "WHERE NOT a.admin_access AND NOT b.admin_access"),
    "claim_consumers": (
        "reservedFor consumers per claim over time (consumer_to NULL = still reserved), for counting "
        "claims with several consumers.",
        "SELECT c.cluster, cl.namespace, cl.name AS claim, c.resource, c.name AS consumer, c.uid, "
        "lower(c.valid) AS consumer_from, upper(c.valid) AS consumer_to "
        "FROM public.claim_consumers c JOIN public.claims cl ON cl.cluster = c.cluster AND cl.uid = c.claim_uid "
        "WHERE NOT isempty(c.valid)"),
}
"""reporting.<name> -> (documentation, definition)."""


def _report_tables() -> None:
    op.create_table(
        "usage_rollups",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("hour", TS, nullable=False, comment="start of the hour [hour, hour + 1h)"),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("device_class", sa.Text(), nullable=True),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("driver", sa.Text(), nullable=False),
        sa.Column("device_seconds", sa.Float(), nullable=False,
                  comment="allocated device-seconds in the hour, split equally among concurrent allocations"),
        sa.Column("computed_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("usage_rollups_pkey")),
    )
    op.create_index("usage_rollups_hour_idx", "usage_rollups", ["cluster", "hour"], unique=False)
    op.create_table(
        "idle_claim_snapshots",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("taken_at", TS, nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("claim", sa.Text(), nullable=False),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("category", sa.Text(), nullable=False, comment="unreserved | inactive-consumers | unreferenced"),
        sa.Column("idle_since", TS, nullable=False),
        sa.Column("devices", postgresql.JSONB(astext_type=sa.Text()), nullable=False,
                  comment="driver/pool/device names held"),
        sa.Column("wasted_device_hours", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("row_id", name=op.f("idle_claim_snapshots_pkey")),
    )
    op.create_index("idle_claim_snapshots_taken_idx", "idle_claim_snapshots", ["cluster", "taken_at"], unique=False)
    op.create_table(
        "quota_usage_snapshots",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("taken_at", TS, nullable=False),
        sa.Column("team", sa.Text(), nullable=False),
        sa.Column("resource_name", sa.Text(), nullable=False),
        sa.Column("used", sa.Float(), nullable=False,
                  comment="Kueue-style counted usage (a count, or a quantity in base units)"),
        sa.Column("nominal_quota", sa.Float(), nullable=True),
        sa.Column("over_quota", sa.Boolean(), nullable=False),
        sa.Column("reasons", postgresql.JSONB(astext_type=sa.Text()), nullable=False,
                  comment="why Kueue would refuse some of the counted claims"),
        sa.PrimaryKeyConstraint("row_id", name=op.f("quota_usage_snapshots_pkey")),
    )
    op.create_index("quota_usage_snapshots_taken_idx", "quota_usage_snapshots", ["cluster", "taken_at"],
                    unique=False)
    op.create_table(
        "pending_demand_snapshots",
        sa.Column("row_id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("cluster", sa.Text(), nullable=False),
        sa.Column("taken_at", TS, nullable=False),
        sa.Column("device_class", sa.Text(), nullable=False),
        sa.Column("claims", sa.Integer(), nullable=False),
        sa.Column("requested", sa.BigInteger(), nullable=False),
        sa.Column("free", sa.Integer(), nullable=False, comment="devices of the class free and untainted at taken_at"),
        sa.PrimaryKeyConstraint("row_id", name=op.f("pending_demand_snapshots_pkey")),
    )
    op.create_index("pending_demand_snapshots_taken_idx", "pending_demand_snapshots", ["cluster", "taken_at"],
                    unique=False)


def upgrade() -> None:
    _report_tables()
    op.execute("CREATE SCHEMA IF NOT EXISTS reporting")
    op.execute("COMMENT ON SCHEMA reporting IS 'Stable views for Grafana and SQL reports; read by role ledger_reader'")
    for name, (doc, definition) in VIEWS.items():
        op.execute(f"CREATE VIEW reporting.{name} AS {definition}")
        op.execute(sa.text(f"COMMENT ON VIEW reporting.{name} IS " + "'" + doc.replace("'", "''") + "'"))
    # Roles are cluster-wide: create ledger_reader once (NOLOGIN: log in through a member role, or
    # ALTER ROLE ledger_reader LOGIN PASSWORD ... where a direct login is wanted), grant per database.
    op.execute("DO $$ BEGIN "
               "IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'ledger_reader') THEN "
               " IF NOT (SELECT rolsuper OR rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN "
               "  RAISE EXCEPTION 'role ledger_reader is missing and % may not create roles', current_user "
               "   USING HINT = 'run CREATE ROLE ledger_reader NOLOGIN as an administrator, then upgrade again'; "
               " END IF; "
               " CREATE ROLE ledger_reader NOLOGIN; "
               "END IF; END $$")
    op.execute("DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO ledger_reader', current_database()); "
               "END $$")
    op.execute("GRANT USAGE ON SCHEMA reporting TO ledger_reader")
    op.execute("GRANT SELECT ON ALL TABLES IN SCHEMA reporting TO ledger_reader")


def downgrade() -> None:
    op.execute("REVOKE ALL ON ALL TABLES IN SCHEMA reporting FROM ledger_reader")
    op.execute("REVOKE ALL ON SCHEMA reporting FROM ledger_reader")
    op.execute("DO $$ BEGIN EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM ledger_reader', current_database()); "
               "END $$")
    for name in reversed(list(VIEWS)):
        op.execute(f"DROP VIEW IF EXISTS reporting.{name}")
    op.execute("DROP SCHEMA IF EXISTS reporting")
    op.drop_index("pending_demand_snapshots_taken_idx", table_name="pending_demand_snapshots")
    op.drop_table("pending_demand_snapshots")
    op.drop_index("quota_usage_snapshots_taken_idx", table_name="quota_usage_snapshots")
    op.drop_table("quota_usage_snapshots")
    op.drop_index("idle_claim_snapshots_taken_idx", table_name="idle_claim_snapshots")
    op.drop_table("idle_claim_snapshots")
    op.drop_index("usage_rollups_hour_idx", table_name="usage_rollups")
    op.drop_table("usage_rollups")
