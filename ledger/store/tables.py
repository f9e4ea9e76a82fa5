"""The only SQLAlchemy ``MetaData`` of the ledger: every table, index and constraint, named.

Alembic migrations create exactly these objects; runtime code never issues DDL. Constraint names are
explicit so adapters can decide by ``diag.constraint_name`` (STYLE: errors by constraint, never by
message text). Every key starts with ``cluster`` so the schema can be distributed by cluster later.
Intervals are ``tstzrange`` ``[from, to)`` with GiST indexes: "at time T" is ``valid @> T``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSON, JSONB, TSTZRANGE, UUID

metadata = MetaData(naming_convention={
    "ix": "%(table_name)s_%(column_0_N_name)s_idx",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
    "pk": "%(table_name)s_pkey",
})

TS = DateTime(timezone=True)

observations = Table(
    "observations", metadata,
    Column("observation_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("digest", Text, nullable=False, comment="sha256 of the line: a re-delivered line is a no-op"),
    Column("status", Text, nullable=False, comment="recorded | rejected"),
    Column("kind", Text),
    Column("api_version", Text),
    Column("namespace", Text),
    Column("name", Text),
    Column("uid", Text),
    Column("resource_version", Text),
    Column("watch_type", Text),
    Column("observed_at", TS),
    Column("recorded_at", TS, nullable=False),
    Column("origin", Text, nullable=False, comment="where the line came from: FILE:LINE or watch:KIND"),
    Column("error", Text),
    # json, not jsonb: the body is only ever stored and read whole, so the server need not build jsonb's tree of
    # every watch event (~8 µs of its CPU a line of the ~45 an ingest costs it; migration 0013).
    Column("body", JSON, comment="the object as received; the raw text (as a JSON string) when rejected"),
    # Receive time first, so that a batch's lookups and inserts land on the index's last pages (hashes spread
    # them over all of it); the digest covers the receive time, so the key refuses what (cluster, digest) did.
    UniqueConstraint("cluster", "observed_at", "digest", name="observations_cluster_observed_at_digest_key",
                     postgresql_nulls_not_distinct=True),
)

events = Table(
    "events", metadata,
    Column("global_position", BigInteger, Identity(always=True), primary_key=True),
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("cluster", Text, nullable=False),
    Column("stream", Text, nullable=False),
    Column("stream_position", Integer, nullable=False),
    Column("type", Text, nullable=False),
    Column("occurred_at", TS, nullable=False),
    Column("recorded_at", TS, nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("source", JSON, nullable=False),  # json, as observations.body: read whole, never queried into
    UniqueConstraint("event_id", name="events_event_id_key"),
    UniqueConstraint("cluster", "stream", "stream_position", name="events_stream_position_key"),
    Index("events_type_idx", "cluster", "type"),
)

translator_state = Table(
    "translator_state", metadata,
    Column("cluster", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("state", JSONB, nullable=False),
    PrimaryKeyConstraint("cluster", "key", name="translator_state_pkey"),
)

checkpoints = Table(
    "checkpoints", metadata,
    Column("projection", Text, primary_key=True),
    Column("position", BigInteger, nullable=False, comment="last global position applied (0 = none)"),
    Column("updated_at", TS, nullable=False),
)


cluster_appends = Table(
    "cluster_appends", metadata,
    Column("cluster", Text, nullable=False),
    Column("appends", BigInteger, nullable=False,
           comment="append transactions that changed the cluster's translator_state"),
    PrimaryKeyConstraint("cluster", name="cluster_appends_pkey"),
)
"""One counter per cluster, moved under the append lock by every append transaction that changes its
``translator_state``: a writer whose translator state was loaded at another count knows that another writer (a
former leader's late commit, a replay beside a watch) changed what is stored since, and loads the state again
before it translates (migration 0014)."""

watch_checkpoints = Table(
    "watch_checkpoints", metadata,
    Column("cluster", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("api_version", Text, nullable=False),
    Column("resource_version", Text, nullable=False, comment="opaque; compared only for equality"),
    Column("updated_at", TS, nullable=False),
    PrimaryKeyConstraint("cluster", "kind", name="watch_checkpoints_pkey"),
)
"""The resourceVersion each watch resumes from; committed with the observations it covers."""


def _interval_indexes(name: str, *key: str) -> tuple[Index, Index]:
    return (Index(f"{name}_valid_gist", "valid", postgresql_using="gist"),
            Index(f"{name}_key_idx", *key))


device_inventory = Table(
    "device_inventory", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("driver", Text, nullable=False),
    Column("pool", Text, nullable=False),
    Column("device", Text, nullable=False),
    Column("node", Text),
    Column("slice_name", Text, nullable=False),
    Column("model", Text),
    Column("counter_set", Text,
           comment="first consumesCounters counterSet: devices sharing it are one piece of hardware"),
    Column("allow_multiple_allocations", Boolean, nullable=False),
    Column("attributes", JSONB, nullable=False),
    Column("capacity", JSONB, nullable=False),
    Column("consumes_counters", JSONB, nullable=False),
    Column("taints", JSONB, nullable=False),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("device_inventory", "cluster", "driver", "pool", "device"),
)

device_allocations = Table(
    "device_allocations", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("claim_uid", Text, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("claim", Text, nullable=False),
    Column("team", Text, nullable=False),
    Column("request", Text, nullable=False),
    Column("device_class", Text),
    Column("driver", Text, nullable=False),
    Column("pool", Text, nullable=False),
    Column("device", Text, nullable=False),
    Column("share_id", Text),
    Column("consumed_capacity", JSONB, nullable=False),
    Column("admin_access", Boolean, nullable=False),
    Column("node", Text),
    Column("model", Text),
    Column("conflict", Boolean, nullable=False, comment="another non-shareable allocation of the device overlapped"),
    Column("valid", TSTZRANGE, nullable=False),
    Column("awaiting_device_from", DateTime(timezone=True),
           comment="the allocation's start, while no device_inventory row held the device then when it was applied: "
                   "model and node wait for its DevicePublished / DeviceUpdated; NULL otherwise"),
    *_interval_indexes("device_allocations", "cluster", "driver", "pool", "device"),
    Index("device_allocations_claim_idx", "cluster", "claim_uid"),
    # Rows waiting for their device (a claim recorded before its ResourceSlice): few, found by each
    # DevicePublished / DeviceUpdated of the device (ledger.projections.models.DeviceAllocations).
    Index("device_allocations_awaiting_device_idx", "cluster", "driver", "pool", "device",
          postgresql_where=text("awaiting_device_from IS NOT NULL")),
)

claim_consumers = Table(
    "claim_consumers", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("claim_uid", Text, nullable=False),
    Column("resource", Text, nullable=False),
    Column("api_group", Text),
    Column("name", Text, nullable=False),
    Column("uid", Text),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("claim_consumers", "cluster", "claim_uid"),
    # A pod's first recorded phase changes whether its consumer rows were live before it; the occupancy
    # counts find those rows by pod uid (ledger.projections.counts.forget_for_batch).
    Index("claim_consumers_consumer_idx", "cluster", "uid"),
)

claims = Table(
    "claims", metadata,
    Column("cluster", Text, nullable=False),
    Column("uid", Text, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("origin", Text, nullable=False, comment="manual | template | extended"),
    Column("owner_pod", Text),
    Column("owner_pod_uid", Text),
    Column("requests", JSONB, nullable=False),
    Column("state", Text, nullable=False, comment="pending | allocated | deleted (now)"),
    Column("created_at", TS, nullable=False),
    Column("deletion_requested_at", TS),
    Column("deleted_at", TS),
    PrimaryKeyConstraint("cluster", "uid", name="claims_pkey"),
    Index("claims_listing_idx", "cluster", "namespace", "name", "uid"),
)

claim_states = Table(
    "claim_states", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("claim_uid", Text, nullable=False),
    Column("state", Text, nullable=False, comment="pending | allocated"),
    Column("node", Text),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("claim_states", "cluster", "claim_uid"),
)

pod_phases = Table(
    "pod_phases", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("pod_uid", Text, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("phase", Text, nullable=False),
    Column("node", Text),
    Column("claims", JSONB, nullable=False, comment="names of the claims the pod references"),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("pod_phases", "cluster", "pod_uid"),
    Index("pod_phases_namespace_idx", "cluster", "namespace"),
)

namespace_teams = Table(
    "namespace_teams", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("team", Text, nullable=False),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("namespace_teams", "cluster", "namespace"),
)

device_classes = Table(
    "device_classes", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("device_classes", "cluster", "name"),
)

device_taint_rules = Table(
    "device_taint_rules", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("device_selector", JSONB,
           comment="DeviceTaintRule.spec.deviceSelector; NULL: no selector, matches no device"),
    Column("effect", Text, nullable=False, comment="DeviceTaintRule.spec.taint.effect"),
    Column("taint", JSONB, nullable=False, comment="DeviceTaintRule.spec.taint {key, value, effect, timeAdded}"),
    Column("valid", TSTZRANGE, nullable=False),
    *_interval_indexes("device_taint_rules", "cluster", "name"),
)

READ_MODELS = (namespace_teams, device_inventory, device_classes, device_taint_rules, pod_phases, claims, claim_states,
               claim_consumers, device_allocations)
"""Tables derived from ``events``, which a rebuild empties with ``TRUNCATE`` and refills, in the one order every
lock on them is taken in. The ``TRUNCATE`` (``ledger.projections.runner.table_names``) and every read of them
(``ledger.store.database.LedgerDatabase.reading``) lock them in this order, so a read waits for a rebuild holding
nothing, and neither deadlocks with the other. Every projection's tables are listed here (the runner refuses a
projection table missing from it)."""


# --- reports (migrations 0003, 0005): written by the jobs in workers/jobs.py through ledger.services ------

def _hourly_usage(name: str, *, node: bool, seconds_comment: str) -> Table:
    """An hourly device-seconds table keyed by (cluster, hour, team, namespace, DeviceClass, model, [node,]
    driver); the two rollups differ only in the node."""
    return Table(
        name, metadata,
        Column("row_id", BigInteger, Identity(always=True), primary_key=True),
        Column("cluster", Text, nullable=False),
        Column("hour", TS, nullable=False, comment="start of the hour [hour, hour + 1h)"),
        Column("team", Text, nullable=False),
        Column("namespace", Text, nullable=False),
        Column("device_class", Text),
        Column("model", Text),
        *([Column("node", Text)] if node else []),
        Column("driver", Text, nullable=False),
        Column("device_seconds", Float, nullable=False, comment=seconds_comment),
        Column("computed_at", TS, nullable=False),
        Index(f"{name}_hour_idx", "cluster", "hour"),
    )


SECONDS_COMMENT = ("allocated device-seconds in the hour; concurrent allocations of a device split it by their "
                   "consumedCapacity fractions when all state one, else equally; one claim alone is billed it whole "
                   "(migration 0012)")
"""The comment of ``usage_rollups.device_seconds``: the split of ``ledger.projections.split``."""

usage_rollups = _hourly_usage("usage_rollups", node=True, seconds_comment=SECONDS_COMMENT)
"""Device-seconds per hour per (team, namespace, DeviceClass, model, node, driver); an hour is
recomputed whole (delete + insert) so a re-run replaces it."""

usage_rollups_by_team = _hourly_usage(
    "usage_rollups_by_team", node=False,
    seconds_comment="sum of usage_rollups.device_seconds over the nodes of the hour")
"""``usage_rollups`` summed over nodes: device-seconds per hour per (team, namespace, DeviceClass, model,
driver). Written and forgotten with ``usage_rollups`` in the same transaction, so both hold the same hours;
it answers every usage grouping but ``node`` without reading a row per node (migration 0005)."""

idle_claim_snapshots = Table(
    "idle_claim_snapshots", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("taken_at", TS, nullable=False),
    Column("namespace", Text, nullable=False),
    Column("claim", Text, nullable=False),
    Column("team", Text, nullable=False),
    Column("category", Text, nullable=False, comment="unreserved | inactive-consumers | unreferenced"),
    Column("idle_since", TS, nullable=False),
    Column("devices", JSONB, nullable=False, comment="driver/pool/device names held"),
    Column("wasted_device_hours", Float, nullable=False),
    Index("idle_claim_snapshots_taken_idx", "cluster", "taken_at"),
)

quota_usage_snapshots = Table(
    "quota_usage_snapshots", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("taken_at", TS, nullable=False),
    Column("team", Text, nullable=False),
    Column("resource_name", Text, nullable=False),
    Column("used", Float, nullable=False, comment="Kueue-style counted usage (a count, or a quantity in base units)"),
    Column("nominal_quota", Float),
    Column("over_quota", Boolean, nullable=False),
    Column("reasons", JSONB, nullable=False, comment="why Kueue would refuse some of the counted claims"),
    Index("quota_usage_snapshots_taken_idx", "cluster", "taken_at"),
)

pending_demand_snapshots = Table(
    "pending_demand_snapshots", metadata,
    Column("row_id", BigInteger, Identity(always=True), primary_key=True),
    Column("cluster", Text, nullable=False),
    Column("taken_at", TS, nullable=False),
    Column("device_class", Text, nullable=False),
    Column("claims", Integer, nullable=False),
    Column("requested", BigInteger, nullable=False),
    Column("free", Integer, nullable=False, comment="devices of the class free and untainted at taken_at"),
    Index("pending_demand_snapshots_taken_idx", "cluster", "taken_at"),
)

# --- occupancy counts (migration 0004): the step function of occupancy totals (ledger.projections.counts) ---

occupancy_counts = Table(
    "occupancy_counts", metadata,
    Column("cluster", Text, nullable=False),
    Column("at", TS, nullable=False, comment="the totals hold from here until the cluster's next row"),
    Column("devices", Integer, nullable=False, comment="units present (a device, or the devices of one counter set)"),
    Column("allocated", Integer, nullable=False, comment="units held by a non-adminAccess allocation"),
    Column("shared", Integer, nullable=False, comment="units held twice, or by a claim with several live consumers"),
    Column("off_slice", Integer, nullable=False, comment="devices held while no inventory row covers them"),
    PrimaryKeyConstraint("cluster", "at", name="occupancy_counts_pkey"),
)
"""Occupancy totals per cluster from ``at`` on; answers instants before the cluster's coverage."""

occupancy_count_coverage = Table(
    "occupancy_count_coverage", metadata,
    Column("cluster", Text, nullable=False),
    Column("valid_before", TS, nullable=False,
           comment="occupancy_counts answers instants before this (-infinity: none yet, infinity: all)"),
    PrimaryKeyConstraint("cluster", name="occupancy_count_coverage_pkey"),
)
"""How far each cluster's ``occupancy_counts`` rows are exact; lowered by late events, raised by a refresh."""

REPORTS = (usage_rollups, usage_rollups_by_team, idle_claim_snapshots, quota_usage_snapshots,
           pending_demand_snapshots)
"""Tables the report jobs write (not read models: a rebuild keeps the snapshots and forgets the rolled
hours, which are sums of ``device_allocations``; re-running a job replaces rows)."""
