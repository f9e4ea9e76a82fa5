"""CEL device selectors, evaluated the way the Kubernetes scheduler does (DESIGN §11.10).

DeviceClass ``spec.selectors[].cel.expression`` and request ``exactly.selectors`` decide which
devices a class or a request can take. Pending demand ("requested 4, 2 free") and Kueue counter
sources need that answer for devices recorded in ``device_inventory``. An expression that fails to
compile or to evaluate (a missing attribute, a type mismatch) means "does not match", as in
Kubernetes: it never raises.

The device is exposed as in ``resource.k8s.io``: ``device.driver``, ``device.attributes[domain].name``
(unqualified attribute names belong to the driver's domain), ``device.capacity[domain].name`` and
``device.allowMultipleAllocations``. Capacities are numbers (parsed quantities); ``quantity("40Gi")``
and the Quantity methods ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``asInteger`` and
``asApproximateFloat`` work on them. ``version`` attributes are strings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import cel
import msgspec

from ledger.quantities import as_number, parse_quantity, quantity_value
from ledger.types import JSONValue

_NO_MATCH = "no-match"
"""Prefix of the marker cached for an expression that does not compile."""


def _quantity(text: object) -> int | float:
    if not isinstance(text, str):
        raise TypeError("quantity() takes a string")
    return as_number(parse_quantity(text))


def _compare(a: object, b: object) -> int:
    if not isinstance(a, int | float) or not isinstance(b, int | float):
        raise TypeError("compareTo() takes quantities")
    return (a > b) - (a < b)


FUNCTIONS: Mapping[str, Callable[..., object]] = {
    "quantity": _quantity,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "asInteger": lambda a: int(a),
    "asApproximateFloat": lambda a: float(a),
}
"""Kubernetes CEL library functions the ledger provides (Quantity as a plain number)."""


@lru_cache(maxsize=1024)
def _program(expression: str) -> cel.Program | str:
    try:
        return cel.compile(expression)
    except (ValueError, RuntimeError, TypeError) as e:  # the library reports syntax errors as ValueError
        return f"{_NO_MATCH}: {e}"


def _typed(value: JSONValue) -> JSONValue:
    """Unwrap a ResourceSlice attribute ``{"int": 7}`` / ``{"string": "x"}`` / ``{"bool": true}``."""
    if isinstance(value, dict):
        for key in ("int", "bool", "string", "version"):
            if key in value:
                return value[key]
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceView:
    """A device as CEL sees it, built from a ``device_inventory`` row."""

    driver: str
    attributes: Mapping[str, JSONValue] = field(default_factory=dict)
    """``spec.devices[].attributes`` as published (qualified or unqualified names, typed values)."""
    capacity: Mapping[str, JSONValue] = field(default_factory=dict)
    """``spec.devices[].capacity`` as published (``{"memory": {"value": "80Gi"}}``)."""
    allow_multiple_allocations: bool = False

    def variable(self) -> dict[str, object]:
        """Return the CEL ``device`` variable."""
        attributes: dict[str, dict[str, object]] = {}
        for name, value in self.attributes.items():
            domain, _, short = name.rpartition("/")
            attributes.setdefault(domain or self.driver, {})[short] = _typed(value)
        capacity: dict[str, dict[str, object]] = {}
        for name, value in self.capacity.items():
            domain, _, short = name.rpartition("/")
            number = quantity_value(value)
            if number is not None:
                capacity.setdefault(domain or self.driver, {})[short] = as_number(number)
        return {"driver": self.driver, "attributes": attributes, "capacity": capacity,
                "allowMultipleAllocations": self.allow_multiple_allocations}


def _context(device: DeviceView) -> cel.Context:
    return cel.Context(variables={"device": device.variable()}, functions=dict(FUNCTIONS))


def _evaluate(expression: str, context: cel.Context) -> bool:
    program = _program(expression)
    if isinstance(program, str):
        return False
    try:
        result: object = program.execute(context)
    except (KeyError, ValueError, RuntimeError, TypeError, IndexError, ArithmeticError):
        return False
    return result is True


def matches(expression: str, device: DeviceView) -> bool:
    """Return whether one CEL selector expression selects ``device``.

    Returns:
        ``True`` only when the expression evaluates to boolean true; a compile error, an evaluation
        error (missing attribute or domain, wrong type) or a non-boolean result is ``False``.
    """
    return _evaluate(expression, _context(device))


def expressions_of(selectors: Sequence[JSONValue] | JSONValue) -> list[str]:
    """Return the CEL expressions of a ``selectors`` list (``[{"cel": {"expression": ...}}]``).

    A selector that is not a CEL selector yields an expression that never matches (unknown selector
    kinds must not widen a class).
    """
    out: list[str] = []
    if not isinstance(selectors, list):
        return out
    for selector in selectors:
        expr = selector.get("cel") if isinstance(selector, dict) else None
        text = expr.get("expression") if isinstance(expr, dict) else None
        out.append(text if isinstance(text, str) else "false")
    return out


SELECTIONS_MAX = 262_144
"""Most answers :func:`selects` keeps (under 100 bytes each, so ~25 MB when full: the answers for 40,000 devices
under six sets of selectors); when full, it forgets them all and starts again."""

_selections: dict[tuple[str, ...], dict[bytes, bool]] = {}
"""expressions -> (:func:`content_digest` of a device -> selected): :func:`selects`'s answers, for the life of the
process."""
_kept = 0
"""How many answers ``_selections`` holds."""


def content_digest(device: DeviceView) -> bytes:
    """A 16-byte BLAKE2b digest of everything CEL sees of ``device`` (driver, attributes, capacity,
    ``allowMultipleAllocations``): equal for equal devices, different (but for a 2**-128 chance) otherwise. Two
    devices whose attributes list the same names in another order get different digests.

    MessagePack, not JSON, is hashed: JSON writes ``inf``, ``-inf`` and ``nan`` all as ``null``, so two devices
    differing only in such a value would share a digest and an answer; MessagePack keeps every float's 64 bits
    (and tells ``1`` from ``1.0``, a string from bytes)."""
    encoded = msgspec.msgpack.encode([device.driver, device.attributes, device.capacity,
                                      device.allow_multiple_allocations])
    return hashlib.blake2b(encoded, digest_size=16).digest()


def selects(expressions: Sequence[str], device: DeviceView) -> bool:
    """Return whether every expression selects ``device`` (selectors are ANDed, as in Kubernetes).

    Answers are kept per device content and expressions (:data:`SELECTIONS_MAX` at most): building the CEL
    ``device`` variable costs 20-30 µs a device (the library converts it whole), while the devices published at
    one instant are nearly all published at the next, so a second ``/v1/pending`` or ``/v1/quotas`` at another
    instant decides most devices from what the first one found. A CEL answer depends only on the expression and
    the device, so a kept answer is the answer.
    """
    global _kept
    if not expressions:
        return True
    digest, wanted = content_digest(device), tuple(expressions)
    answers = _selections.get(wanted)
    selected = None if answers is None else answers.get(digest)
    if selected is None:
        context = _context(device)  # built once for all the expressions
        selected = all(_evaluate(e, context) for e in expressions)
        if _kept >= SELECTIONS_MAX:
            _selections.clear()  # the answers of a much larger inventory than any one instant holds
            _kept, answers = 0, None
        if answers is None:
            answers = _selections.setdefault(wanted, {})
        answers[digest] = selected
        _kept += 1
    return selected
