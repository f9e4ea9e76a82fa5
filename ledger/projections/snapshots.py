"""Report snapshots: the idle-claim report, quota usage and pending demand stored at an instant.

The ``reporting`` views that Grafana reads need plain rows; these three reports depend on the
configuration (thresholds, mappings, quotas) or on CEL, so the report job computes them every N
minutes and stores one snapshot per cluster here (tables ``idle_claim_snapshots``,
``quota_usage_snapshots``, ``pending_demand_snapshots``). Taking a snapshot at an instant that
already has one replaces it (idempotent per (cluster, taken_at)), also when two runs store the same instant at
once: each holds :func:`ledger.store.locks.lock_report_snapshots` for its transaction, so they take turns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from ledger.config import LedgerConfig
from ledger.projections import pending as pending_report
from ledger.projections import queries, quotas
from ledger.projections.base import clusters
from ledger.projections.queries import IdleThresholds
from ledger.recorded import parse_time
from ledger.store.locks import lock_report_snapshots


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotCounts:
    """Rows written by one :func:`take_snapshots` call."""

    idle_claims: int = 0
    quota_rows: int = 0
    pending_classes: int = 0


def _thresholds(config: LedgerConfig) -> IdleThresholds:
    idle = config.idle
    return IdleThresholds(unreserved_s=idle.unreserved_seconds, inactive_consumers_s=idle.inactive_consumers_seconds,
                          unreferenced_s=idle.unreferenced_seconds)


def take_snapshots(conn: Connection, *, at: datetime, config: LedgerConfig,
                   cluster: str | None = None) -> SnapshotCounts:
    """Store the idle-claim report, quota usage and pending demand at ``at`` for each cluster.

    Args:
        at: the instant reported (``taken_at``).
        config: idle thresholds, ``deviceClassMappings`` and quotas.
        cluster: only this cluster (``None``: every cluster with events).

    Returns:
        How many rows were written per report. Idempotent per (cluster, ``at``): the caller's transaction holds
        the report-snapshot lock (:func:`ledger.store.locks.lock_report_snapshots`) from the first statement to
        its end, so a concurrent run waits for it (never fails), then replaces its rows.
    """
    # Before the DELETEs: two runs at once would each delete only rows committed before them and both insert.
    lock_report_snapshots(conn)
    idle_n = quota_n = pending_n = 0
    for name in [cluster] if cluster is not None else clusters(conn):
        params = {"c": name, "at": at}
        for table in ("idle_claim_snapshots", "quota_usage_snapshots", "pending_demand_snapshots"):
            conn.execute(text(f"DELETE FROM {table} WHERE cluster = :c AND taken_at = :at"), params)
        idle = queries.idle_claims(conn, at=at, thresholds=_thresholds(config), cluster=name,
                                   overrides=config.teams.overrides)
        rows = idle["claims"]
        assert isinstance(rows, list)
        for row in rows:
            assert isinstance(row, dict)
            since = row["idleSince"]
            assert isinstance(since, str)
            conn.execute(text(
                "INSERT INTO idle_claim_snapshots (cluster, taken_at, namespace, claim, team, category, idle_since, "
                "devices, wasted_device_hours) VALUES (:c, :at, :ns, :claim, :team, :category, :since, "
                "CAST(:devices AS jsonb), :wasted)"),
                {**params, "ns": row["namespace"], "claim": row["name"],
                 "team": row["team"], "category": row["category"],
                 "since": parse_time(since), "devices": json.dumps(row["devices"]),
                 "wasted": row["wastedDeviceHours"]})
            idle_n += 1
        quota_body = quotas.quotas(conn, at=at, config=config, cluster=name)
        qrows = quota_body["rows"]
        assert isinstance(qrows, list)
        for row in qrows:
            assert isinstance(row, dict)
            conn.execute(text(
                "INSERT INTO quota_usage_snapshots (cluster, taken_at, team, resource_name, used, nominal_quota, "
                "over_quota, reasons) VALUES (:c, :at, :team, :name, :used, :nominal, :over, CAST(:reasons AS jsonb))"),
                {**params, "team": row["team"], "name": row["resourceName"], "used": row["used"],
                 "nominal": row["nominalQuota"], "over": row["overQuota"], "reasons": json.dumps(row["reasons"])})
            quota_n += 1
        demand = pending_report.pending(conn, at=at, cluster=name)
        classes = demand["classes"]
        assert isinstance(classes, list)
        for row in classes:
            assert isinstance(row, dict)
            conn.execute(text(
                "INSERT INTO pending_demand_snapshots (cluster, taken_at, device_class, claims, requested, free) "
                "VALUES (:c, :at, :cls, :claims, :requested, :free)"),
                {**params, "cls": row["deviceClass"], "claims": row["claims"], "requested": row["requested"],
                 "free": row["free"]})
            pending_n += 1
    return SnapshotCounts(idle_claims=idle_n, quota_rows=quota_n, pending_classes=pending_n)
