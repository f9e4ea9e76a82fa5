"""Typed reads of raw Kubernetes objects with located errors.

Every accessor takes the object and a dotted path and either returns a value of the expected type
or raises :class:`ledger.errors.InvalidObject` naming the path, so a malformed object is reported
as e.g. ``spec.pool.generation: expected an integer, got 'two'`` instead of a ``KeyError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from ledger.errors import InvalidObject
from ledger.types import JSONObject, JSONValue

_MISSING = object()


_PARTS: dict[str, tuple[str, ...]] = {}
"""Split dotted paths. The translator reads a few dozen distinct paths, each hundreds of thousands of
times on a large replay; splitting them once keeps ``_walk`` (its hottest function) lean."""


def _walk(obj: Mapping[str, JSONValue], path: str) -> object:
    parts = _PARTS.get(path)
    if parts is None:
        parts = tuple(path.split("."))
        if len(_PARTS) < 4096:  # bounded, should a caller build paths from data
            _PARTS[path] = parts
    cur: object = obj
    for part in parts:
        # ``type(...) is dict`` first: decoded JSON is always a dict, and an ABC isinstance costs more. A missing
        # key and a JSON null both read as ``None`` here (absent).
        if type(cur) is dict or isinstance(cur, Mapping):
            cur = cur.get(part)
        else:
            raise InvalidObject(path, f"expected a mapping at {part!r}, got {type(cur).__name__}")
        if cur is None:
            return _MISSING
    return cur


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def opt_str(obj: Mapping[str, JSONValue], path: str) -> str | None:
    """Return the string at ``path`` or ``None`` when absent/null.

    Raises:
        InvalidObject: the value exists but is not a string.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return None
    if not isinstance(value, str):
        raise InvalidObject(path, f"expected a string, got {_describe(value)}")
    return value


def req_str(obj: Mapping[str, JSONValue], path: str) -> str:
    """Return the non-empty string at ``path``.

    Raises:
        InvalidObject: missing, null, empty or not a string.
    """
    value = opt_str(obj, path)
    if not value:
        raise InvalidObject(path, "required string is missing or empty")
    return value


def opt_int(obj: Mapping[str, JSONValue], path: str) -> int | None:
    """Return the integer at ``path`` (bools rejected) or ``None`` when absent.

    Raises:
        InvalidObject: the value exists but is not an integer.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidObject(path, f"expected an integer, got {_describe(value)}")
    return value


def opt_bool(obj: Mapping[str, JSONValue], path: str) -> bool | None:
    """Return the boolean at ``path`` or ``None`` when absent/null.

    Raises:
        InvalidObject: the value exists but is not a boolean.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return None
    if not isinstance(value, bool):
        raise InvalidObject(path, f"expected a boolean, got {_describe(value)}")
    return value


def opt_map(obj: Mapping[str, JSONValue], path: str) -> JSONObject:
    """Return the mapping at ``path`` (a new empty dict when absent/null).

    Raises:
        InvalidObject: the value exists but is not a mapping.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return {}
    if not isinstance(value, dict):
        raise InvalidObject(path, f"expected a mapping, got {_describe(value)}")
    return value


def opt_list(obj: Mapping[str, JSONValue], path: str) -> list[JSONValue]:
    """Return the list at ``path`` (a new empty list when absent/null).

    Raises:
        InvalidObject: the value exists but is not a list.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return []
    if not isinstance(value, list):
        raise InvalidObject(path, f"expected a list, got {_describe(value)}")
    return value


def maps_in(obj: Mapping[str, JSONValue], path: str) -> list[JSONObject]:
    """Return the list at ``path`` checking that every item is a mapping.

    Raises:
        InvalidObject: not a list, or an item (named ``path[i]``) is not a mapping.
    """
    items = opt_list(obj, path)
    out: list[JSONObject] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidObject(f"{path}[{i}]", f"expected a mapping, got {_describe(item)}")
        out.append(item)
    return out


def parse_k8s_time(value: str, path: str) -> datetime:
    """Parse a Kubernetes ``metav1.Time`` / ``MicroTime`` (RFC 3339) into an aware UTC datetime.

    A time without a zone is rejected rather than guessed.

    Raises:
        InvalidObject: not RFC 3339 or no zone.
    """
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as e:
        raise InvalidObject(path, f"not an RFC 3339 time: {_describe(value)}") from e
    if parsed.tzinfo is None:
        raise InvalidObject(path, f"time has no zone: {_describe(value)}")
    try:
        return parsed.astimezone(UTC)
    except OverflowError as e:
        raise InvalidObject(path, f"time out of range (years 1-9999 in UTC): {_describe(value)}") from e


def opt_time(obj: Mapping[str, JSONValue], path: str) -> datetime | None:
    """Return the RFC 3339 time at ``path`` as aware UTC, or ``None`` when absent.

    Raises:
        InvalidObject: present but not a string or not RFC 3339 with a zone.
    """
    value = opt_str(obj, path)
    return None if value is None else parse_k8s_time(value, path)
