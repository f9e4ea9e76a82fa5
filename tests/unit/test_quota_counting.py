"""Pure parts of quotas and sharing: Kueue counting rules, quantities, capacity splits, the config file."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from ledger.config import LedgerConfig, load_config
from ledger.errors import Invalid
from ledger.projections.base import request_count
from ledger.projections.quotas import (
    MAX_INT64,
    REASON_ALL,
    REASON_CLAIM_BY_NAME,
    Catalog,
    ClaimAtT,
    Device,
    Result,
    count_claim,
    reason_unmapped,
)
from ledger.projections.selectors import DeviceView
from ledger.quantities import parse_quantity
from ledger.types import JSONObject, JSONValue

MAPPING = LedgerConfig.model_validate({"deviceClassMappings": [
    {"name": "res-1", "deviceClassNames": ["class-1"]}, {"name": "res-2", "deviceClassNames": ["class-2"]}]})


def claim(requests: list[JSONValue], results: list[tuple[str, str | None]], *, origin: str = "template") -> ClaimAtT:
    return ClaimAtT(cluster="c", uid="u", namespace="ml", name="job", team="vision", origin=origin, requests=requests,
                    results=[Result(request=r, device_class=cls, driver="d", pool="p", device=f"dev-{i}",
                                    admin_access=False) for i, (r, cls) in enumerate(results)])


def charges(c: ClaimAtT, config: LedgerConfig = MAPPING, catalog: Catalog | None = None) -> dict[str, Decimal]:
    return {x.resource_name: x.amount for x in count_claim(c, config=config, catalog=catalog or Catalog())}


def exactly(cls: str, count: int | None = None, **more: JSONValue) -> JSONObject:
    spec: JSONObject = {"deviceClassName": cls, **more}
    if count is not None:
        spec["count"] = count
    return {"name": f"r-{cls}-{count}-{len(more)}", "exactly": spec}


def test_exact_count_counts_count_and_defaults_to_one() -> None:
    assert charges(claim([exactly("class-1", 2)], [])) == {"res-1": 2}
    assert charges(claim([exactly("class-1")], [])) == {"res-1": 1}
    assert charges(claim([exactly("class-1", 2), exactly("class-2", 1)], [])) == {"res-1": 2, "res-2": 1}


def test_admin_access_and_an_empty_class_count_nothing() -> None:
    assert charges(claim([exactly("class-1", 2), exactly("class-1", 1, adminAccess=True)], [])) == {"res-1": 2}
    assert charges(claim([{"name": "x", "exactly": {"deviceClassName": "", "count": 3}}], [])) == {}


def test_counts_saturate_at_max_int64() -> None:
    assert charges(claim([exactly("class-1", MAX_INT64), exactly("class-1", MAX_INT64, x=1)], [])) == \
        {"res-1": MAX_INT64}


def test_refused_requests_count_their_allocation_results_with_the_reason() -> None:
    c = claim([{"name": "nics", "exactly": {"deviceClassName": "class-1", "allocationMode": "All"}}],
              [("nics", "class-1")] * 3)
    [charge] = count_claim(c, config=MAPPING, catalog=Catalog())
    assert (charge.resource_name, charge.amount, charge.reasons) == ("res-1", Decimal(3), (REASON_ALL,))
    manual = count_claim(claim([exactly("class-9", 1)], [], origin="manual"), config=MAPPING, catalog=Catalog())
    assert [(x.resource_name, x.amount, x.reasons) for x in manual] == \
        [("class-9", Decimal(1), (REASON_CLAIM_BY_NAME, reason_unmapped("class-9")))]
    odd = count_claim(claim([{"name": "x", "exactly": {"deviceClassName": "class-1", "allocationMode": "Some"}}],
                            [("x", "class-1")]), config=MAPPING, catalog=Catalog())
    assert odd[0].reasons == ("unsupported allocation mode: Some",)


def _device(name: str, memory: str) -> Device:
    return Device(driver="d", pool="p", device=name,
                  view=DeviceView(driver="d", attributes={"type": {"string": "mig"}},
                                  capacity={"memory": {"value": memory}}),
                  consumes_counters=[{"counterSet": "s", "counters": {"memory": {"value": memory}}}])


def test_counter_sources_take_the_largest_counter_of_the_class_times_count() -> None:
    config = LedgerConfig.model_validate({"deviceClassMappings": [
        {"name": "gpu.memory", "deviceClassNames": ["mig"], "sources": [{"counter": "memory"}]}]})
    catalog = Catalog(classes={"mig": {"selectors": [{"cel": {"expression": "device.driver == 'd'"}}]}},
                      devices=[_device("1g", "9856Mi"), _device("3g", "40Gi")])
    assert charges(claim([exactly("mig", 1)], [("r-mig-1-0", "mig")]), config, catalog) == \
        {"gpu.memory": parse_quantity("40Gi")}
    only_small = Catalog(classes=catalog.classes, devices=[_device("1g", "9856Mi")])
    assert charges(claim([exactly("mig", 3)], []), config, only_small) == {"gpu.memory": 3 * parse_quantity("9856Mi")}


@pytest.mark.parametrize(("text", "value"), [("40Gi", 40 * 2**30), ("9856Mi", 9856 * 2**20), ("500m", Decimal("0.5")),
                                             ("1e3", 1000), ("8", 8), ("1.5k", 1500), (".5", Decimal("0.5"))])
def test_quantities_parse_like_kubernetes(text: str, value: Decimal | int) -> None:
    assert parse_quantity(text) == value


def test_a_bad_quantity_is_invalid() -> None:
    with pytest.raises(Invalid):
        parse_quantity("40 GB")


def test_the_configuration_follows_kueues_mapping_rules(tmp_path: Path) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text("deviceClassMappings:\n- name: a\n  deviceClassNames: [x]\n- name: b\n  deviceClassNames: [x]\n")
    with pytest.raises(Invalid, match="already mapped to resource 'a'"):
        load_config(path)
    path.write_text("deviceClassMappings:\n- name: a\n  deviceClassNames: [x]\n  sources: [{counter: memory}]\n"
                    "- name: b\n  deviceClassNames: [x]\n  sources: [{counter: cores}]\n")
    assert [m.name for m in load_config(path).mappings_of("x")] == ["a", "b"]  # two counters: allowed (v0.19)
    path.write_text("deviceClassMappings:\n- name: a\n  deviceClassNames: [x]\n"
                    "  sources: [{counter: m, capacity: c}]\n")
    with pytest.raises(Invalid, match="exactly one of counter or capacity"):
        load_config(path)
    path.write_text("deviceClassMappings:\n- name: a\n  deviceClassNames: ['Not A Name!']\n")
    with pytest.raises(Invalid, match="not a valid qualified name"):
        load_config(path)
    path.write_text("quotas:\n- {team: t, resourceName: r, nominalQuota: 1}\n- {team: t, resourceName: r, "
                    "nominalQuota: 2}\n")
    with pytest.raises(Invalid, match="two quotas for 'r' in every cluster"):
        load_config(path)
    path.write_text("quotas:\n- {team: t, resourceName: gpu.memory, nominalQuota: 80Gi}\n"
                    "teams: {overrides: {kube-system: platform}}\n")
    config = load_config(path)
    assert config.quota_of(cluster="c", team="t", resource_name="gpu.memory") == 80 * 2**30
    assert (config.team_of("kube-system", "kube-system"), config.team_of("ml", "vision")) == ("platform", "vision")


def test_a_quota_naming_a_cluster_takes_the_place_of_the_one_for_every_cluster_there(tmp_path: Path) -> None:
    path = tmp_path / "ledger.yaml"
    path.write_text("quotas:\n- {team: t, resourceName: r, nominalQuota: 3}\n"
                    "- {cluster: east, team: t, resourceName: r, nominalQuota: 8}\n"
                    "- {cluster: west, team: u, resourceName: r, nominalQuota: 1}\n")
    config = load_config(path)
    assert [config.quota_of(cluster=c, team="t", resource_name="r") for c in ("east", "west", "north")] == [8, 3, 3]
    assert [config.quota_of(cluster=c, team="u", resource_name="r") for c in ("east", "west")] == [None, 1]
    assert config.quota_keys_of("west") == {("t", "r"), ("u", "r")}
    assert config.quota_keys_of("east") == {("t", "r")}
    # One quota per (cluster, team, resource name); the entry without a cluster is a key of its own.
    path.write_text("quotas:\n- {cluster: east, team: t, resourceName: r, nominalQuota: 3}\n"
                    "- {cluster: east, team: t, resourceName: r, nominalQuota: 8}\n")
    with pytest.raises(Invalid, match="team 't' has two quotas for 'r' in cluster 'east'"):
        load_config(path)
    path.write_text("quotas:\n- {cluster: ' east', team: t, resourceName: r, nominalQuota: 3}\n")
    with pytest.raises(Invalid, match=r"quotas\.0\.cluster"):
        load_config(path)
    # YAML reads a key whose value was forgotten as null: refused, not read as "every cluster".
    path.write_text("quotas:\n- cluster:\n  team: t\n  resourceName: r\n  nominalQuota: 3\n")
    with pytest.raises(Invalid, match="leave cluster out for a quota in every cluster, or name the cluster"):
        load_config(path)
    # A name YAML reads as a number or a boolean: the message shows what was read and says to quote it.
    path.write_text("quotas:\n- {cluster: 2024, team: no, resourceName: r, nominalQuota: 3}\n")
    with pytest.raises(Invalid) as refused:
        load_config(path)
    hint = "a value written without quotes read as a number or a boolean: quote it"
    assert f"quotas.0.cluster: Input should be a valid string (got 2024, {hint})" in str(refused.value)
    assert f"quotas.0.team: Input should be a valid string (got False, {hint})" in str(refused.value)
    # The configuration serve hands its workers (JSON) writes a quota without a cluster as null, read as left out.
    path.write_text("quotas:\n- {team: t, resourceName: r, nominalQuota: 3}\n")
    config = load_config(path)
    assert LedgerConfig.model_validate_json(config.model_dump_json(by_alias=True)) == config


@pytest.mark.parametrize(("spec", "expected"), [
    ({"count": 3}, 3), ({}, 1), ({"count": None}, 1),
    # Refused by the translator today; a ledger recorded before may hold them: 1 in every view.
    ({"count": 0}, 1), ({"count": -5}, 1), ({"count": "2"}, 1), ({"count": 2.5}, 1), ({"count": True}, 1),
])
def test_a_request_count_is_read_alike_by_quotas_pending_and_claims(spec: JSONObject, expected: int) -> None:
    assert request_count(spec) == expected
