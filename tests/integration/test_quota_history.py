"""Quota history over a window: the sweep must answer exactly as ``quotas()`` at every allocation edge.

``quota_history_at_each_edge`` (the plain definition, several statements per edge) is the oracle;
``quota_history`` sweeps the edges once, counting again only the claims whose rows change at an edge,
and every claim where the catalog (DeviceClasses, devices) changed since the previous edge.
"""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from ledger import services
from ledger.config import LedgerConfig
from ledger.projections import quotas as quota_counting
from ledger.quantities import parse_quantity
from ledger.recorded import parse_time
from ledger.simulate import FleetSpec, write_history
from ledger.testing.handle import LedgerHandle
from ledger.types import JSONObject
from tests.factories import at, rv, stamp
from tests.integration.test_quotas import DRIVER, SEED_CONFIG, Lab, config, device_class, exactly, lab, lab_slice, req
from tests.paths import HISTORIES
from tests.statements import statements_run

SEED_FROM, SEED_TO = parse_time("2026-11-02T08:00:00Z"), parse_time("2026-11-02T13:00:00Z")
"""A window holding the whole seed lab (its lines run from 09:00:01 to 12:00)."""

FLEET = FleetSpec(nodes=8, gpus_per_node=8, hours=4, seed=11, mig_node_fraction=0.25, restarts_per_node_day=6.0,
                  relabels=1, idle_fraction=0.1, pending_fraction=0.05)
"""Small enough for the oracle (a few hundred edges), with MIG partitions, NIC shares, shared and
extended-resource claims, a relabel and driver restarts that republish pools under allocated claims."""

FLEET_CONFIGS = {
    "counts": config([{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]},
                      {"name": "example.com/mig", "deviceClassNames": ["mig.gpu.example.com"]}],
                     [{"team": "team-00", "resourceName": "example.com/gpu", "nominalQuota": 4},
                      {"team": "team-01", "resourceName": "example.com/mig", "nominalQuota": 2}]),
    "sources": config([{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]},
                       {"name": "example.com/gpu-memory", "deviceClassNames": ["mig.gpu.example.com"],
                        "sources": [{"counter": "memory"}]},
                       {"name": "example.com/bandwidth", "deviceClassNames": ["nic.example.com"],
                        "sources": [{"capacity": "bandwidth"}]}],
                      [{"team": "team-02", "resourceName": "example.com/gpu-memory", "nominalQuota": "40Gi"}]),
    "unmapped": config([]),
    "overrides": LedgerConfig.model_validate({
        "teams": {"overrides": {"team-00-ns0": "platform", "team-01-ns1": "platform"}},
        "deviceClassMappings": [{"name": "example.com/gpu", "deviceClassNames": ["gpu.example.com"]}],
        "quotas": [{"team": "platform", "resourceName": "example.com/gpu", "nominalQuota": 3}]}),
}


def both(ledger: LedgerHandle, cfg: LedgerConfig, start: datetime, end: datetime) -> tuple[JSONObject, JSONObject]:
    """(the sweep, the oracle) over ``[start, end)``."""
    with ledger.engine.connect() as conn:
        swept = quota_counting.quota_history(conn, start=start, end=end, config=cfg, cluster=ledger.cluster)
        oracle = quota_counting.quota_history_at_each_edge(conn, start=start, end=end, config=cfg,
                                                           cluster=ledger.cluster)
    return swept, oracle


def edges(ledger: LedgerHandle, start: datetime, end: datetime) -> int:
    """Allocation edges strictly inside ``(start, end)``: the instants the oracle runs ``quotas()`` at, less one."""
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(DISTINCT t) FROM device_allocations a, "
            "LATERAL (VALUES (lower(a.valid)), (upper(a.valid))) AS b(t) "
            "WHERE a.valid && tstzrange(:s, :e, '[)') AND t > :s AND t < :e"), {"s": start, "e": end}).scalar_one())


def catalog_instants(ledger: LedgerHandle, start: datetime, end: datetime) -> int:
    """Distinct bounds of DeviceClass and device intervals in ``[start, end)``."""
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(DISTINCT t) FROM (SELECT valid FROM device_classes UNION ALL "
            "SELECT valid FROM device_inventory) x, LATERAL (VALUES (lower(x.valid)), (upper(x.valid))) AS b(t) "
            "WHERE t >= :s AND t < :e"), {"s": start, "e": end}).scalar_one())


def values_at(body: Any, team: str, when: datetime) -> dict[str, Any]:
    """resource name -> used in the interval of ``team`` holding ``when``."""
    return {i["resourceName"]: i["used"] for i in body["intervals"]
            if i["team"] == team and parse_time(i["from"]) <= when < parse_time(i["to"])}


# --- the seed lab --------------------------------------------------------------------------------

SEED_CONFIGS = {
    "seed": SEED_CONFIG,
    "unmapped": config([]),
    "overrides": LedgerConfig.model_validate({"teams": {"overrides": {"ml-serve": "platform"}},
                                              "deviceClassMappings": [{"name": "example.com/gpu",
                                                                       "deviceClassNames": ["gpu.example.com"]}]}),
}


