"""A ledger for tests: one fresh database, replay helpers and the query layer in one object.

Handed out by the ``ledger`` pytest fixture (see :mod:`ledger.testing.pytest_plugin`); usable on its
own with any migrated database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, text

from ledger import services
from ledger.events import RecordedEvent
from ledger.projections import queries, runner
from ledger.projections.queries import IdleThresholds
from ledger.store.database import LedgerDatabase
from ledger.store.postgres import read_all
from ledger.store.tables import READ_MODELS
from ledger.translator.translate import TranslatorSettings
from ledger.types import GlobalPosition, JSONObject

VOLATILE_COLUMNS = frozenset({"row_id", "observation_id", "global_position", "recorded_at", "updated_at",
                              "event_id", "source"})
"""Columns that differ between two ledgers holding the same history (ids, receive times, digests)."""


@dataclass(slots=True)
class LedgerHandle:
    """A migrated ledger database plus the operations a test needs.

    Query methods first bring the projections up to date, then return the same JSON bodies as the
    CLI's ``--output json``.
    """

    engine: Engine
    cluster: str = "default"
    team_label: str = "team"

    @property
    def db(self) -> LedgerDatabase:
        """The same database as a :class:`LedgerDatabase` (what ``ledger.services`` takes)."""
        return LedgerDatabase(engine=self.engine)

    def replay(self, *paths: Path | str, at: datetime | None = None) -> services.IngestReport:
        """Replay recorded histories or kubectl output into this ledger (see ``services.replay_files``)."""
        return services.replay_files(self.db, [Path(p) for p in paths], cluster=self.cluster, at=at,
                                     settings=TranslatorSettings(team_label=self.team_label))

    def occupancy(self, at: datetime, *, node: str | None = None, driver: str | None = None,
                  pool: str | None = None, device_class: str | None = None) -> JSONObject:
        """Occupancy body at ``at`` with every device (all pages; filters: node, driver, pool, DeviceClass).

        Raises:
            UnknownDeviceClass: ``device_class`` is not defined at ``at``.
        """
        runner.catch_up(self.engine)
        with self.engine.connect() as conn:
            return queries.occupancy_all(conn, at=at, cluster=self.cluster, node=node, driver=driver, pool=pool,
                                         device_class=device_class)

    def usage(self, start: datetime, end: datetime, group_by: str = "team") -> JSONObject:
        """Usage body: device-hours over ``[start, end)`` per ``group_by`` and DeviceClass."""
        runner.catch_up(self.engine)
        with self.engine.connect() as conn:
            return queries.usage(conn, start=start, end=end, group_by=group_by, cluster=self.cluster)

    def claims(self, at: datetime, state: str = "all") -> JSONObject:
        """Claims body at ``at``."""
        runner.catch_up(self.engine)
        with self.engine.connect() as conn:
            return queries.claims(conn, at=at, state=state, cluster=self.cluster)

    def idle_claims(self, at: datetime, min_idle: timedelta | None = None,
                    thresholds: IdleThresholds = IdleThresholds()) -> JSONObject:
        """Idle-claims body at ``at``."""
        runner.catch_up(self.engine)
        with self.engine.connect() as conn:
            return queries.idle_claims(conn, at=at, min_idle=min_idle, thresholds=thresholds,
                                       cluster=self.cluster)

    def events(self, types: Sequence[str] | None = None) -> list[RecordedEvent]:
        """Every stored event (optionally only ``types``) in global position order."""
        with self.engine.connect() as conn:
            return read_all(conn, after=GlobalPosition(0), limit=10_000_000, types=types)

    def rows(self, table: str) -> list[tuple[object, ...]]:
        """All rows of a ledger table, ordered, without surrogate keys and receive times.

        Columns ``row_id``, ``observation_id``, ``global_position``, ``recorded_at`` and ``updated_at``
        are left out, so two ledgers fed the same history compare equal however often lines were
        re-delivered and whenever they were replayed.
        """
        with self.engine.connect() as conn:
            columns = [str(c) for c in conn.execute(text(
                "SELECT column_name FROM information_schema.columns WHERE table_name = :t "
                "AND table_schema = current_schema() ORDER BY ordinal_position"), {"t": table}).scalars()
                if c not in VOLATILE_COLUMNS]
            listed = ", ".join(f'"{c}"' for c in columns)
            order = ", ".join(f'"{c}"::text' for c in columns)
            return [tuple(r) for r in conn.execute(text(f"SELECT {listed} FROM {table} ORDER BY {order}")).all()]

    def snapshot(self) -> dict[str, list[tuple[object, ...]]]:
        """Rows (see :meth:`rows`) of ``events`` and every read model, by table name."""
        runner.catch_up(self.engine)
        return {name: self.rows(name) for name in ("events", *(t.name for t in READ_MODELS))}
