"""The kinds the workers follow, with the API versions tried and the kubernetes-asyncio call for each.

DRA kinds are tried in ``resource.k8s.io`` versions ``v1``, then ``v1beta2``, then ``v1beta1``
(Kubernetes 1.34 serves v1; 1.32-1.33 serve v1beta1/v1beta2); the translator normalises them to v1.
DeviceTaintRule is optional: it exists only as ``v1alpha3`` (1.33-1.35, behind the
``DRADeviceTaints`` feature gate and the alpha API) and ``v1beta2`` (1.36 on), so a cluster may serve
none; discovery of the version's resources decides (``workers.main.choose_version``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

DRA_GROUP: Final = "resource.k8s.io"
DRA_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
"""Versions of ``resource.k8s.io`` the workers accept, most preferred first."""
DEVICE_TAINT_RULE_VERSIONS: Final = ("v1beta2", "v1alpha3")
"""Versions of ``resource.k8s.io`` that serve DeviceTaintRule, most preferred first (no ``v1`` exists yet)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KindInfo:
    """One followed kind: where it is served and how kubernetes-asyncio lists it."""

    kind: str
    """Kubernetes kind, e.g. ``ResourceClaim``."""
    group: str
    """API group; ``""`` for the core group."""
    versions: tuple[str, ...]
    """Versions tried, most preferred first."""
    plural: str
    """Resource name in URLs and RBAC rules, e.g. ``resourceclaims``."""
    list_method: str
    """Method of the kubernetes-asyncio API class that lists (and, with ``watch=True``, watches) the
    kind across all namespaces."""
    optional: bool = False
    """``True``: a server that serves none of ``versions`` is normal (the worker follows the other kinds
    without it); ``False``: it is an error, retried with backoff."""

    def api_version(self, version: str) -> str:
        """``apiVersion`` of objects of this kind in ``version`` (``v1`` or ``resource.k8s.io/v1``)."""
        return f"{self.group}/{version}" if self.group else version


KINDS: Final = (
    KindInfo(kind="Namespace", group="", versions=("v1",), plural="namespaces", list_method="list_namespace"),
    KindInfo(kind="DeviceClass", group=DRA_GROUP, versions=DRA_VERSIONS, plural="deviceclasses",
             list_method="list_device_class"),
    KindInfo(kind="ResourceSlice", group=DRA_GROUP, versions=DRA_VERSIONS, plural="resourceslices",
             list_method="list_resource_slice"),
    KindInfo(kind="ResourceClaim", group=DRA_GROUP, versions=DRA_VERSIONS, plural="resourceclaims",
             list_method="list_resource_claim_for_all_namespaces"),
    KindInfo(kind="Pod", group="", versions=("v1",), plural="pods", list_method="list_pod_for_all_namespaces"),
    KindInfo(kind="DeviceTaintRule", group=DRA_GROUP, versions=DEVICE_TAINT_RULE_VERSIONS,
             plural="devicetaintrules", list_method="list_device_taint_rule", optional=True),
)
"""The kinds of DESIGN §8, in the order their loops start (namespaces first, for team labels); the sixth,
DeviceTaintRule, only where the server serves it."""

BY_KIND: Final[Mapping[str, KindInfo]] = MappingProxyType({k.kind: k for k in KINDS})
BY_PLURAL: Final[Mapping[str, KindInfo]] = MappingProxyType({k.plural: k for k in KINDS})
