"""Rows of the claim reports name their cluster, so a report over every cluster tells same-named claims apart; quota
rows and pending demand are counted per cluster, never added up across clusters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from ledger import services
from ledger.cli import app
from ledger.config import DEFAULT, LedgerConfig
from ledger.projections import quotas as quota_counting
from ledger.recorded import parse_time
from ledger.testing.handle import LedgerHandle
from tests.paths import HISTORIES

EXPECTED: Any = json.loads((HISTORIES / "seed-lab.expected.json").read_text(encoding="utf-8"))
WIDE = {"COLUMNS": "250"}  # one table row per line


def _seed_lab_twice(ledger: LedgerHandle) -> LedgerHandle:
    other = LedgerHandle(engine=ledger.engine, cluster=f"{ledger.cluster}-b")
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    other.replay(HISTORIES / "seed-lab.jsonl")
    return other


def test_idle_claims_over_every_cluster_carry_each_rows_cluster(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)
    [check] = [c for c in EXPECTED["checks"] if c.get("idle_claims")]
    names = set(check["idle_claims"])  # "namespace/name" of each claim the fixture expects idle

    rows = services.idle_report(ledger.db, at=parse_time(check["at"]), config=DEFAULT)["claims"]

    assert isinstance(rows, list)
    found = sorted((r["cluster"], f"{r['namespace']}/{r['name']}") for r in rows if isinstance(r, dict))
    assert found == sorted((c, n) for c in (ledger.cluster, other.cluster) for n in names)
    one = services.idle_report(ledger.db, at=parse_time(check["at"]), config=DEFAULT, cluster=other.cluster)
    assert {r["cluster"] for r in one["claims"] if isinstance(r, dict)} == {other.cluster}  # type: ignore[union-attr]


def test_the_idle_claim_csv_starts_with_the_cluster(ledger: LedgerHandle) -> None:
    _seed_lab_twice(ledger)
    [check] = [c for c in EXPECTED["checks"] if c.get("idle_claims")]

    text = services.idle_report_csv(services.idle_report(ledger.db, at=parse_time(check["at"]), config=DEFAULT))

    header, *rows = [line.split(",") for line in text.splitlines()]
    assert header[:3] == ["cluster", "namespace", "name"]
    assert sorted(row[0] for row in rows) == sorted([ledger.cluster, f"{ledger.cluster}-b"] * len(check["idle_claims"]))


def test_pending_claims_over_every_cluster_carry_each_rows_cluster(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)

    # The seed lab's claim for 4 GPUs (ml-train/big) is pending from its creation on (README, "What the demo shows").
    body: Any = services.pending(ledger.db, at=parse_time("2026-11-02T09:30:00Z"))

    # Listed by cluster first, as its classes are (the other cluster's name is this one's with "-b" added).
    assert [(r["cluster"], r["namespace"], r["name"]) for r in body["claims"]] == [
        (ledger.cluster, "ml-train", "big"), (other.cluster, "ml-train", "big")]


def test_pending_demand_over_every_cluster_counts_each_clusters_free_devices_apart(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)
    [check] = [c for c in EXPECTED["checks"] if c["at"] == "2026-11-02T09:30:00Z"]
    # Per cluster: ml-train/big asks for 4 and 2 devices are free. One entry for both clusters said 8 requested
    # against 4 free, though no claim can take a device of the other cluster.
    entry = {"deviceClass": "gpu.example.com", "claims": 1, "requested": check["pending_claims"]["ml-train/big"],
             "free": check["devices_free"]}

    body: Any = services.pending(ledger.db, at=parse_time(check["at"]))

    assert body["classes"] == [{"cluster": ledger.cluster, **entry}, {"cluster": other.cluster, **entry}]
    one: Any = services.pending(ledger.db, at=parse_time(check["at"]), cluster=other.cluster)
    assert one["classes"] == [{"cluster": other.cluster, **entry}]


QUOTAS = LedgerConfig.model_validate({
    "deviceClassMappings": [{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]}],
    "quotas": [{"team": "vision", "resourceName": "example.com/gpu", "nominalQuota": 3},
               {"team": "audio", "resourceName": "example.com/gpu", "nominalQuota": 5},
               {"cluster": "OTHER", "team": "vision", "resourceName": "example.com/gpu", "nominalQuota": 8},
               {"cluster": "OTHER", "team": "speech", "resourceName": "example.com/gpu", "nominalQuota": 2}]})


def _quotas_for(other: LedgerHandle) -> LedgerConfig:
    """:data:`QUOTAS` with ``OTHER`` naming ``other``'s cluster."""
    data = QUOTAS.model_dump(by_alias=True)
    for quota in data["quotas"]:
        if quota["cluster"] == "OTHER":
            quota["cluster"] = other.cluster
    return LedgerConfig.model_validate(data)


