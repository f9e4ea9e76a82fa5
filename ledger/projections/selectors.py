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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import cel

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


def selects(expressions: Sequence[str], device: DeviceView) -> bool:
    """Return whether every expression selects ``device`` (selectors are ANDed, as in Kubernetes)."""
    if not expressions:
        return True
    context = _context(device)  # built once for all the expressions
    return all(_evaluate(e, context) for e in expressions)
