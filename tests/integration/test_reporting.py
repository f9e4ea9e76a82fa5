"""The ``reporting`` schema, role ``ledger_reader``, the Grafana dashboard, rollups and the report jobs.

A ledger holding the seed lab (plus the DeviceNetwork fixtures' shared NIC) is rolled up and
snapshotted the way the jobs do it; then every panel of the provisioned dashboard runs, with
Grafana's macros expanded as Grafana expands them, as ``ledger_reader`` and must return rows.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from ledger import services
from ledger.projections import queries, rollups
from ledger.projections.rollups import floor_hour
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from tests.factories import at, claim, gpu, history, namespace, resource_slice, uid
from tests.integration.test_quotas import SEED_CONFIG
from tests.integration.test_shared import early_namespace, real, share_of
from tests.paths import HISTORIES
from workers.jobs import JobSettings, build_scheduler, run_occupancy_counts, run_rollups, run_snapshots

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "dra-ledger.json"
FROM, TO = parse_time("2026-11-02T09:00:00Z"), parse_time("2026-11-02T12:00:00Z")
SNAPSHOTS = [parse_time(t) for t in ("2026-11-02T09:30:00Z", "2026-11-02T10:40:00Z", "2026-11-02T12:00:00Z")]
VIEWS = {"device_inventory", "device_occupancy", "team_usage_hourly", "quota_usage", "idle_claims", "pending_demand",
         "shared_devices", "claim_consumers", "occupancy_units"}


def grafana_sql(sql: str, *, start: datetime = FROM, end: datetime = TO, cluster: str = "default",
                interval: str = "5m") -> str:
    """Expand the Grafana PostgreSQL macros and the ``$cluster`` variable as Grafana does.

    As Grafana's SQL data sources (``sqleng``) do: ``$__timeFilter(c)`` is ``c BETWEEN 'from' AND 'to'`` (both
    ends included), ``$__timeFrom()`` / ``$__timeTo()`` are quoted RFC 3339 UTC times, and ``$__interval`` is the
    interval's text *unquoted* (``5m``), so a panel must quote it itself (``'$__interval'::interval``).
    """
    lo, hi = (f"'{t.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}'" for t in (start, end))
    sql = re.sub(r"\$__timeFilter\(([^)]+)\)", lambda m: f"{m.group(1)} BETWEEN {lo} AND {hi}", sql)
    sql = sql.replace("$__timeFrom()", lo).replace("$__timeTo()", hi).replace("$__interval", interval)
    return sql.replace("$cluster", f"'{cluster}'")


def dashboard() -> Any:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["rawSql"]) for p in dashboard()["panels"] for t in p["targets"]]


@pytest.fixture()
def reported(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    """Seed lab + two shares of the DeviceNetwork NIC, rolled up and snapshotted as the jobs do."""
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    macvlan = real("devicenetwork_resourceclaim_macvlan-shareid-consumedcapacity-networkdata_v1.yaml")
    second = share_of(macvlan, name="demo-macvlan-2", ns="netops", share_id="0b6a5c1e-2f5d-4d0e-9a43-5d1e1f5f0001",
                      consumed={"devicenetwork.io/maxVirtualInterfaces": "1"})
    path = history(tmp_path / "devicenetwork.jsonl", [
        ("ADDED", early_namespace("default", None), 0), ("ADDED", early_namespace("netops", "net"), 0),
        ("ADDED", real("devicenetwork_resourceslice_worker-slice1-sharedcounters-only_v1.yaml"), 1),
        ("ADDED", real("devicenetwork_resourceslice_worker-slice0-consumescounters-multialloc_v1.yaml"), 1),
        ("ADDED", macvlan, 2), ("ADDED", second, 3)])
    assert not ledger.replay(path).rejected
    assert services.rollup_usage(ledger.db, start=FROM, end=TO) == 3
    for taken in SNAPSHOTS:
        services.take_report_snapshots(ledger.db, at=taken, config=SEED_CONFIG)
    return ledger


def as_reader(conn: Connection) -> None:
    conn.execute(text("SET ROLE ledger_reader"))


@pytest.fixture()
def reader(reported: LedgerHandle) -> Iterator[Connection]:
    with reported.engine.connect() as conn:
        conn.begin()
        as_reader(conn)
        yield conn
        conn.rollback()


@pytest.mark.parametrize(("title", "sql"), panel_queries(), ids=[t for t, _ in panel_queries()])
def test_every_dashboard_panel_runs_as_ledger_reader_and_returns_rows(reader: Connection, title: str,
                                                                      sql: str) -> None:
    assert "reporting." in sql and "public." not in sql
    rows = reader.execute(text(grafana_sql(sql).replace(":", r"\:"))).all()
    assert rows, title


def test_the_dashboard_variable_lists_the_clusters(reader: Connection) -> None:
    [variable] = dashboard()["templating"]["list"]
    assert reader.execute(text(variable["query"])).scalars().all() == ["default"]


def test_dashboard_and_datasource_are_provisioned_from_the_repository() -> None:
    board = dashboard()
    assert board["uid"] == "dra-ledger" and len(board["panels"]) >= 10
    assert {p["datasource"]["uid"] for p in board["panels"]} == {"dra-ledger"}
    variables = [v["query"] for v in board["templating"]["list"]]
    read_views = {v for sql in [*variables, *(sql for _, sql in panel_queries())]
                  for v in re.findall(r"reporting\.(\w+)", sql)}
    assert read_views == VIEWS  # every view is read somewhere: by a panel or by the cluster variable
    source = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/dra-ledger.yaml").read_text())
    assert source["datasources"][0]["uid"] == "dra-ledger"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/dra-ledger.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def _refused(engine_conn: Connection, sql: str) -> None:
    with pytest.raises(DBAPIError) as caught:
        engine_conn.execute(text(sql))
    assert isinstance(caught.value.orig, psycopg.errors.InsufficientPrivilege), caught.value


@pytest.mark.parametrize("sql", [
    "SELECT * FROM public.events",
    "SELECT * FROM public.device_allocations",
    "SELECT * FROM public.usage_rollups",
    "SELECT * FROM public.observations",
    "INSERT INTO reporting.quota_usage (cluster, taken_at, team, resource_name, used, over_quota, reasons) "
    "VALUES ('x', now(), 't', 'r', 1, false, '[]')",
    "DELETE FROM reporting.device_occupancy",
    "UPDATE reporting.idle_claims SET team = 'x'",
    "CREATE TABLE reporting.mine (x int)",
    "CREATE VIEW reporting.mine AS SELECT 1",
    "CREATE TABLE public.mine (x int)",
    "TRUNCATE public.events",
])
def test_ledger_reader_cannot_write_or_read_outside_reporting(reported: LedgerHandle, sql: str) -> None:
    with reported.engine.connect() as conn:
        conn.begin()
        as_reader(conn)
        _refused(conn, sql)
        conn.rollback()


def test_ledger_reader_is_a_role_without_login_and_every_view_is_documented(reported: LedgerHandle) -> None:
    with reported.engine.connect() as conn:
        login = conn.execute(text("SELECT rolcanlogin FROM pg_roles WHERE rolname = 'ledger_reader'")).scalar_one()
        views = dict(tuple(r) for r in conn.execute(text(
            "SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'reporting' AND c.relkind = 'v'")).all())
        granted = conn.execute(text(
            "SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = 'ledger_reader' "
            "AND table_schema <> 'reporting'")).scalar_one()
    assert login is False
    assert set(views) == VIEWS and all(views.values())
    assert granted == 0


def test_the_views_answer_the_seed_lab(reader: Connection) -> None:
    quota = reader.execute(text(
        "SELECT team, used, over_quota FROM reporting.quota_usage WHERE taken_at = :t "
        "AND resource_name = 'example.com/gpu' ORDER BY team"),
        {"t": SNAPSHOTS[0]}).all()
    assert [tuple(r) for r in quota] == [("nlp", 2.0, False), ("vision", 4.0, True)]
    idle = reader.execute(text("SELECT namespace, claim, category, device_count FROM reporting.idle_claims "
                               "WHERE taken_at = :t"), {"t": SNAPSHOTS[2]}).all()
    assert [tuple(r) for r in idle] == [("ml-serve", "shared-gpu", "unreserved", 1)]
    demand = reader.execute(text("SELECT device_class, claims, requested, free, shortfall "
                                 "FROM reporting.pending_demand WHERE taken_at = :t"), {"t": SNAPSHOTS[0]}).all()
    assert [tuple(r) for r in demand] == [("gpu.example.com", 1, 4, 2, 2)]
    hours = dict(tuple(r) for r in reader.execute(text(
        "SELECT team, round(sum(device_hours)::numeric, 3) FROM reporting.team_usage_hourly "
        "WHERE driver = 'gpu.example.com' GROUP BY team")).all())
    expected = json.loads((HISTORIES / "seed-lab.expected.json").read_text())["device_hours"]["by_team"]
    assert {k: float(v) for k, v in hours.items()} == pytest.approx(expected, abs=0.01)


@pytest.mark.parametrize("group_by", ["team", "namespace", "deviceClass", "model", "node", "cluster"])
def test_rollups_plus_live_edges_equal_the_live_usage(reported: LedgerHandle, group_by: str) -> None:
    start, end = parse_time("2026-11-02T09:20:30Z"), parse_time("2026-11-02T11:45:10Z")
    rolled = services.usage_from_rollups(reported.db, start=start, end=end, group_by=group_by)
    live = reported.usage(start, end, group_by=group_by)
    assert rolled == live
    # A window inside one hour, and one whose whole hours were never rolled up, too.
    inside = (parse_time("2026-11-02T10:10:00Z"), parse_time("2026-11-02T10:50:00Z"))
    assert services.usage_from_rollups(reported.db, start=inside[0], end=inside[1], group_by=group_by) == \
        reported.usage(*inside, group_by=group_by)
    centuries = (parse_time("0001-01-01T00:00:00Z"), parse_time("2026-11-02T10:30:00Z"))  # gaps around rolled hours
    assert services.usage_from_rollups(reported.db, start=centuries[0], end=centuries[1], group_by=group_by) == \
        reported.usage(*centuries, group_by=group_by)
    later = (parse_time("2026-11-02T11:30:00Z"), parse_time("2026-11-02T14:15:00Z"))
    assert services.usage_from_rollups(reported.db, start=later[0], end=later[1], group_by=group_by) == \
        reported.usage(*later, group_by=group_by)


@pytest.mark.parametrize("step", [timedelta(minutes=7), timedelta(hours=1), timedelta(seconds=1337)])
def test_each_bucket_of_a_stepped_usage_is_the_usage_of_its_own_window(reported: LedgerHandle,
                                                                        step: timedelta) -> None:
    # Buckets are filled from the intervals that overlap them (shared GPU and NIC included, split as usage splits);
    # each must equal the usage asked for its window alone, the last, shorter bucket too.
    start, end = parse_time("2026-11-02T08:50:00Z"), parse_time("2026-11-02T12:10:30Z")
    with reported.engine.connect() as conn:
        stepped = queries.usage(conn, start=start, end=end, group_by="team", step=step)
        rows = stepped["rows"]
        assert isinstance(rows, list)
        windows = sorted({(r["start"], r["end"]) for r in rows if isinstance(r, dict)})
        assert len(windows) > 3
        assert {w for w in windows if w[1] == "2026-11-02T12:10:30Z"}  # the last bucket, cut at `end`
        for lo, hi in windows:
            alone = queries.usage(conn, start=parse_time(str(lo)), end=parse_time(str(hi)), group_by="team")["rows"]
            assert isinstance(alone, list)
            mine = [{k: v for k, v in r.items() if k not in ("start", "end")}
                    for r in rows if isinstance(r, dict) and (r["start"], r["end"]) == (lo, hi)]
            assert mine == alone, (lo, hi)
    shared = [r for r in rows if isinstance(r, dict) and r["driver"] != "gpu.example.com"]
    assert shared  # the NIC's shares are in it


def rolled_hours(ledger: LedgerHandle) -> dict[str, list[datetime]]:
    """The distinct hours held by each rollup table, in order."""
    with ledger.engine.connect() as conn:
        return {table: list(conn.execute(text(f"SELECT DISTINCT hour FROM {table} ORDER BY hour")).scalars())
                for table in rollups.ROLLUP_TABLES}


def by_group(body: Any, group_by: str = "team") -> dict[tuple[str, str], float]:
    """(group value, deviceClass) -> device-hours of a usage body."""
    return {(r[group_by], r["deviceClass"]): r["deviceHours"] for r in body["rows"]}


@pytest.mark.parametrize(("window", "expected"), [
    # [09:30, 11:30): a rolled hour between two partial ones. ml-train (team vision) holds gpu-0 until
    # 10:00:01 (train-0 released) and gpu-2, gpu-3 and gpu-7 throughout; ml-serve (nlp) holds gpu-1 and
    # gpu-4. The NIC's two shares (allocated 2026-08-26, still held) overlap, and each states its consumedCapacity:
    # 1 of the NIC's 65535 maxVirtualInterfaces, so each is billed 1/65535 of the 2 h (the rest is nobody's).
    (("2026-11-02T09:30:00Z", "2026-11-02T11:30:00Z"),
     {("vision", "gpu.example.com"): round(0.5 + 1 / 3600 + 3 * 2, 6), ("nlp", "gpu.example.com"): 2 * 2.0,
      ("default", "devicenetwork"): round(2 / 65535, 6), ("net", "devicenetwork"): round(2 / 65535, 6)}),
    # [11:15, 11:45): inside one hour, all live: 3 and 2 GPUs for half an hour, each NIC share 1/65535 of it.
    (("2026-11-02T11:15:00Z", "2026-11-02T11:45:00Z"),
     {("vision", "gpu.example.com"): 1.5, ("nlp", "gpu.example.com"): 1.0,
      ("default", "devicenetwork"): round(0.5 / 65535, 6), ("net", "devicenetwork"): round(0.5 / 65535, 6)}),
])
def test_edge_hours_bill_lone_holders_whole_and_split_a_shared_device(reported: LedgerHandle,
                                                                       window: tuple[str, str],
                                                                       expected: dict[tuple[str, str], float]) -> None:
    start, end = parse_time(window[0]), parse_time(window[1])
    assert by_group(services.usage(reported.db, start=start, end=end, group_by="team")) == expected
    assert by_group(reported.usage(start, end, group_by="team")) == expected


@pytest.fixture()
def two_nodes(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    """One GPU per node; gpu-0 (node-a) is held alone, then by two allocations at once. Rolled 09:00-12:00.

    Minutes after 09:00: claim a (team alpha) holds gpu-0 over [35, 45); b (beta) [50, 100) and c (gamma)
    [55, 70) hold it together (a double booking: both are billed, each second split between them);
    d (alpha) holds gpu-1 on node-b over [20, 140). Every claim is deleted, so nothing runs until now().
    """
    ids = {name: uid("claim") for name in "abcd"}

    def held(name: str, ns: str, device: str, node: str, start: float, end: float) -> list[tuple[str, Any, float]]:
        obj = claim(name=name, namespace=ns, claim_uid=ids[name], results=[device], allocated_at=start, pool=node)
        return [("ADDED", obj, start), ("DELETED", obj, end)]

    lines = [("ADDED", namespace(ns, team), 0.0) for ns, team in (("ns-a", "alpha"), ("ns-b", "beta"),
                                                                  ("ns-c", "gamma"))]
    lines += [("ADDED", resource_slice(name=f"{node}-gpus", pool=node, node=node, devices=[gpu(device)]), 0.0)
              for node, device in (("node-a", "gpu-0"), ("node-b", "gpu-1"))]
    events = [*held("a", "ns-a", "gpu-0", "node-a", 35, 45), *held("b", "ns-b", "gpu-0", "node-a", 50, 100),
              *held("c", "ns-c", "gpu-0", "node-a", 55, 70), *held("d", "ns-a", "gpu-1", "node-b", 20, 140)]
    lines += sorted(events, key=lambda line: line[2])
    assert not ledger.replay(history(tmp_path / "two-nodes.jsonl", lines)).rejected
    assert services.rollup_usage(ledger.db, start=at(0), end=at(180)) == 3
    return ledger


# [09:30, 11:30) by hand, in minutes. Start edge [09:30, 10:00): a 10 alone; b 5 alone, then b and c
# share 5 (2.5 each); d 30. Rolled hour 10:00: b and c share 10 (5 each), b 30 alone; d 60. End edge
# [11:00, 11:30): d 20.
TWO_NODES_WINDOW = (at(30), at(150))
TWO_NODES_BY_TEAM = {("alpha", "gpu.example.com"): round((10 + 30 + 60 + 20) / 60, 6),
                     ("beta", "gpu.example.com"): round((5 + 2.5 + 5 + 30) / 60, 6),
                     ("gamma", "gpu.example.com"): round((2.5 + 5) / 60, 6)}
TWO_NODES_BY_NODE = {("node-a", "gpu.example.com"): 1.0, ("node-b", "gpu.example.com"): round(110 / 60, 6)}


def test_one_device_with_lone_and_overlapping_allocations_in_the_edge_hours(two_nodes: LedgerHandle) -> None:
    for group_by, expected in (("team", TWO_NODES_BY_TEAM), ("node", TWO_NODES_BY_NODE)):
        assert by_group(services.usage(two_nodes.db, start=TWO_NODES_WINDOW[0], end=TWO_NODES_WINDOW[1],
                                       group_by=group_by), group_by) == expected
        assert by_group(two_nodes.usage(*TWO_NODES_WINDOW, group_by=group_by), group_by) == expected


def test_the_rollup_by_team_is_the_rollup_by_node_summed_over_nodes(two_nodes: LedgerHandle) -> None:
    with two_nodes.engine.connect() as conn:
        fine = {(r.team, r.node): r.device_seconds for r in conn.execute(text(
            "SELECT team, node, device_seconds FROM usage_rollups WHERE hour = :h"), {"h": at(0)})}
        coarse = {r.team: r.device_seconds for r in conn.execute(text(
            "SELECT team, device_seconds FROM usage_rollups_by_team WHERE hour = :h"), {"h": at(0)})}
    # 09:00-10:00 by hand, in seconds: a 10 min and d 40 min (alpha, two nodes); b 5 + 2.5 min; c 2.5 min.
    assert fine == {("alpha", "node-a"): 600, ("alpha", "node-b"): 2400, ("beta", "node-a"): 450,
                    ("gamma", "node-a"): 150}
    assert coarse == {"alpha": 3000, "beta": 450, "gamma": 150}


@pytest.mark.parametrize(("table", "changed"), [("usage_rollups_by_team", "team"), ("usage_rollups", "node")])
def test_usage_by_node_reads_the_rollup_with_nodes_and_other_groupings_the_one_without(
        two_nodes: LedgerHandle, table: str, changed: str) -> None:
    with two_nodes.engine.connect() as conn:
        # One more device-hour in the rolled hour 10:00 of one table only (rolled back below): only the
        # groupings that read that table see it.
        assert conn.execute(text(f"UPDATE {table} SET device_seconds = device_seconds + 3600 "
                                 "WHERE hour = :h AND team = 'beta'"), {"h": at(60)}).rowcount == 1
        try:
            for group_by, expected in (("team", TWO_NODES_BY_TEAM), ("node", TWO_NODES_BY_NODE)):
                body = rollups.usage_from_rollups(conn, start=TWO_NODES_WINDOW[0], end=TWO_NODES_WINDOW[1],
                                                  group_by=group_by, cluster=two_nodes.cluster)
                if group_by == changed:
                    key = ("beta" if group_by == "team" else "node-a", "gpu.example.com")
                    expected = {**expected, key: round(expected[key] + 1, 6)}
                assert by_group(body, group_by) == expected
        finally:
            conn.rollback()


def test_a_rebuild_forgets_every_rolled_hour_of_both_rollups(two_nodes: LedgerHandle) -> None:
    assert rolled_hours(two_nodes) == {table: [at(0), at(60), at(120)] for table in rollups.ROLLUP_TABLES}
    assert services.rebuild(two_nodes.db) > 0
    assert rolled_hours(two_nodes) == {table: [] for table in rollups.ROLLUP_TABLES}
    assert by_group(services.usage(two_nodes.db, start=TWO_NODES_WINDOW[0], end=TWO_NODES_WINDOW[1],
                                   group_by="team")) == TWO_NODES_BY_TEAM


def test_rolling_up_again_replaces_the_hours(reported: LedgerHandle) -> None:
    with reported.engine.connect() as conn:
        before = conn.execute(text("SELECT count(*), sum(device_seconds) FROM usage_rollups")).one()
    assert services.rollup_usage(reported.db, end=TO) == 1  # from the last rolled hour: 11:00 again
    assert services.rollup_usage(reported.db, start=FROM, end=TO) == 3
    with reported.engine.connect() as conn:
        after = conn.execute(text("SELECT count(*), sum(device_seconds) FROM usage_rollups")).one()
    assert tuple(after) == tuple(before)


def test_the_jobs_roll_up_and_snapshot_on_their_schedule(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    now = parse_time("2026-11-02T12:07:00Z")
    scheduler = build_scheduler(ledger.db, config=SEED_CONFIG, settings=JobSettings(snapshot_interval_s=600),
                                clock=lambda: now)
    jobs = {job.id: job for job in scheduler.get_jobs()}
    assert set(jobs) == {"usage-rollups", "report-snapshots", "occupancy-counts"}
    for job in jobs.values():
        assert (job.max_instances, job.coalesce) == (1, True)
    hours = asyncio.run(run_rollups(ledger.db, clock=lambda: now))
    assert hours == (floor_hour(now) - parse_time("2026-11-02T09:00:00Z")) // timedelta(hours=1)
    counts = asyncio.run(run_snapshots(ledger.db, config=SEED_CONFIG, clock=lambda: now))
    assert counts == {"idleClaims": 1, "quotaRows": 2, "pendingClasses": 1}
    again = asyncio.run(run_snapshots(ledger.db, config=SEED_CONFIG, clock=lambda: now))
    assert again == counts  # the same instant is replaced, not added
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM idle_claim_snapshots")).scalar_one() == 1
    written = asyncio.run(run_occupancy_counts(ledger.db))
    with ledger.engine.connect() as conn:
        stored = conn.execute(text("SELECT count(*) FROM occupancy_counts")).scalar_one()
    assert written == {"default": stored} and stored > 1
    assert asyncio.run(run_occupancy_counts(ledger.db)) == {}  # covered: nothing to do until events arrive


def test_the_scheduler_runs_inside_an_event_loop(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")

    async def main() -> None:
        scheduler = build_scheduler(ledger.db, config=SEED_CONFIG, settings=JobSettings(snapshot_interval_s=10),
                                    clock=lambda: parse_time("2026-11-02T12:00:00Z"))
        scheduler.start()
        try:
            for job in scheduler.get_jobs():
                job.modify(next_run_time=datetime.now(tz=scheduler.timezone))
            for _ in range(100):
                await asyncio.sleep(0.05)
                with ledger.engine.connect() as conn:
                    if conn.execute(text("SELECT count(*) FROM quota_usage_snapshots")).scalar_one() and \
                            conn.execute(text("SELECT count(*) FROM usage_rollups")).scalar_one():
                        return
            raise AssertionError("the jobs did not run")
        finally:
            scheduler.shutdown(wait=False)

    asyncio.run(main())


def test_a_late_event_in_rolled_hours_forgets_them_and_usage_stays_the_live_answer(reported: LedgerHandle,
                                                                                     tmp_path: Path) -> None:
    # pick-seven holds its GPU from 09:05 on; a DELETED of it recorded late, observed at 10:15, releases it
    # inside the rolled hours 10:00 and 11:00.
    line = (HISTORIES / "seed-lab.jsonl").read_text().splitlines()[11]  # line 12: pick-seven allocated
    late = json.loads(line)
    late.update(type="DELETED", observedAt="2026-11-02T10:15:00Z")
    path = tmp_path / "late.jsonl"
    path.write_text(json.dumps(late) + "\n")
    before: Any = services.usage(reported.db, start=FROM, end=TO, group_by="team")

    assert reported.replay(path).events > 0
    hours = rolled_hours(reported)
    after: Any = services.usage(reported.db, start=FROM, end=TO, group_by="team")
    live = reported.usage(FROM, TO, group_by="team")

    # 10:00 and 11:00 were forgotten from both rollups, 09:00 is untouched in both
    assert hours == {"usage_rollups": [FROM], "usage_rollups_by_team": [FROM]}
    assert after == live
    ml_train = {r["team"]: r["deviceHours"] for r in before["rows"] if r["driver"] == "gpu.example.com"}
    ml_after = {r["team"]: r["deviceHours"] for r in after["rows"] if r["driver"] == "gpu.example.com"}
    team = next(t for t in ml_train if ml_train[t] != ml_after.get(t))
    # One GPU released 1 h 45 min before the window's end: exactly that many device-hours fewer.
    assert ml_train[team] - ml_after[team] == pytest.approx(1.75, abs=1e-6)


def test_a_late_event_in_one_cluster_keeps_usage_over_all_clusters_the_live_answer(ledger: LedgerHandle,
                                                                                    tmp_path: Path) -> None:
    # The seed lab in two clusters, rolled up; pick-seven's late DELETED (10:15) arrives in "default" only.
    other = LedgerHandle(engine=ledger.engine, cluster="other")
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    other.replay(HISTORIES / "seed-lab.jsonl")
    assert services.rollup_usage(ledger.db, start=FROM, end=TO) == 3
    late = json.loads((HISTORIES / "seed-lab.jsonl").read_text().splitlines()[11])
    late.update(type="DELETED", observedAt="2026-11-02T10:15:00Z")
    (tmp_path / "late.jsonl").write_text(json.dumps(late) + "\n")
    before: Any = services.usage(ledger.db, start=FROM, end=TO, group_by="team")

    assert ledger.replay(tmp_path / "late.jsonl").events > 0
    after: Any = services.usage(ledger.db, start=FROM, end=TO, group_by="team")
    with ledger.engine.connect() as conn:
        live: Any = queries.usage(conn, start=FROM, end=TO, group_by="team", cluster=None)

    assert after == live  # over all clusters, "default"'s forgotten hours are not read from "other"'s rows
    gpu = {r["team"]: r["deviceHours"] for r in before["rows"] if r["driver"] == "gpu.example.com"}
    gpu_after = {r["team"]: r["deviceHours"] for r in after["rows"] if r["driver"] == "gpu.example.com"}
    team = next(t for t in gpu if gpu[t] != gpu_after.get(t))
    assert gpu[team] - gpu_after[team] == pytest.approx(1.75, abs=1e-6)  # one GPU, 1 h 45 min, one cluster
    # The next run rolls the forgotten hours up again for both clusters, with the same answer.
    assert services.rollup_usage(ledger.db, end=TO) == 3
    assert services.usage(ledger.db, start=FROM, end=TO, group_by="team") == live


def test_usage_never_bills_hours_that_have_not_happened(reported: LedgerHandle) -> None:
    # shared-gpu and other claims are still held at the end of the seed lab: open intervals.
    future = (parse_time("2030-01-01T00:00:00Z"), parse_time("2030-01-02T00:00:00Z"))
    assert services.usage(reported.db, start=future[0], end=future[1], group_by="team")["rows"] == []
    assert reported.usage(*future, group_by="team")["rows"] == []
    # A window reaching into the future bills the same as one ending now: only the hours that happened.
    start = parse_time("2026-11-02T09:00:00Z")
    far: Any = services.usage(reported.db, start=start, end=future[1], group_by="team")
    held = {r["team"]: r["deviceHours"] for r in far["rows"]}
    assert held and all(hours > 0 for hours in held.values())
    elapsed_h = (datetime.now(UTC) - start).total_seconds() / 3600
    assert max(held.values()) <= 8 * elapsed_h  # 8 GPUs at most, for the hours elapsed
