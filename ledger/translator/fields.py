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


LONGEST_NAME_BYTES = 317
"""Longest string, in UTF-8 bytes, that :func:`opt_str` and :func:`req_str` return.

Kubernetes' longest identifier is a qualified name (a label or taint key: a 253-character DNS subdomain prefix,
``/``, a 63-character name); object names are at most 253 characters, namespaces, drivers and device names 63. The
strings read here are such identifiers (names, uids, drivers, pools, devices, nodes, requests, keys), and the ledger
keys on them: they end up in b-tree indexes (``events.stream``, ``translator_state.key``, the read models' device
and claim keys), whose rows PostgreSQL limits to about 2,700 bytes. A longer value (a hand-made object, a broken
client) made the whole append batch fail with ``index row size exceeds maximum`` (or its projection's batch), so
the good lines around it were never recorded; refused here, the one line is rejected with its field named. Three
such fields of 317 bytes make a device key under 1 KB."""


def opt_str(obj: Mapping[str, JSONValue], path: str) -> str | None:
    """Return the identifier string at ``path`` (at most :data:`LONGEST_NAME_BYTES` UTF-8 bytes) or ``None`` when
    absent/null. For a text that is no identifier (a time, a CEL expression), :func:`opt_text`.

    Raises:
        InvalidObject: the value exists but is not a string, or is longer than :data:`LONGEST_NAME_BYTES`.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return None
    if not isinstance(value, str):
        raise InvalidObject(path, f"expected a string, got {_describe(value)}")
    # The length first: one comparison for the names of every line (a keyword argument here cost ~60 % more a call,
    # and the translator reads a few dozen strings a line).
    if len(value) > 79 and _utf8_length(value) > LONGEST_NAME_BYTES:  # 79: LONGEST_NAME_BYTES // 4, see below
        raise InvalidObject(path, f"{_utf8_length(value)} bytes long; a Kubernetes name or key is at most "
                                  f"{LONGEST_NAME_BYTES} ({_describe(value)})")
    return value


assert LONGEST_NAME_BYTES // 4 == 79, "opt_str's literal: no string of at most 79 characters (4 bytes each) is too long"


def _utf8_length(value: str) -> int:
    """Length of ``value`` in UTF-8 bytes (a lone surrogate, which JSON may carry, counts its three bytes)."""
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))


def req_str(obj: Mapping[str, JSONValue], path: str) -> str:
    """Return the non-empty identifier string at ``path`` (see :func:`opt_str`).

    Raises:
        InvalidObject: missing, null, empty, not a string, or longer than :data:`LONGEST_NAME_BYTES`.
    """
    value = opt_str(obj, path)
    if not value:
        raise InvalidObject(path, "required string is missing or empty")
    return value


def opt_text(obj: Mapping[str, JSONValue], path: str) -> str | None:
    """Return the string at ``path``, of any length, or ``None`` when absent/null: a text that is no identifier (a
    time, which its parser checks; a CEL expression), never a key of the ledger.

    Raises:
        InvalidObject: the value exists but is not a string.
    """
    value = _walk(obj, path)
    if value is _MISSING:
        return None
    if not isinstance(value, str):
        raise InvalidObject(path, f"expected a string, got {_describe(value)}")
    return value


def req_text(obj: Mapping[str, JSONValue], path: str) -> str:
    """Return the non-empty string at ``path``, of any length (see :func:`opt_text`).

    Raises:
        InvalidObject: missing, null, empty or not a string.
    """
    value = opt_text(obj, path)
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
    value = opt_text(obj, path)  # any length: parse_k8s_time refuses what is no time
    return None if value is None else parse_k8s_time(value, path)
