"""Bring every accepted version of the DRA kinds to the ``resource.k8s.io/v1`` shape.

Clusters still serve, and users still paste, ``v1beta1`` and ``v1beta2`` objects. Converting them
once, here, lets the rest of the ledger read one shape only. The conversions follow the upstream
ones in ``k8s.io/dynamic-resource-allocation/api/v1beta1/conversion.go``:

- ``v1beta1`` ResourceSlice devices wrap their fields in ``basic``; ``v1`` has them on the device.
- ``v1beta1`` ResourceClaim requests are flat; ``v1`` puts the fields of a single-choice request in
  ``exactly`` next to ``name`` (``firstAvailable`` sub-requests have the same shape in both).
- ``v1beta2`` already has the ``v1`` shape, and DeviceClass / DeviceTaintRule do not change: only
  ``apiVersion`` is relabelled.
- DeviceTaintRule is served as ``v1alpha3`` (Kubernetes 1.33 to 1.35) and ``v1beta2`` (1.36 on); its
  ``spec`` {``deviceSelector``, ``taint``} has one shape in every version (1.35's ``v1alpha3`` dropped
  ``deviceSelector.deviceClassName`` and ``selectors``: absent fields, not another shape), so its
  ``v1alpha3`` objects are accepted and relabelled too. Other kinds in ``v1alpha3`` stay unsupported.

Only the structure needed to convert and to find objects is checked here (``metadata``, ``spec``,
the device list of a slice and the request list of a claim); the translator validates what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from ledger.errors import InvalidObject, UnsupportedObject
from ledger.types import JSONObject, JSONValue

V1: Final = "resource.k8s.io/v1"
"""The ``apiVersion`` of every DRA object that ``normalize`` returns."""
V1BETA2: Final = "resource.k8s.io/v1beta2"
V1BETA1: Final = "resource.k8s.io/v1beta1"

_DRA_VERSIONS: Final = frozenset({V1, V1BETA2, V1BETA1})
_CORE_VERSIONS: Final = frozenset({"v1"})
V1ALPHA3: Final = "resource.k8s.io/v1alpha3"
_TAINT_RULE_VERSIONS: Final = _DRA_VERSIONS | {V1ALPHA3}
"""DeviceTaintRule versions: the three DRA versions plus ``v1alpha3``, where 1.33 to 1.35 serve it."""

SUPPORTED: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "ResourceSlice": _DRA_VERSIONS,
        "ResourceClaim": _DRA_VERSIONS,
        "ResourceClaimTemplate": _DRA_VERSIONS,
        "DeviceClass": _DRA_VERSIONS,
        "DeviceTaintRule": _TAINT_RULE_VERSIONS,
        "Pod": _CORE_VERSIONS,
        "Namespace": _CORE_VERSIONS,
    }
)
"""Kind -> the ``apiVersion`` values ``normalize`` accepts (``resource.k8s.io/v1alpha3`` for DeviceTaintRule only)."""

_EXACTLY_FIELDS: Final = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
)
"""Fields of a flat ``v1beta1`` DeviceRequest that ``v1`` moves into ``exactly``, in ``v1`` order."""


def copy_json(obj: JSONObject) -> JSONObject:
    """A deep copy of a decoded JSON/YAML object: new dicts and lists, the same immutable leaves.

    ``copy.deepcopy`` spends most of the translator's time on its memo and dispatch (it handles
    cycles and arbitrary classes, which decoded documents never contain); copying only dicts and
    lists is several times faster and shares nothing mutable with ``obj`` all the same.
    """
    return {k: _copy_value(v) for k, v in obj.items()}


def _copy_value(value: JSONValue) -> JSONValue:
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    return value


def normalize(obj: JSONObject) -> JSONObject:
    """Return ``obj`` in the ``resource.k8s.io/v1`` shape.

    DRA kinds (ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass, DeviceTaintRule) in
    ``resource.k8s.io/v1``, ``v1beta2`` or ``v1beta1`` (DeviceTaintRule also ``v1alpha3``) come back
    labelled ``resource.k8s.io/v1``.
    An object already in ``v1`` (``resource.k8s.io/v1``, or ``v1`` Pods and Namespaces) is checked and
    returned itself, not copied; an older version comes back as a new object that shares no mutable
    part with the input. The input is never mutated. Every other field (metadata, status, unknown fields) is
    kept as it is; list order is kept. No units are involved: quantities stay strings.

    Args:
        obj: one Kubernetes object as decoded from JSON or YAML (a ``List`` must be split into its
            ``items`` by the caller).

    Returns:
        The object in the ``v1`` shape (``obj`` itself when it already was). For a ``v1beta1`` ResourceSlice, each
        ``spec.devices[].basic`` is flattened into its device; for a ``v1beta1`` ResourceClaim
        (``spec.devices.requests[]``) or ResourceClaimTemplate (``spec.spec.devices.requests[]``),
        the single-choice fields of each request move into ``exactly``.

    Raises:
        UnsupportedObject: the kind is not tracked (for example a CRD or a ``List``), or its
            ``apiVersion`` is not one accepted by ``SUPPORTED`` (for example a ResourceClaim in
            ``resource.k8s.io/v1alpha3``).
        InvalidObject: ``kind`` or ``apiVersion`` is not a string, ``metadata`` is not a mapping,
            ``spec`` is present but not a mapping, a slice's ``spec.devices`` is not a list of
            mappings with a string ``name``, a claim's ``spec.devices.requests`` is not a list of
            mappings with a string ``name``, or a ``v1beta1`` device's ``basic`` is not a mapping.
            ``path`` is dotted with list indexes in brackets, e.g. ``spec.devices[2].name``.
    """
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if not isinstance(kind, str):
        raise InvalidObject("kind", f"must be a string, got {_describe(kind)}")
    if not isinstance(api_version, str):
        raise InvalidObject("apiVersion", f"must be a string, got {_describe(api_version)}")
    accepted = SUPPORTED.get(kind)
    if accepted is None:
        raise UnsupportedObject(f"kind {kind} (apiVersion {api_version}) is not tracked")
    if api_version not in accepted:
        raise UnsupportedObject(
            f"{kind} in apiVersion {api_version} is not supported; accepted: {', '.join(sorted(accepted))}"
        )

    if not isinstance(obj.get("metadata"), dict):
        raise InvalidObject("metadata", f"must be a mapping, got {_describe(obj.get('metadata'))}")
    if api_version in (V1, "v1"):
        # Already in the v1 shape: checked, never copied. Copying every object cost ~20% of ingest CPU,
        # and nothing downstream edits the object (the translator copies a state entry before editing it).
        _check_spec(obj, kind, beta1=False)
        return obj
    # Purity: the conversion edits this private deep copy, never ``obj`` nor anything it holds.
    out = copy_json(obj)
    _check_spec(out, kind, beta1=api_version == V1BETA1)
    out["apiVersion"] = V1
    return out


def _check_spec(obj: JSONObject, kind: str, *, beta1: bool) -> None:
    """Check the parts of ``spec`` the translator walks; for ``v1beta1`` convert them in place."""
    spec = _optional_mapping(obj, "spec", path="spec")
    if kind == "ResourceSlice" and spec is not None:
        _normalize_slice_spec(spec, beta1=beta1)
    elif kind == "ResourceClaim" and spec is not None:
        _normalize_claim_spec(spec, path="spec", beta1=beta1)
    elif kind == "ResourceClaimTemplate" and spec is not None:
        claim_spec = _optional_mapping(spec, "spec", path="spec.spec")
        if claim_spec is not None:
            _normalize_claim_spec(claim_spec, path="spec.spec", beta1=beta1)


def _normalize_slice_spec(spec: JSONObject, *, beta1: bool) -> None:
    """Check ``ResourceSlice.spec.devices[]`` and, for ``v1beta1``, flatten it in place."""
    devices = spec.get("devices")
    if devices is None:  # a counter-only slice has no devices
        return
    if not isinstance(devices, list):
        raise InvalidObject("spec.devices", f"must be a list, got {_describe(devices)}")
    for index, device in enumerate(devices):
        path = f"spec.devices[{index}]"
        if not isinstance(device, dict):
            raise InvalidObject(path, f"must be a mapping, got {_describe(device)}")
        if not isinstance(device.get("name"), str):
            raise InvalidObject(f"{path}.name", f"must be a string, got {_describe(device.get('name'))}")
        if beta1:
            devices[index] = _flatten_basic(device, path=path)
    if beta1:
        # v1beta1 spells "unset" as "" / false; v1 makes both optional pointers and omits them.
        if spec.get("nodeName") == "":
            del spec["nodeName"]
        if spec.get("allNodes") is False:
            del spec["allNodes"]


def _flatten_basic(device: JSONObject, *, path: str) -> JSONObject:
    """Return a ``v1beta1`` ``{name, basic: {...}}`` device as a ``v1`` device ``{name, ...}``."""
    basic = device.get("basic")
    rest = {key: value for key, value in device.items() if key != "basic"}
    if basic is None:
        return rest
    if not isinstance(basic, dict):
        raise InvalidObject(f"{path}.basic", f"must be a mapping, got {_describe(basic)}")
    return {"name": device["name"], **{k: v for k, v in basic.items() if k != "name"}, **rest}


def _normalize_claim_spec(spec: JSONObject, *, path: str, beta1: bool) -> None:
    """Check a ResourceClaimSpec's ``devices.requests[]`` and, for ``v1beta1``, nest it in place."""
    devices = _optional_mapping(spec, "devices", path=f"{path}.devices")
    if devices is None:
        return
    requests = devices.get("requests")
    if requests is None:
        return
    if not isinstance(requests, list):
        raise InvalidObject(f"{path}.devices.requests", f"must be a list, got {_describe(requests)}")
    for index, request in enumerate(requests):
        request_path = f"{path}.devices.requests[{index}]"
        if not isinstance(request, dict):
            raise InvalidObject(request_path, f"must be a mapping, got {_describe(request)}")
        if not isinstance(request.get("name"), str):
            raise InvalidObject(
                f"{request_path}.name", f"must be a string, got {_describe(request.get('name'))}"
            )
        if beta1:
            requests[index] = _nest_exactly(request)


def _nest_exactly(request: JSONObject) -> JSONObject:
    """Return a flat ``v1beta1`` DeviceRequest in the ``v1`` shape.

    As upstream does, ``exactly`` is created when any of its fields is set (``null`` counts as unset)
    and ``firstAvailable`` is kept as it is: a request that sets both stays invalid in ``v1`` too,
    and the translator records both halves as sent instead of this function silently dropping one.
    """
    exactly: JSONObject = {key: value for key in _EXACTLY_FIELDS if (value := request.get(key)) is not None}
    out = {key: value for key, value in request.items() if key not in _EXACTLY_FIELDS}
    if exactly:
        out["exactly"] = exactly
    return out


def _optional_mapping(parent: JSONObject, key: str, *, path: str) -> JSONObject | None:
    """Return ``parent[key]`` if it is a mapping, ``None`` if absent or null; else raise InvalidObject."""
    value = parent.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise InvalidObject(path, f"must be a mapping, got {_describe(value)}")


def _describe(value: JSONValue | None) -> str:
    """Name the JSON type of ``value`` for an error message."""
    if value is None:
        return "nothing (missing or null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "a mapping"