@pytest.mark.parametrize("name", sorted(SEED_CONFIGS))
def test_the_sweep_answers_as_quotas_at_every_edge_on_the_seed_lab(ledger: LedgerHandle, name: str) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    cfg = SEED_CONFIGS[name]
    for start, end in [(SEED_FROM, SEED_TO), (parse_time("2026-11-02T09:20:00Z"), parse_time("2026-11-02T10:30:00Z"))]:
        swept, oracle = both(ledger, cfg, start, end)
        assert swept == oracle
        assert swept["intervals"], "a window with claims held has intervals"


def test_the_seed_lab_history_gives_the_usage_quotas_gives_at_each_check(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    body = services.quota_history(ledger.db, start=SEED_FROM, end=SEED_TO, config=SEED_CONFIG, cluster=ledger.cluster)
    # The checks of seed-lab.expected.json, counted as tests/integration/test_quotas.py counts them at T.
    assert values_at(body, "vision", parse_time("2026-11-02T09:30:00Z")) == {"example.com/gpu": 4}
    assert values_at(body, "nlp", parse_time("2026-11-02T09:30:00Z")) == {"example.com/gpu": 2}
    assert values_at(body, "vision", parse_time("2026-11-02T10:40:00Z")) == {"example.com/gpu": 3}
    assert values_at(body, "vision", parse_time("2026-11-02T11:59:59Z")) == {"example.com/gpu": 3}


def statements_of(ledger: LedgerHandle, cfg: LedgerConfig, start: datetime, end: datetime) -> int:
    """SQL statements ``dra-ledger quotas --from start --to end`` runs (``before_cursor_execute``)."""
    with statements_run(ledger.engine) as seen:
        services.quota_history(ledger.db, start=start, end=end, config=cfg, cluster=ledger.cluster)
    return len(seen)


def test_the_statements_of_a_quota_history_do_not_grow_with_its_edges(ledger: LedgerHandle) -> None:
    ledger.replay(HISTORIES / "seed-lab.jsonl")
    # gpu.example.com is defined from 08:10 on: neither window holds a change of the catalog.
    few = (parse_time("2026-11-02T09:30:00Z"), parse_time("2026-11-02T09:31:00Z"))
    many = (parse_time("2026-11-02T09:00:00Z"), parse_time("2026-11-02T12:00:00Z"))
    assert (edges(ledger, *few), edges(ledger, *many)) == (0, 6)
    assert statements_of(ledger, SEED_CONFIG, *few) == statements_of(ledger, SEED_CONFIG, *many)


# --- a catalog that changes under claims that stay allocated -------------------------------------

MIG_CLASS = device_class("mig.example.com", selector="device.attributes['gpu.example.com'].type == 'mig'")
EXT_CLASS = device_class("ext.example.com", extended="example.com/ext-a")
CATALOG_CONFIG = config([{"name": "res-1", "deviceClassNames": ["class-1"]},
                         {"name": "gpu.memory", "deviceClassNames": ["mig.example.com"],
                          "sources": [{"counter": "memory"}]}],
                        [{"team": "vision", "resourceName": "res-1", "nominalQuota": 1}])


def _mig(memory: str) -> JSONObject:
    return {"name": "gpu-15-mig", "attributes": {"type": {"string": "mig"}},
            "consumesCounters": [{"counterSet": "gpu-15-counters", "counters": {"memory": {"value": memory}}}]}


def _changed(obj: JSONObject, minutes: float, **spec: Any) -> tuple[str, JSONObject, float]:
    """``obj`` MODIFIED at ``minutes``: a fresh resourceVersion and ``spec`` merged into its spec."""
    new: Any = copy.deepcopy(obj)
    new["metadata"]["resourceVersion"] = rv()
    new["spec"].update(spec)
    return ("MODIFIED", new, minutes)


def catalog_lab() -> Lab:
    """Two claims held from minute 10 to the end while their catalog changes under them:

    - ``ext`` (an extended-resource claim of an unmapped class, so counted under the class's
      ``extendedResourceName``): the class renames it to ``ext-b`` at minute 20 (no edge there) and to
      ``ext-c`` at minute 40, the instant ``tick`` is released;
    - ``mig`` (a counter source): the pool is republished at minute 25 with its partition consuming
      20Gi of memory instead of 10Gi (no edge there either);
    - ``tick`` (class-1) is allocated at minute 30 and released at minute 40: the only edges after 10.
    """
    h = lab(device_class("class-1"), MIG_CLASS, EXT_CLASS)
    pool: Any = lab_slice(n=15, extra=[_mig("10Gi")])
    h.add(pool)
    h.claim("ext", [req("gpu", exactly("ext.example.com", 1))], origin="extended", allocate={"gpu": 1})
    h.claim("mig", [req("mig", exactly("mig.example.com", 2))],
            results=[{"request": "mig", "driver": DRIVER, "pool": "node-a", "device": "gpu-15-mig"}])
    tick: Any = h.claim("tick", [req("gpu", exactly("class-1", 1))], allocate={"gpu": 1}, minutes=30)
    h.events.append(_changed(EXT_CLASS, 20, extendedResourceName="example.com/ext-b"))
    republished: Any = _changed(pool, 25, devices=[*pool["spec"]["devices"][:-1], _mig("20Gi")])
    republished[1]["spec"]["pool"] = {**pool["spec"]["pool"], "generation": 2}
    h.events.append(republished)
    h.events.append(_changed(EXT_CLASS, 40, extendedResourceName="example.com/ext-c"))
    h.events.append(("DELETED", {**tick, "metadata": {**tick["metadata"], "resourceVersion": rv()}}, 40))
    return h


def test_a_catalog_change_under_held_claims_shows_from_the_next_edge_as_quotas_counts_it(
        ledger: LedgerHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog_lab().replay(ledger, tmp_path)
    # Fetch the window's rows two at a time, so the catalogs are read again while the cursor is open.
    monkeypatch.setattr(quota_counting, "HISTORY_ROWS", 2)
    for start in (at(0), at(15), at(30)):
        swept, oracle = both(ledger, CATALOG_CONFIG, start, at(60))
        assert swept == oracle
    body: Any = both(ledger, CATALOG_CONFIG, at(0), at(60))[0]
    rows = [(i["resourceName"], i["from"], i["to"], i["used"]) for i in body["intervals"] if i["team"] == "vision"]
    g = parse_quantity("1Gi")
    # Class and pool changed at minutes 20 and 25; quotas() sees them at the next edge, minute 30.
    assert rows == [("example.com/ext-a", stamp(10), stamp(30), 1),
                    ("example.com/ext-b", stamp(30), stamp(40), 1),
                    ("example.com/ext-c", stamp(40), stamp(60), 1),
                    ("gpu.memory", stamp(10), stamp(30), 2 * 10 * g),
                    ("gpu.memory", stamp(30), stamp(60), 2 * 20 * g),
                    ("res-1", stamp(0), stamp(30), 0),
                    ("res-1", stamp(30), stamp(40), 1),
                    ("res-1", stamp(40), stamp(60), 0)]


# --- a simulated fleet ---------------------------------------------------------------------------


@pytest.fixture()
def fleet(ledger: LedgerHandle, tmp_path: Path) -> LedgerHandle:
    path = tmp_path / "fleet.jsonl"
    summary = write_history(FLEET, path)
    assert summary.restarts > 0 and all(summary.kinds.get(k) for k in ("mig", "nic", "shared", "extended"))
    assert not ledger.replay(path).rejected
    return ledger


def test_the_sweep_answers_as_quotas_at_every_edge_on_a_simulated_fleet(fleet: LedgerHandle) -> None:
    t0 = FLEET.start
    windows = [(t0, t0 + timedelta(hours=FLEET.hours + 1)),
               (t0 + timedelta(minutes=73, seconds=30), t0 + timedelta(minutes=167))]
    for name, cfg in FLEET_CONFIGS.items():
        for start, end in windows:
            swept, oracle = both(fleet, cfg, start, end)
            assert swept == oracle, (name, start, end)

def test_the_statements_on_a_fleet_grow_neither_with_edges_nor_with_catalog_changes(fleet: LedgerHandle) -> None:
    t0 = FLEET.start
    few = (t0 + timedelta(minutes=90), t0 + timedelta(minutes=91))
    many = (t0 + timedelta(minutes=1), t0 + timedelta(hours=4))
    assert edges(fleet, *few) + 100 < edges(fleet, *many)
    # With sources the devices are part of the catalog, and driver restarts republish them in the long window.
    assert catalog_instants(fleet, *few) == 0 < catalog_instants(fleet, *many)
    for name in ("counts", "sources"):
        assert statements_of(fleet, FLEET_CONFIGS[name], *few) == statements_of(fleet, FLEET_CONFIGS[name], *many)


def test_intervals_that_start_in_the_same_second_are_listed_in_time_order(ledger: LedgerHandle, tmp_path: Path) -> None:
    # "09:10:00.500000Z" sorts before "09:10:00Z" as text ('.' < 'Z'): the rows must be ordered by time.
    h = lab(device_class("class-1"))
    h.claim("first", [req("gpu", exactly("class-1", 1))], allocate={"gpu": 1}, minutes=10)
    h.claim("second", [req("gpu", exactly("class-1", 1))], allocate={"gpu": 1}, minutes=10 + 0.5 / 60)
    h.replay(ledger, tmp_path)
    cfg = config([{"name": "res-1", "deviceClassNames": ["class-1"]}])
    swept: Any
    swept, oracle = both(ledger, cfg, at(0), at(60))
    assert swept == oracle
    rows = [(i["from"], i["to"], i["used"]) for i in swept["intervals"]]
    half = stamp(10 + 0.5 / 60)
    assert half == "2026-11-02T09:10:00.500000Z"
    assert rows == [(stamp(10), half, 1), (half, stamp(60), 2)]
