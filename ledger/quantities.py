"""The one helper that turns Kubernetes resource quantities into numbers.

Quantities travel through the ledger as canonical strings (``"80Gi"``, ``"100"``, ``"500m"``); only
arithmetic (Kueue-style counter and capacity charges, consumed-capacity splits, CEL comparisons)
needs their value, and it asks here. Parsing follows ``k8s.io/apimachinery/pkg/api/resource``:
binary suffixes ``Ki..Ei``, decimal suffixes ``n u m k M G T P E`` and decimal exponents ``1e3``.
"""

from __future__ import annotations

import re
from decimal import Decimal

from ledger.errors import Invalid

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?")
"""Kubernetes' Quantity grammar (``resource.Quantity``), matched whole (``fullmatch``): ASCII digits only (``\\d``
would take ``١``, an Arabic-Indic one), and no blank around it (``" 1"`` and ``"1Ki "`` are no quantity; the API
server never sends one)."""


def parse_quantity(value: str | int | float) -> Decimal:
    """Return the exact value of a Kubernetes quantity.

    Args:
        value: a quantity string such as ``"40Gi"`` (bytes), ``"500m"`` or ``"1e3"``; ints and floats
            are taken as they are (YAML may have turned ``"8"`` into ``8``).

    Returns:
        The value in the quantity's base unit (bytes for memory, cores for cpu, a count otherwise).

    Raises:
        Invalid: the text is not a Kubernetes quantity.
    """
    if isinstance(value, bool):
        raise Invalid(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise Invalid(f"not a quantity: {value!r}")
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
        if exponent:
            return base * (Decimal(10) ** int(exponent[1:]))
    except (ArithmeticError, ValueError) as e:  # InvalidOperation, and Overflow for "1e9999999"
        raise Invalid(f"not a quantity: {value!r}") from e
    return base * _SUFFIXES[suffix or ""]


def quantity_value(value: object) -> Decimal | None:
    """Like :func:`parse_quantity` for untrusted JSON: ``None`` for anything that is not a quantity.

    Accepts the ResourceSlice shapes ``{"value": "40Gi"}`` (capacity and counters) as well.
    """
    if isinstance(value, dict):
        value = value.get("value")
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    try:
        return parse_quantity(value)
    except Invalid:
        return None


def as_number(value: Decimal) -> int | float:
    """Return ``value`` as an ``int`` when it is integral, else a ``float`` (for JSON bodies)."""
    return int(value) if value == value.to_integral_value() else float(value)
