"""Reporting: view ``reporting.occupancy_units``, occupancy counted per piece of hardware as the API counts it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 09:00:00

``GET /v1/occupancy`` counts *units* in its totals (DESIGN §5 device_inventory): a device, or every device
consuming one counter set (``consumesCounters`` -> ``sharedCounters``: a GPU and its MIG partitions are views
of one piece of hardware), and a device still held after leaving its ResourceSlice as a unit of its own
(DESIGN §11.4); ``adminAccess`` allocations never occupy. ``reporting.device_inventory`` and
``reporting.device_occupancy`` keep one row per device, so a panel counting their rows counted every MIG
partition as a device. This view states the unit each interval counts for, so that ``count(DISTINCT (cluster,
driver, pool, unit))`` over the rows of a state covering T gives ``totals.devices`` and ``totals.allocated``
(the rule of ``ledger.projections.queries.occupancy_totals`` and ``ledger.projections.counts``). The existing
views and their columns keep their meaning. Views only: quick, no data is touched.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

NAME = "reporting.occupancy_units"

DOC = (
    "Occupancy per piece of hardware, as GET /v1/occupancy totals count it. unit = the counter set a device "
    "consumes (a GPU and its MIG partitions: one unit), else 'device:' || device. state 'present': the unit is "
    "in the inventory (a device published in a ResourceSlice, or held off-slice by a non-adminAccess "
    "allocation); 'allocated': a non-adminAccess allocation holds one of its devices. At T, "
    "count(DISTINCT (cluster, driver, pool, unit)) over the rows of a state with valid_from <= T and "
    "(valid_to IS NULL OR valid_to > T) = totals.devices / totals.allocated. Rows of one unit overlap: "
    "never add rows up without DISTINCT.")

DEFINITION = (
    # Published devices: each inventory interval counts for its device's unit.
    "SELECT i.cluster, i.driver, i.pool, coalesce(i.counter_set, 'device:' || i.device) AS unit, i.device, i.node, "
    " 'present'::text AS state, false AS off_slice, lower(i.valid) AS valid_from, upper(i.valid) AS valid_to "
    "FROM public.device_inventory i WHERE NOT isempty(i.valid) "
    # Allocations while their device is published: the unit is that of the inventory row at the time.
    "UNION ALL "
    "SELECT a.cluster, a.driver, a.pool, coalesce(i.counter_set, 'device:' || a.device), a.device, i.node, "
    " 'allocated', false, lower(a.valid * i.valid), upper(a.valid * i.valid) "
    "FROM public.device_allocations a JOIN public.device_inventory i ON i.cluster = a.cluster "
    " AND i.driver = a.driver AND i.pool = a.pool AND i.device = a.device AND i.valid && a.valid "
    "WHERE NOT a.admin_access "
    # Allocations outside every inventory interval of their device (held off-slice): the device is a unit of
    # its own, present and allocated while held.
    "UNION ALL "
    "SELECT a.cluster, a.driver, a.pool, 'device:' || a.device, a.device, a.node, s.state, true, "
    " lower(o.r), upper(o.r) "
    "FROM public.device_allocations a "
    "CROSS JOIN LATERAL unnest(multirange(a.valid) - coalesce((SELECT range_agg(i.valid) "
    " FROM public.device_inventory i WHERE i.cluster = a.cluster AND i.driver = a.driver AND i.pool = a.pool "
    " AND i.device = a.device), '{}'::tstzmultirange)) AS o(r) "
    "CROSS JOIN (VALUES ('present'), ('allocated')) AS s(state) "
    "WHERE NOT a.admin_access AND NOT isempty(a.valid)")

COLUMNS = {
    "unit": "the piece of hardware: the device's (first) consumesCounters counterSet, else 'device:' || device; "
            "unique within (cluster, driver, pool)",
    "state": "present (counts in totals.devices) | allocated (counts in totals.allocated)",
    "off_slice": "held by a non-adminAccess allocation while no ResourceSlice publishes the device",
    "valid_to": "NULL = still so",
}


def _quoted(doc: str) -> str:
    return "'" + doc.replace("'", "''") + "'"


def upgrade() -> None:
    op.execute(f"CREATE VIEW {NAME} AS {DEFINITION}")
    op.execute(sa.text(f"COMMENT ON VIEW {NAME} IS {_quoted(DOC)}"))
    for column, doc in COLUMNS.items():
        op.execute(sa.text(f"COMMENT ON COLUMN {NAME}.{column} IS {_quoted(doc)}"))
    # 0003 granted SELECT on the views that existed then; a view made later needs its own grant.
    op.execute(f"GRANT SELECT ON {NAME} TO ledger_reader")


def downgrade() -> None:
    op.execute(f"REVOKE ALL ON {NAME} FROM ledger_reader")
    op.execute(f"DROP VIEW IF EXISTS {NAME}")