def test_quotas_over_every_cluster_count_each_cluster_against_its_own_quota(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)
    config = _quotas_for(other)
    [check] = [c for c in EXPECTED["checks"] if c["at"] == "2026-11-02T09:30:00Z"]
    vision, nlp = check["team_devices"]["vision"], check["team_devices"]["nlp"]  # 4 and 2: one device a request

    body: Any = services.quotas(ledger.db, at=parse_time(check["at"]), config=config)

    rows = [(r["cluster"], r["team"], r["used"], r["nominalQuota"], r["overQuota"]) for r in body["rows"]]
    # Each cluster holds 4 of vision's devices: over the quota of 3 that applies everywhere, under the 8 that
    # the other cluster has instead. audio's quota applies in both clusters, speech's only in the other; neither
    # team holds a device. Summed over the clusters, vision's 8 devices were compared with one quota of 3.
    assert rows == [(ledger.cluster, "audio", 0, 5, False), (ledger.cluster, "nlp", nlp, None, False),
                    (ledger.cluster, "vision", vision, 3, True),
                    (other.cluster, "audio", 0, 5, False), (other.cluster, "nlp", nlp, None, False),
                    (other.cluster, "speech", 0, 2, False), (other.cluster, "vision", vision, 8, False)]
    mine = [r for r in body["rows"] if r["cluster"] == ledger.cluster]
    assert services.quotas(ledger.db, at=parse_time(check["at"]), config=config, cluster=ledger.cluster)["rows"] \
        == mine
    # A cluster the ledger holds nothing of (a misspelt name) has no rows, not every quota unused.
    assert services.quotas(ledger.db, at=parse_time(check["at"]), config=config, cluster="ghost")["rows"] == []


def test_quota_history_over_every_cluster_keeps_each_clusters_intervals_apart(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)
    config = _quotas_for(other)
    start, end = parse_time("2026-11-02T09:00:00Z"), parse_time("2026-11-02T12:00:00Z")

    every: Any = services.quota_history(ledger.db, start=start, end=end, config=config)
    mine: Any = services.quota_history(ledger.db, start=start, end=end, config=config, cluster=ledger.cluster)
    theirs: Any = services.quota_history(ledger.db, start=start, end=end, config=config, cluster=other.cluster)

    assert every["intervals"] == mine["intervals"] + theirs["intervals"]
    assert {i["cluster"] for i in mine["intervals"]} == {ledger.cluster}
    # The same history, so vision's usage runs alike in both clusters; only this cluster's quota of 3 is exceeded
    # (09:15 to 10:00:01, when train-0 ends: see test_report_cli).
    def vision(body: Any) -> list[tuple[str, str, Any]]:
        return [(i["from"], i["to"], i["used"]) for i in body["intervals"] if i["team"] == "vision"]
    assert vision(mine) == vision(theirs)
    assert [(i["from"], i["to"]) for i in every["intervals"] if i["overQuota"]] == \
        [("2026-11-02T09:15:00Z", "2026-11-02T10:00:01Z")]
    assert {i["cluster"] for i in every["intervals"] if i["overQuota"]} == {ledger.cluster}
    with ledger.engine.connect() as conn:
        assert quota_counting.quota_history_at_each_edge(conn, start=start, end=end, config=config) == every


def test_quota_snapshots_store_each_clusters_own_nominal_quota(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)

    services.take_report_snapshots(ledger.db, at=parse_time("2026-11-02T09:30:00Z"), config=_quotas_for(other))

    with ledger.engine.connect() as conn:
        stored = conn.execute(text(
            "SELECT cluster, nominal_quota, over_quota FROM reporting.quota_usage WHERE team = 'vision' "
            "ORDER BY cluster")).all()
    assert [tuple(r) for r in stored] == [(ledger.cluster, 3, True), (other.cluster, 8, False)]


@pytest.mark.parametrize("command", [["quotas", "--at", "2026-11-02T09:30:00Z"],
                                     ["quotas", "--from", "2026-11-02T09:00:00Z", "--to", "2026-11-02T12:00:00Z"],
                                     ["pending", "--at", "2026-11-02T09:30:00Z"]])
def test_the_quota_and_pending_tables_over_every_cluster_name_each_rows_cluster(
        ledger: LedgerHandle, tmp_path: Path, command: list[str]) -> None:
    _seed_lab_twice(ledger)
    config = tmp_path / "ledger.toml"
    config.write_text('[[deviceClassMappings]]\nname = "example.com/gpu"\ndeviceClassNames = ["gpu.example.com"]\n'
                      '[[quotas]]\nteam = "vision"\nresourceName = "example.com/gpu"\nnominalQuota = 3\n')
    args = [*command, "--config", str(config), "--database-url", ledger.db.url]

    every = CliRunner().invoke(app, args, env=WIDE)
    mine = CliRunner().invoke(app, [*args, "--cluster", ledger.cluster], env=WIDE)

    assert every.exit_code == mine.exit_code == 0, every.output + mine.output
    assert "cluster" not in mine.output
    assert len(_table_rows(mine.output)) > 1
    assert "┃ cluster " in every.output
    # Each cluster recorded the same history: every row of one cluster's table appears for each cluster.
    other = f"{ledger.cluster}-b"
    assert sorted(_table_rows(every.output)) == sorted(
        [[c, *r] for c in (ledger.cluster, other) for r in _table_rows(mine.output)])


