"""The ``/v1`` guard that refuses query parameters an endpoint does not take, or takes once but got twice.

Litestar binds the parameters a handler declares and ignores the rest, so ``/v1/shared?from=...&to=...``
answered for *now* and ``?at=A&at=B`` silently used one of the two: a caller could not tell that part of
the question was dropped. Every such request is now a 400 problem that names the parameters.

The guard also checks the form of integer parameters before Litestar converts them: msgspec's conversion
read ``limit=1e3`` as 1000 and ``limit=10.0`` as 10. Only ASCII decimal digits are integers here (a 422),
and one outside the range the handler declares is refused here too, naming the largest and smallest accepted.

A second guard, :func:`no_nul_characters`, refuses a NUL character in any query value or path segment,
naming the parameter: PostgreSQL text cannot hold U+0000, so the database driver refused the query with
a message naming no parameter (``a parameter cannot be used: PostgreSQL text fields cannot contain NUL``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType, UnionType
from typing import Any, Literal, Union, get_args, get_origin
from urllib.parse import unquote

from litestar.connection import ASGIConnection
from litestar.exceptions import ValidationException
from litestar.handlers.base import BaseRouteHandler
from litestar.params import ParameterKwarg

from ledger.errors import Invalid, shorten, shorten_repr


def path_name(segment: str) -> str:
    """The name a path segment spells, its ``%2F`` turned back into ``/`` and its ``%25`` into ``%`` (the escapes
    ``api.app.LedgerApp`` leaves encoded; the segment holds no other).

    For the one path parameter whose Kubernetes name may hold a slash: a ResourceSlice pool (``spec.pool.name``,
    DNS subdomains joined by ``/``), sent as ``rack-1%2Flab-node``. Sent encoded twice (``rack-1%252Flab-node``), it
    names the pool ``rack-1%2Flab-node``, which no pool is.
    """
    return unquote(segment)


def client_name(field: Any, name: str) -> str:
    """The name a client sends for handler argument ``name`` whose signature field is ``field``.

    The alias declared on the handler (``QueryParameter(name=...)`` keeps it in ``name``;
    ``Parameter(query=...)`` / ``Parameter(header=...)``), else the argument's own name.
    """
    kwarg = getattr(field, "kwarg_definition", None)
    for alias in ("query", "header", "name"):
        if isinstance(value := getattr(kwarg, alias, None), str) and value:
            return value
    return name


@cache
def query_names(handler: BaseRouteHandler, path_parameters: frozenset[str] = frozenset()) -> frozenset[str]:
    """The query parameter names ``handler`` declares, as clients send them (aliases such as ``groupBy``).

    Source: the handler's signature, each ``QueryParameter(name=...)`` / ``Parameter(query=...)``, less its
    ``path_parameters``, the dependencies the app provides (``ctx``, ``access``) and header or cookie
    parameters. The OpenAPI document lists the same names (tested).
    """
    names: set[str] = set()
    provided = set(handler.resolve_dependencies()) | path_parameters
    for name, field in handler.parsed_fn_signature.parameters.items():
        kwarg = field.kwarg_definition
        if name not in provided and isinstance(kwarg, ParameterKwarg) and not kwarg.header and not kwarg.cookie:
            names.add(client_name(field, name))
    return frozenset(names)


@cache
def required_query_names(handler: BaseRouteHandler, path_parameters: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The query parameters ``handler`` requires, as clients send them (``from``, ``to``), in declaration order.

    Source: :func:`query_names`, less those with a default or that take ``None`` (``str | None``): Litestar's
    own rule for a required parameter (``ParameterDefinition.is_required``), which reports only the first
    missing one it meets, in no fixed order.
    """
    names = query_names(handler, path_parameters)
    required: list[str] = []
    for name, field in handler.parsed_fn_signature.parameters.items():
        if ((sent := client_name(field, name)) in names and field.is_required and not field.is_optional
                and not field.is_any and (not field.has_default or field.default is None)):
            required.append(sent)
    return tuple(required)


INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
"""The form of an integer query parameter: ASCII decimal digits after an optional ``-``, so that a negative
or huge value is refused by the parameter's range, naming the bound (Litestar reads any length). Not ``+``,
an exponent (``1e3``), a fraction (``10.0``), ``_`` (``1_800``), spaces or other scripts' digits (``１０``),
nor a leading zero (``010``): Litestar's reader refuses that with its own words (``Expected `int`, got
`str```), so it is refused here with the form expected, and no one wonders whether ``010`` is octal."""


def _is_integer(annotation: object) -> bool:
    """Whether a handler argument's annotation is ``int`` or ``int | None``."""
    if annotation is int:
        return True
    return get_origin(annotation) in (Union, UnionType) and int in get_args(annotation)


LONGEST_INTEGER = 100
"""Most characters of an integer query value read as a number; longer ones are out of every range (a bound is
a PostgreSQL bigint at most, 19 digits)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IntegerRange:
    """The whole numbers an integer query parameter takes: ``smallest`` to ``largest``, both included
    (``None``: unbounded on that side)."""

    smallest: int | None
    largest: int | None

    def refusal(self, name: str, sent: str) -> str | None:
        """Why parameter ``name`` cannot take the whole number ``sent`` (in :data:`INTEGER` form), naming the
        bounds (``sent`` echoed through :func:`ledger.errors.shorten`), or ``None`` when it can."""
        # int() refuses more than sys.get_int_max_str_digits() digits (4300 by default, a ValueError: a 500);
        # every bound declared here is a bigint (19 digits), so a longer number is beyond it on its side.
        value = int(sent) if len(sent) <= LONGEST_INTEGER else (-1 if sent.startswith("-") else 1) * 10**LONGEST_INTEGER
        if (self.smallest is None or value >= self.smallest) and (self.largest is None or value <= self.largest):
            return None
        bounds = [f"the largest accepted is {self.largest}"] if self.largest is not None else []
        if self.smallest is not None:
            bounds.append(f"the smallest {self.smallest}" if bounds else f"the smallest accepted is {self.smallest}")
        return f"{name}: {shorten_repr(sent)} is out of range; {', '.join(bounds)}"


def _bound(kwarg: object, inclusive: str, exclusive: str, step: int) -> int | None:
    """The inclusive bound of an integer parameter declared with ``ge``/``le`` (``inclusive``) or
    ``gt``/``lt`` (``exclusive``, moved one ``step`` inwards); ``None`` when it has none."""
    if isinstance(value := getattr(kwarg, inclusive, None), int | float):
        return math.ceil(value) if step > 0 else math.floor(value)
    if isinstance(value := getattr(kwarg, exclusive, None), int | float):
        return math.floor(value) + 1 if step > 0 else math.ceil(value) - 1
    return None


@cache
def integer_ranges(handler: BaseRouteHandler,
                   path_parameters: frozenset[str] = frozenset()) -> MappingProxyType[str, IntegerRange]:
    """The query parameters of ``handler`` that take an integer, as clients spell them (``afterPosition``),
    each with the range it declares.

    Source: :func:`query_names`, the annotation of each handler argument (``int`` or ``int | None``) and
    its ``QueryParameter(ge=, le=, gt=, lt=)``.
    """
    names = query_names(handler, path_parameters)
    ranges: dict[str, IntegerRange] = {}
    for name, field in handler.parsed_fn_signature.parameters.items():
        if (sent := client_name(field, name)) in names and _is_integer(field.annotation):
            kwarg = field.kwarg_definition
            ranges[sent] = IntegerRange(smallest=_bound(kwarg, "ge", "gt", 1), largest=_bound(kwarg, "le", "lt", -1))
    return MappingProxyType(ranges)


def literal_strings(annotation: object) -> list[str]:
    """The string values of a ``Literal``, also inside an optional one (``Literal["a", "b"] | None``)."""
    if get_origin(annotation) is Literal:
        return [v for v in get_args(annotation) if isinstance(v, str)]
    if get_origin(annotation) in (Union, UnionType):
        return [v for member in get_args(annotation) for v in literal_strings(member)]
    return []


@cache
def literal_choices(handler: BaseRouteHandler,
                    path_parameters: frozenset[str] = frozenset()) -> MappingProxyType[str, tuple[str, ...]]:
    """The query parameters of ``handler`` that take one of a fixed set of words (``state``, ``origin``,
    ``groupBy``), as clients spell them, each with its words in declaration order.

    Source: :func:`query_names` and each handler argument's annotation (a ``Literal`` of strings, optional or not).
    """
    names = query_names(handler, path_parameters)
    choices: dict[str, tuple[str, ...]] = {}
    for name, field in handler.parsed_fn_signature.parameters.items():
        if (sent := client_name(field, name)) in names and (words := literal_strings(field.annotation)):
            choices[sent] = tuple(words)
    return MappingProxyType(choices)


def known_query_parameters(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """Litestar guard on ``/v1``: every query parameter is one the endpoint takes, each given once.

    ``OPTIONS`` is let through whatever its query: a CORS preflight is sent for the URL the real request
    will use, query included, and Litestar answers it from the route's methods, never reading the query.

    Every name taken from the request is echoed through :func:`echo_names` (each at most
    :data:`ledger.errors.MAX_ECHO_CHARS` characters, at most :data:`MAX_ECHO_NAMES` of them), so a problem body stays
    small whatever the query string holds.

    Raises:
        ValidationException: (400 problem details) an unknown parameter, naming the ones the endpoint
            takes, or a repeated one.
        Invalid: (422) a parameter given with an empty value (``?node=``): no parameter takes the empty
            string, and a filter left empty matched nothing while ``cluster=`` and ``at=`` were refused; a name
            filter given only blanks (``?node=%20``, :data:`NAME_FILTERS`), which no recorded name is;
            one of a fixed set of words given another (``state``, ``origin``: :func:`literal_choices`), ``null``
            included;
            or an integer parameter (``limit``, ``afterPosition``) whose value is not :data:`INTEGER`
            (Litestar's own conversion, msgspec, also reads ``1e3`` and ``10.0`` as integers), or is outside
            the range the handler declares (:class:`IntegerRange`: ``limit=0``, ``afterPosition=-1``,
            ``afterPosition=9223372036854775808``), naming the largest and smallest values accepted.
            Litestar's checks of the same range follow but never refuse: msgspec's words
            (``Expected `int` <= 4611686018427387904``) named its bound without saying it was the largest.
    """
    if connection.scope.get("method") == "OPTIONS":
        return
    # The route's own handler, not ``handler``: Litestar hands each guard a fresh copy of it every request, and
    # the caches below, keyed by the handler, then missed every time and kept each copy for good (~2.5 KB a
    # request). The route's handler is one object for the app's lifetime.
    handler = connection.route_handler
    allowed = query_names(handler, frozenset(connection.path_params))
    given = connection.query_params
    unknown = sorted(set(given) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "no query parameters"
        noun = "parameter" if len(unknown) == 1 else "parameters"
        raise ValidationException(f"unknown query {noun} {echo_names(unknown)}: this endpoint takes {takes}")
    repeated = sorted(name for name in set(given) if len(given.getall(name)) > 1)
    if repeated:
        noun = "parameter" if len(repeated) == 1 else "parameters"
        raise ValidationException(f"query {noun} {echo_names(repeated)} given more than once; give each once")
    empty = sorted(name for name in given if given[name] == "")
    if empty:
        name = empty[0]
        if name in required_query_names(handler, frozenset(connection.path_params)):
            raise Invalid(f"{shorten(name)}: empty; this parameter is required, give it a value")
        raise Invalid(f"{shorten(name)}: empty; leave the parameter out {EMPTY_HINTS.get(name, 'for its default')}")
    blank = sorted(name for name in given if name in NAME_FILTERS and not given[name].strip())
    if blank:
        name = blank[0]
        raise Invalid(f"{shorten(name)}: only blanks, which no name holds; leave the parameter out "
                      f"{EMPTY_HINTS.get(name, 'for its default')}")
    # Checked here, not by Litestar: it reads `origin=null` as no origin (an optional Literal takes None), so the
    # filter was dropped; every other word outside the set it refused with these words.
    choices = literal_choices(handler, frozenset(connection.path_params))
    for name in sorted(set(choices) & set(given)):
        if (value := given[name]) not in choices[name]:
            raise Invalid(f"{name}: Invalid enum value '{shorten(value)}' (one of: {', '.join(choices[name])})")
    ranges = integer_ranges(handler, frozenset(connection.path_params))
    for name in sorted(set(ranges) & set(given)):
        if not INTEGER.fullmatch(value := given[name]):
            raise Invalid(f"{name}: expected a whole number in ASCII decimal digits without leading zeros (e.g. 100), "
                          f"got {shorten_repr(value)}")
        if (refusal := ranges[name].refusal(name, value)) is not None:
            raise Invalid(refusal)


def no_nul_characters(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Litestar guard on ``/v1`` (after :func:`known_query_parameters`): no value holds a NUL character.

    Source: the request's path parameters (named as in the route's path, e.g. ``namespace`` in
    ``/v1/claims/{namespace}/{name}/history``), then its query parameters, each in name order. ``OPTIONS``
    is let through, as by :func:`known_query_parameters`.

    Raises:
        Invalid: (422) a value holding U+0000 (``?team=a%00b``, ``/v1/claims/a%00b/x/history``), naming the
            first such parameter and echoing its value through :func:`ledger.errors.shorten`. No recorded
            name holds one (PostgreSQL text cannot), and no time, duration, number or token does either.
    """
    if connection.scope.get("method") == "OPTIONS":
        return
    path = connection.path_params
    query = connection.query_params
    values = [(name, str(path[name])) for name in sorted(path)] + [(name, query[name]) for name in sorted(query)]
    for name, value in values:
        if "\x00" in value:
            raise Invalid(f"{shorten(name)}: {shorten_repr(value)} holds a NUL character (\\u0000), which no "
                          "parameter takes (PostgreSQL text cannot hold it, so no recorded name does)")


MAX_ECHO_NAMES = 10
"""Most parameter names one problem body lists; the rest are counted (``... and 990 more``)."""


def echo_names(names: Sequence[str]) -> str:
    """``names`` joined with ``", "`` for a problem detail, each through :func:`shorten` (an empty name, as in
    ``?=x``, shown as ``""``), at most :data:`MAX_ECHO_NAMES` of them followed by ``... and N more`` (order kept)."""
    shown = ", ".join(shorten(name) if name else '""' for name in names[:MAX_ECHO_NAMES])
    rest = len(names) - MAX_ECHO_NAMES
    return f"{shown} ... and {rest} more" if rest > 0 else shown


EMPTY_HINTS = {"cluster": "to ask about every cluster", "namespace": "for every namespace", "team": "for every team",
               "node": "for every node", "driver": "for every driver", "pool": "for every pool",
               "stream": "for every stream", "type": "for every event type"}
"""What leaving a filter out means, for the message refusing it empty (:func:`known_query_parameters`)."""

NAME_FILTERS = frozenset(EMPTY_HINTS) - {"cluster"}
"""Filters by a recorded name, refused when given only blanks: no Kubernetes name holds one. Not ``cluster``: a
cluster name padded with blanks, recorded before such names were refused, is still asked for by its name. Times,
numbers, tokens and words of a fixed set are refused by their own checks, which say what they take."""
