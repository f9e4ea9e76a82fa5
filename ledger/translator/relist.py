"""What a relist means for the translator: which listed objects it knows, and which vanished.

After a watch expires (``410 Gone``) the worker lists the kind again. Objects it already recorded go
through the translator as MODIFIED (only real changes emit events); objects it never saw as ADDED;
and every object the translator still holds but the list lacks was deleted while nobody watched:
:func:`vanished` rebuilds a DELETED object for it from the translator state alone, so the same
translator code records its release and deletion (DESIGN §3: "a relist after 410 Gone also emits
the deletions for objects that vanished"). The deletion is dated when the relist is observed: the
real instant is lost with the object.
"""

from __future__ import annotations

from collections.abc import Iterable

from ledger.translator.fields import opt_str
from ledger.translator.normalize import V1
from ledger.translator.translate import TranslatorState, claim_uid_of, namespace_of
from ledger.types import JSONObject, JSONValue

RELISTED_KINDS = ("ResourceSlice", "ResourceClaim", "DeviceClass", "Pod", "Namespace", "DeviceTaintRule")
"""Kinds whose relist this module understands (the kinds the workers watch; DeviceTaintRule where served)."""

_PREFIX = {"ResourceSlice": "slice:", "ResourceClaim": "claim:", "DeviceClass": "class:", "Pod": "pod:",
           "Namespace": "namespace:", "DeviceTaintRule": "taintrule:"}


def state_key(obj: JSONObject) -> str | None:
    """Return the translator state key an object is recorded under, or ``None`` for other kinds.

    Source: ``kind`` and ``metadata.uid`` / ``metadata.name`` / ``metadata.namespace``. Keys:
    ``slice:<uid>``, ``claim:<uid>``, ``class:<name>``, ``taintrule:<name>``, ``pod:<uid>``, ``namespace:<name>``
    (``name:<namespace>/<name>`` or ``name:<name>`` stands in for a missing uid, as the translator does).

    Raises:
        InvalidObject: a name or uid the key needs is missing or not a string.
    """
    kind = obj.get("kind")
    if kind == "ResourceClaim":
        return f"claim:{claim_uid_of(obj)}"
    if kind == "ResourceSlice":
        return f"slice:{opt_str(obj, 'metadata.uid') or 'name:' + (opt_str(obj, 'metadata.name') or '')}"
    if kind == "Pod":
        uid = opt_str(obj, "metadata.uid")
        return f"pod:{uid or 'name:' + namespace_of(obj) + '/' + (opt_str(obj, 'metadata.name') or '')}"
    if kind in ("DeviceClass", "DeviceTaintRule", "Namespace"):
        return f"{_PREFIX[str(kind)]}{opt_str(obj, 'metadata.name') or ''}"
    return None


def known(state: TranslatorState, key: str) -> bool:
    """True when the translator holds a live (not deleted) entry under ``key``."""
    entry = state.get(key)
    return entry is not None and not entry.get("deleted")


def vanished(state: TranslatorState, kind: str, listed: Iterable[str]) -> list[JSONObject]:
    """Build a DELETED object for every live object of ``kind`` in ``state`` whose key is not ``listed``.

    The objects carry only what the translator reads on deletion (identity; for a slice its driver
    and pool; for a pod its last recorded phase, node and claims, so no phase change is invented).
    Namespaces are never returned: the translator keeps a deleted namespace's last team.

    Args:
        state: the translator's memory for one cluster (not changed).
        kind: one of :data:`RELISTED_KINDS`.
        listed: state keys (see :func:`state_key`) of every object in the list just received.

    Returns:
        Objects in ``resource.k8s.io/v1`` or core ``v1`` shape, ordered by state key (deterministic).
    """
    prefix = _PREFIX.get(kind)
    if prefix is None or kind == "Namespace":
        return []
    present = set(listed)
    out: list[JSONObject] = []
    for key in sorted(k for k in state.entries if k.startswith(prefix) and k not in present):
        entry = state.get(key)  # read once: entries are kept packed (the test of known(), inline)
        if entry is None or entry.get("deleted"):
            continue
        ident = key[len(prefix):]
        obj = _tombstone(state, kind, ident, entry)
        if obj is not None:
            out.append(obj)
    return out


def _uid_meta(ident: str) -> JSONObject:
    return {} if ident.startswith("name:") else {"uid": ident}


def _tombstone(state: TranslatorState, kind: str, ident: str, entry: JSONObject) -> JSONObject | None:
    if kind == "ResourceClaim":
        return {"apiVersion": V1, "kind": "ResourceClaim",
                "metadata": {**_uid_meta(ident), "namespace": entry.get("namespace"), "name": entry.get("name")}}
    if kind in ("DeviceClass", "DeviceTaintRule"):
        return {"apiVersion": V1, "kind": kind, "metadata": {"name": ident}}
    if kind == "ResourceSlice":
        pool_id = entry.get("pool")
        pool = state.get(f"pool:{pool_id}") if isinstance(pool_id, str) else None
        if pool is None:
            return None
        slices = pool.get("slices")
        view = slices.get(ident) if isinstance(slices, dict) else None
        name = view.get("name") if isinstance(view, dict) else None
        return {"apiVersion": V1, "kind": "ResourceSlice",
                "metadata": {**_uid_meta(ident), "name": name if isinstance(name, str) else ident},
                "spec": {"driver": pool.get("driver"), "pool": {"name": pool.get("pool")}}}
    # Pod: reproduce the last recorded phase/node/claims so that only PodDeleted is emitted.
    namespace, name = entry.get("namespace"), entry.get("name")
    if not isinstance(name, str) and ident.startswith("name:"):
        namespace, _, name = ident[len("name:"):].partition("/")
    claims = entry.get("claims")
    statuses: list[JSONValue] = [{"name": c, "resourceClaimName": c}
                                 for c in (claims if isinstance(claims, list) else []) if isinstance(c, str)]
    spec: JSONObject = {"nodeName": entry["node"]} if isinstance(entry.get("node"), str) else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {**_uid_meta(ident), "namespace": namespace if isinstance(namespace, str) else "default",
                         "name": name if isinstance(name, str) else ident},
            "spec": spec, "status": {"phase": entry.get("phase") or "Pending", "resourceClaimStatuses": statuses}}
