"""``compose.yaml`` is valid against the Compose specification and wires the whole stack.

The schema is the official ``compose-spec.json`` (compose-spec/compose-spec) as vendored by the
``check-jsonschema`` package; validation uses ``jsonschema`` with the schema's own draft (2020-12).
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.factories import plugin_commands

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_TEXT = (ROOT / "compose.yaml").read_text()
LEDGER_SERVICES = ("migrate", "workers", "jobs", "api")


def compose_schema() -> Any:
    return json.loads((files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())


def compose() -> Any:
    return yaml.safe_load(COMPOSE_TEXT)  # anchors and << merge keys resolved as Compose does


def validator() -> jsonschema.protocols.Validator:
    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_compose_yaml_is_valid_against_the_compose_specification() -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(compose())]
    assert errors == []


@pytest.mark.parametrize("breakage", ["unknown key", "bad depends_on condition", "ports not a list"])
def test_the_specification_check_catches_a_broken_file(breakage: str) -> None:
    broken = copy.deepcopy(compose())
    if breakage == "unknown key":
        broken["services"]["api"]["comand"] = ["x"]
    elif breakage == "bad depends_on condition":
        broken["services"]["grafana"]["depends_on"]["reader-login"]["condition"] = "service_finished"
    else:
        broken["services"]["grafana"]["ports"] = "3000:3000"
    assert list(validator().iter_errors(broken))


def test_the_stack_has_every_service_and_they_share_the_ledger_settings() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "migrate", "reader-login", "workers", "jobs", "api", "grafana"}
    url = services["migrate"]["environment"]["LEDGER_DATABASE_URL"]
    for name in LEDGER_SERVICES:
        assert services[name]["environment"]["LEDGER_DATABASE_URL"] == url, name
    for name in ("workers", "jobs", "api"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["environment"]["LEDGER_CONFIG"] == "/etc/dra-ledger/ledger.toml"
    grafana = services["grafana"]
    mounts = {v.split(":")[1] for v in grafana["volumes"] if v.startswith("./")}
    assert mounts == {"/etc/grafana/provisioning", "/var/lib/grafana/dashboards"}
    assert grafana["environment"]["LEDGER_READER_USER"] == "ledger_reader"
    for mount in grafana["volumes"]:
        if mount.startswith("./"):
            assert (ROOT / mount.split(":")[0]).is_dir(), mount


def test_every_environment_variable_the_file_reads_is_documented_in_its_header() -> None:
    header = "\n".join(line for line in COMPOSE_TEXT.splitlines() if line.startswith("#"))
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE_TEXT))
    assert used and {v for v in used if v not in header} == set()


def test_the_commands_the_services_run_exist() -> None:
    with plugin_commands() as app:
        registered = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    services = compose()["services"]
    for name, wanted in (("workers", "watch"), ("jobs", "jobs"), ("api", "serve")):
        assert f"dra-ledger {wanted}" in services[name]["command"][-1], name
        assert wanted in registered, wanted


def test_the_report_jobs_run_in_the_jobs_service_alone() -> None:
    # The README: "Pass `--no-jobs` when `dra-ledger jobs` runs them in a process of its own". The stack ran the
    # jobs in both services, and two schedulers at once billed the rolled hours twice (a user trial).
    services = compose()["services"]
    watch = shlex.split(services["workers"]["command"][-1].split("&&")[-1])
    jobs = shlex.split(services["jobs"]["command"][-1].split("&&")[-1])
    assert watch[:3] == ["exec", "dra-ledger", "watch"] and "--no-jobs" in watch and "--jobs" not in watch
    assert jobs[:3] == ["exec", "dra-ledger", "jobs"] and "--once" not in jobs
    readme = " ".join((ROOT / "README.md").read_text().split())  # the README says so too, however it wraps
    assert "the watch workers (`KUBECONFIG_FILE`; `watch --no-jobs`), the report jobs (service `jobs`" in readme


def test_the_example_configuration_file_the_stack_mounts_is_valid() -> None:
    from ledger.config import load_config

    config = load_config(ROOT / "deploy" / "ledger.toml")
    assert config.mapping_of("gpu.example.com") is not None
