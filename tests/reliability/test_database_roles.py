"""Database rights: ``ledger_reader`` only reads ``reporting``; the ledger runs without superuser rights.

The grants of SECURITY.md are executed as written (role and database names substituted); then the write
path of the watch workers and of replay, the projections, ``rebuild``, the report jobs and the API all
run as that role, which can neither change the history (DELETE, TRUNCATE, DDL) nor migrate the schema:
``dra-ledger db upgrade`` is the only step that needs DDL rights.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from ledger import cli, services
from ledger.config import DEFAULT
from ledger.store import schema
from ledger.store.database import LedgerDatabase
from ledger.store.postgres import make_engine
from ledger.store.tables import metadata
from ledger.testing import pg
from ledger.testing.handle import LedgerHandle
from tests import factories as f
from tests.paths import HISTORIES
from tests.reliability.world import READ_PATHS, Sandwich, client

SECURITY = Path(__file__).resolve().parents[2] / "SECURITY.md"
REPORTING_VIEWS = ("device_inventory", "device_occupancy", "team_usage_hourly", "quota_usage", "idle_claims",
                   "pending_demand", "shared_devices", "claim_consumers", "occupancy_units")


def documented_grants(role: str, database: str, password: str) -> str:
    """The ``ledger_app`` SQL block of SECURITY.md, for ``role`` on ``database``."""
    block = re.search(r"-- grants: ledger_app\n(.*?)-- end grants", SECURITY.read_text(), re.S)
    assert block is not None, "SECURITY.md lost its grants block"
    sql = block.group(1).replace("ledger_app", role).replace("dra_ledger", f'"{database}"')
    return sql.replace("'change-me'", f"'{password}'")


def statements(sql: str) -> list[str]:
    lines = [x for x in sql.splitlines() if not x.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


@pytest.fixture()
def app_role(ledger_engine: Engine) -> Iterator[tuple[str, str]]:
    """(role, URL as that role) of a fresh login role holding exactly the documented grants."""
    role, password = f"ledger_app_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = str(ledger_engine.url.database)
    with ledger_engine.begin() as conn:
        for statement in statements(documented_grants(role, database, password)):
            conn.execute(text(statement))
    url = ledger_engine.url.set(username=role, password=password).render_as_string(hide_password=False)
    try:
        yield role, url
    finally:
        with ledger_engine.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": role})
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))


def test_the_ledger_runs_as_a_role_with_only_the_documented_grants(app_role: tuple[str, str], tmp_path: Path) -> None:
    _, url = app_role
    db = LedgerDatabase.from_url(url)
    try:
        with db.engine.connect() as conn:
            assert conn.execute(text("SELECT rolsuper OR rolcreatedb OR rolcreaterole FROM pg_roles "
                                     "WHERE rolname = current_user")).scalar_one() is False
        db.require_current()
        # Replay (the same write path as the watch workers), with a rejected line, then the projections.
        sandwich = Sandwich()
        path = sandwich.write(tmp_path / "h.jsonl", ["{broken"])
        report = services.replay_files(db, [path, HISTORIES / "seed-lab.jsonl"], cluster="default")
        assert len(report.rejected) == 1
        sandwich.assert_kept(LedgerHandle(engine=db.engine))
        # The watch workers' own calls: a batch with its checkpoint, and a relist after 410 Gone.
        state = services.load_state(db, "default")
        checkpoint = services.WatchCheckpoint(kind="Namespace", api_version="v1", resource_version="77")
        services.record_watch_batch(db, [], cluster="default", state=state, checkpoint=checkpoint)
        services.reconcile_relist(db, [f.namespace(sandwich.namespace, "relabelled")], cluster="default",
                                  state=state, checkpoint=checkpoint, observed_at=f.at(90), source="relist:Namespace")
        assert services.load_watch_checkpoints(db, "default")["Namespace"].resource_version == "77"
        # Rebuild (TRUNCATE of the read models) and the report jobs.
        assert services.rebuild(db) > 0
        assert services.rollup_usage(db, end=f.at(600)) > 0
        idle = services.idle_report(db, at=f.at(30), config=DEFAULT)["claims"]
        assert isinstance(idle, list)
        assert services.take_report_snapshots(db, at=f.at(30), config=DEFAULT)["idleClaims"] == len(idle)
        with client(LedgerHandle(engine=db.engine)) as api:
            for path_ in [*READ_PATHS, "/v1/events", "/readyz"]:
                assert api.get(path_).status_code == 200, path_
        # The history cannot be rewritten, and no DDL is possible.
        for forbidden in ("DELETE FROM events", "TRUNCATE events", "DELETE FROM observations",
                          "UPDATE observations SET status = 'recorded'", "DROP TABLE claims",
                          "ALTER TABLE events ADD COLUMN x int", "CREATE TABLE public.x (id int)",
                          "CREATE SCHEMA x", "CREATE ROLE x", "TRUNCATE translator_state"):
            with db.engine.connect() as conn, pytest.raises(ProgrammingError, match=r"permission denied|must be owner"):
                conn.execute(text(forbidden))
    finally:
        db.dispose()


def test_db_upgrade_needs_ddl_rights_and_says_so_in_one_line(app_role: tuple[str, str], ledger_server: str) -> None:
    role, url = app_role
    empty = f"ledger_empty_{uuid.uuid4().hex[:8]}"
    empty_url = pg.create_database(ledger_server, empty)
    engine = make_engine(empty_url)
    try:
        with engine.begin() as conn:
            conn.execute(text(f'GRANT CONNECT ON DATABASE "{empty}" TO "{role}"'))
        role_url = make_url(url).set(database=empty).render_as_string(hide_password=False)
        result = subprocess.run([sys.executable, "-c", "from ledger.cli import main; main()", "db", "upgrade"],
                                env={**os.environ, "LEDGER_DATABASE_URL": role_url}, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "permission denied" in lines[0], result.stderr
        assert lines[0].endswith("(run `dra-ledger db upgrade` as the database owner)")
        # Nothing was created.
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar_one() == 0
        schema.upgrade(engine)  # as the owner it works
        assert schema.current_revision(engine) == schema.head_revision()
    finally:
        engine.dispose()
        with make_engine(ledger_server).begin() as conn:
            conn.execute(text(f'REVOKE ALL ON DATABASE "{empty}" FROM "{role}"'))
        pg.drop_database(ledger_server, empty)


def test_ledger_reader_reads_only_the_reporting_views(ledger: LedgerHandle, tmp_path: Path) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    with ledger.engine.connect() as conn:
        attributes = conn.execute(text("SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb, rolbypassrls "
                                       "FROM pg_roles WHERE rolname = 'ledger_reader'")).one()
        assert tuple(attributes) == (False, False, False, False, False)
        tables = [t.name for t in metadata.sorted_tables]
        for table in tables:
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"):
                assert conn.execute(text("SELECT has_table_privilege('ledger_reader', :t, :p)"),
                                    {"t": f"public.{table}", "p": privilege}).scalar_one() is False, (table, privilege)
        for view in REPORTING_VIEWS:
            assert conn.execute(text("SELECT has_table_privilege('ledger_reader', :t, 'SELECT')"),
                                {"t": f"reporting.{view}"}).scalar_one() is True
    for statement, allowed in [
        *[(f"SELECT count(*) FROM reporting.{view}", True) for view in REPORTING_VIEWS],
        ("SELECT count(*) FROM public.events", False), ("SELECT count(*) FROM public.observations", False),
        ("INSERT INTO reporting.quota_usage (cluster) VALUES ('x')", False),
        ("DELETE FROM reporting.device_occupancy", False), ("UPDATE reporting.idle_claims SET team = 'x'", False),
        ("CREATE TABLE reporting.x (id int)", False), ("CREATE TABLE public.x (id int)", False),
        ("CREATE VIEW reporting.y AS SELECT 1", False), ("DROP VIEW reporting.device_occupancy", False),
        ("TRUNCATE public.events", False),
    ]:
        with ledger.engine.connect() as conn:
            conn.execute(text("SET ROLE ledger_reader"))
            if allowed:
                conn.execute(text(statement))
            else:
                with pytest.raises(ProgrammingError, match=r"permission denied|must be owner|cannot"):
                    conn.execute(text(statement))
            conn.rollback()


def test_a_reporting_reader_running_a_rebuild_is_told_it_lacks_rights_on_the_tables(ledger: LedgerHandle) -> None:
    # A Grafana login (a member of ledger_reader) that runs `dra-ledger rebuild` was told to run `db upgrade` as the
    # owner, which was never its problem: the hint must name the tables' rights, and the role that has them.
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    role, password = f"grafana_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = str(ledger.engine.url.database)
    with ledger.engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}' IN ROLE ledger_reader"))
        conn.execute(text(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"'))
    try:
        url = ledger.engine.url.set(username=role, password=password).render_as_string(hide_password=False)
        result = subprocess.run([*f.CLI, "rebuild", "--database-url", url], capture_output=True, text=True, timeout=120)
    finally:
        with ledger.engine.begin() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :r"), {"r": role})
            conn.execute(text(f'REVOKE CONNECT ON DATABASE "{database}" FROM "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: the database refused: permission denied for ") and "db upgrade` as" not in line
    assert line.endswith(f"({cli.TABLE_RIGHTS})")