def _table_rows(output: str) -> list[list[str]]:
    """The cells of each body row of the Rich tables in ``output`` (header rows are drawn with ``┃``)."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in output.splitlines() if line.startswith("│")]


@pytest.mark.parametrize("command", [["idle-claims"], ["report", "idle-claims"]])
def test_the_idle_claim_table_over_every_cluster_names_each_rows_cluster(ledger: LedgerHandle,
                                                                         command: list[str]) -> None:
    other = _seed_lab_twice(ledger)
    # The seed lab's one idle claim at 12:00: ml-serve/shared-gpu of team nlp, holding gpu-1, its reservedFor
    # emptied by the line observed at 11:00:01 (seed-lab.jsonl line 38) -> 1 device x 3599 s = 0.99972 h.
    row = ["ml-serve/shared-gpu", "nlp", "unreserved", "2026-11-02T11:00:01Z", "gpu.example.com/lab-node/gpu-1",
           "1.000"]
    args = [*command, "--at", "2026-11-02T12:00:00Z", "--database-url", ledger.db.url]

    every = CliRunner().invoke(app, args, env=WIDE)
    one = CliRunner().invoke(app, [*args, "--cluster", other.cluster], env=WIDE)

    assert every.exit_code == 0, every.output
    assert "┃ cluster " in every.output
    # Same-named claims come in cluster order (the name of the other cluster is this one's with "-b" added).
    assert _table_rows(every.output) == [[ledger.cluster, *row], [other.cluster, *row]]
    # One cluster's rows cannot be confused: the table keeps its columns of before.
    assert one.exit_code == 0, one.output
    assert "cluster" not in one.output
    assert _table_rows(one.output) == [row]


@pytest.mark.parametrize("command", [["occupancy"], ["claims"]])
def test_the_occupancy_and_claim_tables_over_every_cluster_name_each_rows_cluster(ledger: LedgerHandle,
                                                                                  command: list[str]) -> None:
    other = _seed_lab_twice(ledger)
    args = [*command, "--at", "2026-11-02T09:30:00Z", "--database-url", ledger.db.url]

    every = CliRunner().invoke(app, args, env=WIDE)
    mine = CliRunner().invoke(app, [*args, "--cluster", ledger.cluster], env=WIDE)
    theirs = CliRunner().invoke(app, [*args, "--cluster", other.cluster], env=WIDE)

    assert every.exit_code == mine.exit_code == theirs.exit_code == 0, every.output + mine.output + theirs.output
    # Both clusters recorded the same history, so each cluster's own table is the same, without a cluster column.
    assert _table_rows(mine.output) == _table_rows(theirs.output)
    assert "cluster" not in mine.output
    assert len(_table_rows(mine.output)) > 1
    # Over every cluster, each of those rows appears once per cluster, led by its cluster's name.
    assert "┃ cluster " in every.output
    assert sorted(_table_rows(every.output)) == sorted(
        [[ledger.cluster, *r] for r in _table_rows(mine.output)]
        + [[other.cluster, *r] for r in _table_rows(theirs.output)])


def test_the_usage_table_grouped_by_cluster_has_a_row_per_cluster(ledger: LedgerHandle) -> None:
    other = _seed_lab_twice(ledger)
    hours = EXPECTED["device_hours"]
    args = ["usage", "--from", hours["from"], "--to", hours["to"], "--database-url", ledger.db.url]

    by_cluster = CliRunner().invoke(app, [*args, "--group-by", "cluster", "-o", "json"], env=WIDE)
    by_team = CliRunner().invoke(app, [*args, "-o", "json"], env=WIDE)

    assert by_cluster.exit_code == 0, by_cluster.output
    per_cluster: dict[str, float] = {}
    for row in json.loads(by_cluster.stdout)["rows"]:
        per_cluster[row["cluster"]] = per_cluster.get(row["cluster"], 0.0) + row["deviceHours"]
    # Each cluster replayed the seed lab: its device-hours are the fixture's (vision 9.382 + nlp 5.5), once each.
    assert sorted(per_cluster) == [ledger.cluster, other.cluster]
    for total in per_cluster.values():
        assert total == pytest.approx(sum(hours["by_team"].values()), abs=hours["tolerance_hours"])
    # Grouped by team the clusters add up: nlp's row is both clusters' hours.
    nlp = [r["deviceHours"] for r in json.loads(by_team.stdout)["rows"] if r["team"] == "nlp"]
    assert sum(nlp) == pytest.approx(2 * hours["by_team"]["nlp"], abs=2 * hours["tolerance_hours"])
    table = CliRunner().invoke(app, [*args, "--group-by", "cluster"], env=WIDE)
    assert {r[0] for r in _table_rows(table.output)} == {ledger.cluster, other.cluster}
