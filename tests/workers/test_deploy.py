"""The Kubernetes manifests under deploy/kubernetes validate against the Kubernetes schemas
(kubernetes-validate, strict: unknown fields fail) and grant exactly what the workers use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from workers.k8s.kinds import KINDS
from workers.settings import WatchSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES_VERSIONS = ("1.34.0", "1.37.0")
"""resource.k8s.io/v1 is GA from 1.34; the newest schemas the library ships."""


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in _documents() if doc["kind"] == kind]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("name", "doc"), _documents(), ids=[n for n, _ in _documents()])
def test_every_manifest_validates_against_the_kubernetes_schema(name: str, doc: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_cluster_role_grants_get_list_watch_on_exactly_the_six_watched_kinds() -> None:
    (role,) = [r for r in _by_kind("ClusterRole") if r["metadata"]["name"] == "dra-ledger-watch"]
    granted = {(group, resource) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"]}
    assert granted == {(k.group, k.plural) for k in KINDS}
    assert all(sorted(rule["verbs"]) == ["get", "list", "watch"] for rule in role["rules"])


def test_the_lease_role_allows_get_create_update_on_the_workers_lease_only() -> None:
    (role,) = _by_kind("Role")
    verbs: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"] and rule["resources"] == ["leases"]
        for verb in rule["verbs"]:
            verbs.setdefault(verb, set()).update(rule.get("resourceNames", ["*"]))
    assert verbs == {"get": {WatchSettings().lease_name}, "update": {WatchSettings().lease_name}, "create": {"*"}}


def test_the_worker_deployment_probes_its_health_port_and_names_itself_after_the_pod() -> None:
    (deployment,) = [d for d in _by_kind("Deployment") if d["metadata"]["name"] == "dra-ledger-watch"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert container["args"] == ["watch"]
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["LEDGER_WATCH_LEASE_NAME"]["value"] == WatchSettings().lease_name
    port = int(env["LEDGER_WATCH_HEALTH_PORT"]["value"])
    assert container["ports"][0]["containerPort"] == port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "dra-ledger-watch"
    assert deployment["spec"]["replicas"] >= 2  # a standby to take over


def test_a_stopped_workers_write_ends_before_kubernetes_kills_it_and_before_a_standby_may_take_over() -> None:
    # At SIGTERM the append transaction in flight gets stop_grace_s to commit, then is cancelled; the process then
    # hands the Lease on. The grace must end inside the pod's termination grace and inside the time between the
    # leader's last renewal deadline and a standby's takeover.
    (deployment,) = [d for d in _by_kind("Deployment") if d["metadata"]["name"] == "dra-ledger-watch"]
    defaults = WatchSettings()
    assert 0 < defaults.stop_grace_s < deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] / 2
    assert defaults.stop_grace_s < defaults.lease_duration_s - defaults.renew_deadline_s


def test_a_manifest_with_a_typo_fails_validation() -> None:
    (deployment,) = [d for d in _by_kind("Deployment") if d["metadata"]["name"] == "dra-ledger-watch"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)
