"""Read recorded watch histories and kubectl output as one uniform stream of watch lines.

Replay (DESIGN §9) must hand the translator the same ``(type, object)`` pairs a live watch gives,
whatever the input file is:

1. a recorded history: JSON Lines ``{"observedAt": "<RFC 3339>", "type": ..., "object": {...}}``;
2. ``kubectl get ... -o json --watch --output-watch-events`` output: pretty-printed
   ``{"type": ..., "object": {...}}`` documents one after the other;
3. ``kubectl get -o yaml|json`` output: a ``List`` / ``XxxList`` or a single object, in JSON or in
   (multi-document) YAML; each object becomes an ``ADDED`` line.

The format is told from the content, never from the file name. These files come from people and
clusters, so reading never raises on bad content: a line or document that cannot be read becomes a
:class:`BrokenLine` and reading goes on with the next one. This module only parses: no database,
no network, and no check of an object beyond the watch envelope (``type``, ``object``,
``observedAt``) and, for Lists and YAML/JSON objects, a string ``kind``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import MAX_EMAX, MIN_EMIN, ROUND_HALF_UP, Decimal, localcontext
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, Literal, TypeAlias, cast, get_args

import msgspec
import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ledger.errors import Invalid, shorten_repr
from ledger.types import JSONObject, JSONValue

__all__ = [
    "MAX_DEPTH",
    "MAX_TEXT_CHARS",
    "WATCH_TYPES",
    "BrokenLine",
    "WatchLine",
    "WatchType",
    "broken_watch_line",
    "envelope_problem",
    "error_status_problem",
    "json_problem",
    "parse_time",
    "read_history",
    "read_text",
    "watch_line",
]

WatchType: TypeAlias = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
"""Watch event types that can be replayed (``ERROR`` events are reported as :class:`BrokenLine`)."""

WATCH_TYPES: Final[frozenset[str]] = frozenset(get_args(WatchType))
"""The values of :data:`WatchType`, for membership tests on decoded text."""

MAX_TEXT_CHARS: Final = 4096
"""Longest ``BrokenLine.text`` kept, in characters: enough to see the problem, bounded in memory."""

MAX_DEPTH: Final = 100
"""Deepest nesting of objects and arrays accepted in a Kubernetes object (real ones stay under ~20).

Deeper objects are rejected as broken lines: the ledger reads stored JSON back with recursive decoders,
and an object nested near Python's recursion limit would be stored fine and then break every reader."""

_PROBE_LINES: Final = 10
"""Non-blank lines looked at to recognise JSON Lines: a file is JSON Lines when one of them alone is a watch
event. More than one so that damaged first lines (text pasted above the events, a line cut short, bytes that
are not UTF-8) are reported as broken lines instead of turning the whole file into one bad YAML document."""

_YAML_NODE_BUDGET: Final = 2_000_000
"""Most values one YAML document may expand to: stops alias bombs ("billion laughs")."""


class WatchLine(msgspec.Struct, frozen=True, kw_only=True):
    """One watch event read from a file, in file order.

    Source: one recorded line, one ``kubectl --output-watch-events`` document, or one object /
    List item of ``kubectl get`` output (then ``type`` is always ``ADDED``).
    """

    source: str
    """File path as given to :func:`read_history`, ``"<stdin>"``, or the ``source`` of :func:`read_text`."""
    line: int
    """1-based line where the event (or the List item) starts in the file."""
    observed_at: datetime | None
    """Receive time, tz-aware UTC: the line's ``observedAt``, else the ``at`` argument, else None."""
    type: WatchType
    object: JSONObject
    """The Kubernetes object as decoded: only str/int/float/bool/None/list/dict values."""
    digest: str
    """Hex SHA-256 of the canonical JSON of ``[type, observed_at ISO 8601 or "", object]`` (keys sorted).

    It depends on content only: the same event read from any file, in any format or formatting,
    has the same digest; any change of type, instant or object changes it.
    """
    object_json: bytes
    """``object`` as JSON text (UTF-8, keys sorted): the object's part of the digest input, cut out of it.

    The ledger stores it as the observation's ``body`` (``jsonb``, which orders keys its own way), so an
    ingest encodes each object once, for the digest, instead of twice."""
    holds_nul: bool = False
    """Whether a key or string of ``object`` holds U+0000, which ``jsonb`` and ``text`` columns refuse.

    Read off the digest's canonical JSON (a NUL is always written ``\\u0000`` there), so finding it
    costs no second encoding of the object.
    """


class BrokenLine(msgspec.Struct, frozen=True, kw_only=True):
    """A line or document that could not be read; reading went on after it."""

    source: str
    """As in :attr:`WatchLine.source`."""
    line: int
    """1-based line where the broken line, document or List item starts."""
    reason: str
    """Human-readable cause, e.g. ``invalid JSON: Expecting ',' delimiter (column 17)``."""
    text: str
    """The offending raw text, cut to :data:`MAX_TEXT_CHARS` characters."""
    digest: str
    """Hex SHA-256 of the whole raw text (its bytes when they are not UTF-8): independent of ``source``."""
    observed_at: datetime | None = None
    """Receive time (tz-aware UTC) of a line of a live watch stream (:func:`broken_watch_line`); ``None``
    for a line read from a file, whose ``observedAt`` is part of what could not be read."""


ReadResult: TypeAlias = WatchLine | BrokenLine


# --------------------------------------------------------------------------------------------------
# Time


_RFC3339: Final = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)


_CALENDAR_UNITS: Final = re.compile(r"^-?P[^T]*[YM]")
"""An ISO 8601 duration with years or months (P1M, P1Y2D): calendar units, not a fixed length."""

_NUMBER = r"[0-9]+(?:[.,][0-9]+)?"
_ISO_DURATION: Final = re.compile(rf"^-?P(?=[0-9T])(?:(?P<W>{_NUMBER})W)?(?:(?P<D>{_NUMBER})D)?"
                                  rf"(?:T(?=[0-9])(?:(?P<H>{_NUMBER})H)?(?:(?P<M>{_NUMBER})M)?(?:(?P<S>{_NUMBER})S)?)?\Z")
"""The ISO 8601 duration shape: weeks, days, then T hours, minutes, seconds, each at most once, in order
(pydantic's parser alone also takes ``PT1H1H``, adding the two). Groups are named by unit. Digits are ASCII
``0-9`` only (``\\d`` would also take ``１`` and other Unicode digits)."""
_SECONDS: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
"""A number of seconds: ASCII decimal digits, an optional fraction after a ``.``, an optional ``-`` (refused
later as out of range, with the range in the message, unless it rounds to 0 microseconds). Not what ``float()``
also takes: an exponent (``1e3``), ``_`` between digits (``1_800``), other scripts' digits (``１８００``), spaces,
``+``, ``inf``, ``nan``."""

_UNIT_SECONDS: Final = {"W": 604_800, "D": 86_400, "H": 3_600, "M": 60, "S": 1}
_MICROSECOND: Final = timedelta(microseconds=1)

MAX_DURATION: Final = timedelta(days=36_500)
"""Longest duration :func:`parse_duration` accepts (100 years, ``P36500D``): longer is a typo, and past
999,999,999 days ``timedelta`` itself overflows."""


def _whole_microseconds(terms: Sequence[tuple[str, int]], *, negative: bool) -> Decimal:
    """The exact length of ``terms`` (ASCII decimal numbers, each with its unit's length in seconds), rounded
    to whole microseconds, half a microsecond away from zero (``0.0000005`` is 1, ``0.0000004`` is 0).

    Exact: the precision covers every digit given, so no float (``3153600000.0000004`` read as
    ``3153600000.000000477``) and no parser cutting a long fraction decides the rounding. A ``Decimal``
    integral value, not an ``int``: a huge one is compared with the range before any conversion.
    """
    # Digits of a product <= digits given + 6 (a week is 604,800 s); the sum of at most five terms adds one. The
    # widest exponents, so that no number of digits overflows (decimal.Overflow past 999,999 digits by default).
    with localcontext(prec=sum(len(number) for number, _ in terms) + 16, rounding=ROUND_HALF_UP, Emax=MAX_EMAX,
                      Emin=MIN_EMIN):
        seconds = sum((Decimal(number) * unit for number, unit in terms), Decimal(0))
        micros = (seconds * 1_000_000).to_integral_value()
    return -micros if negative else micros


SHORTEST_STEP: Final = timedelta(microseconds=1)
"""Shortest bucket of a stepped usage query (``step``, ``--step``): a ``timedelta`` counts whole microseconds,
so one is the smallest positive duration, and a step must be positive."""


def seconds_text(length: timedelta) -> str:
    """``length`` in seconds as plain decimals, exact to the microsecond, for messages: ``1.08``, ``31536000``,
    ``0.000001`` (never ``3.1536e+07``, as ``:g`` writes a year, nor a float's rounding of a long span)."""
    whole, micros = divmod(length // timedelta(microseconds=1), 1_000_000)
    return f"{whole}.{micros:06d}".rstrip("0").rstrip(".")


def _spell_shortest(shortest: timedelta) -> str:
    """The lower bound of a duration as the range message gives it: ``0``, or e.g. ``PT0.000001S (0.000001
    seconds; durations are counted in whole microseconds)``."""
    if not shortest:
        return "0"
    seconds = seconds_text(shortest)
    return f"PT{seconds}S ({seconds} seconds; durations are counted in whole microseconds)"


def parse_duration(value: str, name: str, *, shortest: timedelta = timedelta(0)) -> timedelta:
    """Parse an ISO 8601 duration (``PT30M``, ``P1DT2H``) or a number of seconds (``1800``, ``0.5``).

    Both forms take ASCII digits only (:data:`_SECONDS`, :data:`_ISO_DURATION`): ``1e3``, ``1_800`` and
    ``１８００`` are refused, not read as 1000 or 1800 seconds.

    The value is computed exactly from its digits and rounded to whole microseconds (half a microsecond away
    from zero), and only then checked against the range, in either form: ``P36500DT0.0000001S`` and
    ``3153600000.0000004`` are both 100 years, ``3153600000.0000005`` is out of range, and ``-0.0000004`` is 0.

    Args:
        value: the text given.
        name: the parameter or option it came from, for the error message.
        shortest: the shortest duration accepted (0; :data:`SHORTEST_STEP` for a step). The value is read
            to the microsecond first, so ``0.0000001`` (read as 0) is below a ``shortest`` of one microsecond.

    Returns:
        A ``timedelta`` from ``shortest`` to :data:`MAX_DURATION` (100 years) inclusive, in whole microseconds
        (a finer fraction is rounded to the nearest, half a microsecond up).

    Raises:
        Invalid: neither form (``PT1H1H`` and ``1e3`` included, or a fraction before the last unit), years or
            months (no fixed length), or out of range once rounded: shorter than ``shortest`` (negative, or under
            one microsecond for a step) or longer than 100 years (the message gives both bounds, ``P36500D``).
    """
    if _CALENDAR_UNITS.match(value):
        raise Invalid(f"{name}: months and years have no fixed length; give days or less (P30D, PT1H), "
                      f"got {shorten_repr(value)}")
    bad = Invalid(f"{name}: expected an ISO 8601 duration (PT30M) or seconds in ASCII decimal digits (1800, 0.5), "
                  f"got {shorten_repr(value)}")
    out_of_range = Invalid(f"{name}: {shorten_repr(value)} is out of range; the longest duration accepted is P36500D "
                           f"(100 years, {int(MAX_DURATION.total_seconds())} seconds), the shortest "
                           f"{_spell_shortest(shortest)}")
    if _SECONDS.fullmatch(value):
        terms = [(value.removeprefix("-"), 1)]
    elif (match := _ISO_DURATION.match(value)) is not None:
        terms = [(number.replace(",", "."), _UNIT_SECONDS[unit])
                 for unit, number in match.groupdict().items() if number is not None]
        if any("." in number for number, _ in terms[:-1]):
            raise bad  # ISO 8601 allows a fraction in the smallest unit given only (P1.5W1D)
    else:
        raise bad
    # Rounded first, then checked: the range is of whole microseconds, as the value returned.
    micros = _whole_microseconds(terms, negative=value.startswith("-"))
    if not shortest // _MICROSECOND <= micros <= MAX_DURATION // _MICROSECOND:
        raise out_of_range
    return timedelta(microseconds=int(micros))


TIME_LIMIT: Final = datetime(9999, 1, 1, tzinfo=UTC)
"""First instant past the times a query accepts (exclusive): year 9999 is refused, so that a window or a page
token built on an accepted time never passes ``datetime.max``."""
LATEST_TIME: Final = TIME_LIMIT - timedelta(microseconds=1)
"""The latest time accepted (a query's, a recorded line's, a simulated line's)."""
LATEST_TIME_TEXT: Final = LATEST_TIME.isoformat().replace("+00:00", "Z")
""":data:`LATEST_TIME` as messages name it (``9998-12-31T23:59:59.999999Z``)."""


class PastYear9999(Invalid):
    """A valid RFC 3339 time whose instant in UTC is after year 9999 (``9999-12-31T23:00:00-05:00``), which
    ``datetime`` cannot hold."""


def parse_query_time(value: str) -> datetime:
    """Parse a time a query gives (``--at``, ``?at=``, window ends): :func:`parse_time`, before :data:`TIME_LIMIT`.

    The one parser of query times for the CLI and the API, so both take the same times. Times read from
    recorded histories (``observedAt``) use :func:`parse_time` alone.

    Raises:
        Invalid: as :func:`parse_time`; or the time is at or past :data:`TIME_LIMIT` (the message names the
            latest time accepted, and echoes the value at most 100 characters long).
    """
    parsed = _before_time_limit(value)
    if parsed is None:
        raise Invalid(f"{shorten_repr(value)} is too far in the future; the latest time accepted is "
                      f"{LATEST_TIME_TEXT}")
    return parsed


def _before_time_limit(value: str) -> datetime | None:
    """:func:`parse_time`, or ``None`` for a time at or past :data:`TIME_LIMIT`: one past year 9999 in UTC
    (:class:`PastYear9999`) too, so that every time past the limit gets the same refusal.

    Raises:
        Invalid: as :func:`parse_time`, but for :class:`PastYear9999`.
    """
    try:
        parsed = parse_time(value)
    except PastYear9999:
        return None
    return parsed if parsed < TIME_LIMIT else None


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 timestamp that carries a zone.

    Accepts ``Z`` (or ``z``) or a ``±hh:mm`` offset, ``T``/``t``/space between date and time, and
    any number of fraction digits; digits beyond microseconds are truncated (Kubernetes writes up
    to nanoseconds). Leap seconds (``:60``) are rejected.

    Args:
        value: e.g. ``"2026-11-02T09:00:00.123456Z"`` or ``"2026-11-02T10:00:00+01:00"``.

    Returns:
        The same instant as a tz-aware datetime in UTC.

    Raises:
        PastYear9999: the instant is after year 9999 in UTC (an :class:`Invalid`).
        Invalid: no zone, not a string, out-of-range fields, before year 1 in UTC, or not a timestamp at all.
    """
    match = _RFC3339.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise Invalid(f"not an RFC 3339 time with a zone: {shorten_repr(value)}")
    year, month, day, hour, minute, second, fraction, sign, off_h, off_m = match.groups()
    zone = UTC
    if sign is not None:
        if int(off_h) > 23 or int(off_m) > 59:
            raise Invalid(f"not an RFC 3339 time with a zone: {shorten_repr(value)} (bad offset)")
        offset = timedelta(hours=int(off_h), minutes=int(off_m))
        zone = timezone(-offset if sign == "-" else offset)
    micros = int((fraction or "")[:6].ljust(6, "0"))
    try:
        parsed = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micros, tzinfo=zone)
    except ValueError as e:
        raise Invalid(f"not an RFC 3339 time with a zone: {shorten_repr(value)} ({e})") from e
    try:
        return parsed.astimezone(UTC)
    except OverflowError as e:  # e.g. 0001-01-01T00:00:00+14:00 is before year 1 in UTC
        error = PastYear9999 if parsed.year == 9999 else Invalid
        raise error(f"time out of range (years 1-9999 in UTC): {shorten_repr(value)}") from e


_RECORDER_TIME: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{6})?Z")
"""The ``observedAt`` shape that recorders write (``dra-ledger record``, the simulator): UTC, ``T``, ``Z``, and six
fraction digits or none. Every value of this shape that :func:`parse_time` takes, ``datetime.fromisoformat`` reads
to the same instant."""


def _receive_time(value: str) -> tuple[datetime, str]:
    """Read a line's ``observedAt``: the instant (tz-aware UTC) and its ``isoformat()``, the digest's spelling.

    Why not :func:`parse_time` and ``isoformat()`` alone: each line of a recorded file has its own receive time,
    and the two took ~4 µs a line (regular expression, seven ``int`` calls, a datetime built in Python, then the
    text). A value of the recorders' shape (:data:`_RECORDER_TIME`) is read by ``datetime.fromisoformat`` in C
    and its ISO text cut from the value itself (~0.5 µs); every other value, and one ``fromisoformat`` refuses
    (a 60th second, 30 February), goes through :func:`parse_time`, which says why it is refused.

    Raises:
        Invalid: as :func:`parse_time`; or the time is at or past :data:`TIME_LIMIT`, where no query could ever
            ask about what the line records (year 9999).
    """
    if _RECORDER_TIME.fullmatch(value):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if parsed < TIME_LIMIT:
                # isoformat() leaves out a fraction of zero microseconds: so does the text cut here.
                whole = len(value) == 20 or value.endswith(".000000Z")
                return parsed, (value[:19] if whole else value[:-1]) + "+00:00"
    limited = _before_time_limit(value)
    if limited is None:
        raise Invalid(f"{shorten_repr(value)} is too far in the future: no query can ask about it (the latest "
                      f"time accepted is {LATEST_TIME_TEXT})")
    return limited, limited.isoformat()


# Recorded files repeat the same receive time on every line of a burst (a relist, a resync).
_receive_time_cached: Final = lru_cache(maxsize=1024)(_receive_time)


def _as_utc(at: datetime | None) -> datetime | None:
    if at is None:
        return None
    if at.tzinfo is None or at.utcoffset() is None:
        raise Invalid(f"at: a timezone-aware datetime is required, got naive {at.isoformat()}")
    return at.astimezone(UTC)


# --------------------------------------------------------------------------------------------------
# Public entry points


def read_history(path: Path | str, *, at: datetime | None = None) -> Iterator[WatchLine | BrokenLine]:
    """Read a recorded history or kubectl output file, lazily, in file order.

    JSON Lines files are streamed line by line (constant memory, any size); the other formats are
    read whole. The format is detected from the content as :func:`read_text` describes. The
    string ``"-"`` reads standard input (``source`` is then ``"<stdin>"``).

    Args:
        path: the file; ``WatchLine.source`` is ``str(path)``.
        at: receive time for inputs that carry none (kubectl output, Lists, JSON Lines without
            ``observedAt``); a line's own ``observedAt`` always wins. Must be tz-aware.

    Returns:
        An iterator of :class:`WatchLine` and :class:`BrokenLine`, by increasing ``line``
        (except that lines which are not UTF-8 in a non-JSON-Lines file are reported first).

    Raises:
        Invalid: ``at`` is naive (raised at once).
        OSError: the file cannot be opened or read (raised by the first ``next()``).
    """
    at_utc = _as_utc(at)
    if isinstance(path, str) and path == "-":
        return _read_binary(sys.stdin.buffer, source="<stdin>", at=at_utc)
    return _read_path(Path(path), source=str(path), at=at_utc)


def read_text(text: str, *, source: str, at: datetime | None = None) -> Iterator[WatchLine | BrokenLine]:
    """Read a whole history or kubectl output held in memory, lazily, in text order.

    Detection, after a leading BOM and whitespace: if the first character is ``{`` and one of the
    first three non-blank lines is on its own a JSON object with ``type`` and ``object``, the text
    is JSON Lines (format 1). Otherwise, if it starts with ``{``, it is one or more JSON documents:
    each ``{"type", "object"}`` document is a watch event (format 2) and any other document is a
    Kubernetes object or List (format 3). Anything else is YAML (format 3, ``---`` separated).

    Rules per format:

    * JSON Lines: blank lines are skipped; ``observedAt`` is required unless ``at`` is given.
    * Watch events: ``observed_at`` is the document's ``observedAt`` if any, else ``at``, else None.
      A broken document is reported at its first line and reading resumes at the next line that
      starts with ``{`` in column 0.
    * Objects and Lists: every ``List`` / ``XxxList`` item and every other object is an ``ADDED``
      line at ``at`` (None if not given), and must have a string ``kind``. Items of an ``XxxList``
      that lack ``apiVersion`` / ``kind`` get the List's ``apiVersion`` and ``Xxx``. YAML items
      carry their own start line; JSON items the line of their List. YAML timestamps stay strings
      and every non-JSON YAML value (binary, set, non-string key...) is turned into a string.

    Args:
        text: the content; lines end with ``\\n`` (a ``\\r`` before it is ignored).
        source: what to put in ``source``, e.g. a path or ``"<stdin>"``.
        at: as for :func:`read_history`.

    Returns:
        An iterator of :class:`WatchLine` and :class:`BrokenLine` in text order.

    Raises:
        Invalid: ``at`` is naive (raised at once). Bad content never raises.
    """
    return _read_text(text, source=source, at=_as_utc(at))


# --------------------------------------------------------------------------------------------------
# Detection


def _read_path(path: Path, *, source: str, at: datetime | None) -> Iterator[ReadResult]:
    with path.open("rb") as handle:
        yield from _read_binary(handle, source=source, at=at)


def _read_binary(handle: BinaryIO, *, source: str, at: datetime | None) -> Iterator[ReadResult]:
    head: list[bytes] = []
    probe: list[str] = []
    for raw in handle:
        if not head:
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        head.append(raw)
        if raw.strip():
            probe.append(raw.decode("utf-8", "replace"))
            if len(probe) == _PROBE_LINES:
                break
    if _is_json_lines(probe):
        yield from _read_json_lines(enumerate(chain(head, handle), 1), source=source, at=at)
        return
    data = b"".join(head) + handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # Not JSON Lines (probed above), so YAML or JSON documents; each bad byte kept findable (a lone surrogate)
        # so that the documents holding one are rejected and the others read (_read_documents).
        text = data.decode("utf-8", "surrogateescape").removeprefix("\ufeff")
        yield from _read_documents(text, source=source, at=at, damaged=True)
        return
    yield from _read_text(text, source=source, at=at)


_ESCAPED_BYTE: Final = re.compile("[\udc80-\udcff]")
"""A byte that is not UTF-8, as ``bytes.decode("utf-8", "surrogateescape")`` keeps it (a lone surrogate)."""


def _damaged(source: str, line: int, document: str, bad: int, *, first_line: int) -> BrokenLine:
    """The rejection of ``document`` (text decoded with ``surrogateescape``, starting on line ``first_line`` of the
    file), reported on ``line``, whose first byte that is not UTF-8 is at index ``bad``."""
    start = document.rfind("\n", 0, bad) + 1
    end = document.find("\n", bad)
    problem = _not_utf8(document[start : len(document) if end == -1 else end].encode("utf-8", "surrogateescape"))
    where = first_line + document.count("\n", 0, bad)
    return _broken_bytes(source, line, f"{problem} on line {where}; the document is not read",
                         document.encode("utf-8", "surrogateescape"))


def _read_text(text: str, *, source: str, at: datetime | None) -> Iterator[ReadResult]:
    text = text.removeprefix("\ufeff")
    probe: list[str] = []
    for raw in _iter_lines(text):
        if raw and not raw.isspace():
            probe.append(raw)
            if len(probe) == _PROBE_LINES:
                break
    if _is_json_lines(probe):
        yield from _read_json_lines(enumerate(_iter_lines(text), 1), source=source, at=at)
    else:
        yield from _read_documents(text, source=source, at=at)


def _read_documents(text: str, *, source: str, at: datetime | None, damaged: bool = False) -> Iterator[ReadResult]:
    """Formats 2 and 3: JSON documents back to back when the text starts with ``{``, else YAML documents.

    ``damaged``: ``text`` was decoded with ``surrogateescape`` from bytes that are not all UTF-8. Every document
    holding such a byte is then rejected whole, once, naming the line and byte of its first one (:func:`_damaged`),
    and the documents around it are read as usual, in file order. Why: the bad bytes used to be reported line by
    line and the text then read with each replaced by U+FFFD, so a document's line was rejected twice (not UTF-8,
    then invalid YAML), the reports came out of line order, and a document that still parsed was recorded with
    characters its cluster never sent.
    """
    if text.lstrip().startswith("{"):
        yield from _read_json_documents(text, source=source, at=at, damaged=damaged)
    else:
        yield from _read_yaml(text, source=source, at=at, damaged=damaged)


def _is_json_lines(probe: list[str]) -> bool:
    """True if a probed line alone is a watch-event JSON object (whatever the lines before it hold).

    YAML and pretty-printed JSON (kubectl output) never hold a whole watch event on one line, so they are
    not taken for JSON Lines; a line of JSON Lines that is damaged is then a broken line of its own.
    """
    for raw in probe:
        if not raw.lstrip().startswith("{"):
            continue
        try:
            decoded: object = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(decoded, dict) and "type" in decoded and "object" in decoded:
            return True
    return False


def _iter_lines(text: str) -> Iterator[str]:
    """Split on ``\\n`` only: ``str.splitlines`` would also split on U+2028 inside JSON strings."""
    start = 0
    while (end := text.find("\n", start)) != -1:
        yield text[start:end]
        start = end + 1
    if start < len(text):
        yield text[start:]


# --------------------------------------------------------------------------------------------------
# Format 1: JSON Lines


def _read_json_lines(
    lines: Iterable[tuple[int, str | bytes]], *, source: str, at: datetime | None
) -> Iterator[ReadResult]:
    for number, item in lines:
        # A line read as bytes is decoded from the bytes (msgspec checks their UTF-8 itself) and made text only if
        # the fast decoder refuses it, or the line is refused (``_text``): that saves a str a line.
        raw: str | bytes = item.removesuffix(b"\n") if isinstance(item, bytes) else item
        try:
            fast: object = _FAST_DECODER.decode(raw)
        except (msgspec.DecodeError, _FloatSeen, RecursionError):
            pass  # anything unusual is read (or refused, with its reason) by the standard decoder below
        else:
            yield _watch_event(fast, source=source, line=number, raw=raw, at=at, time_required=True, fast=True)
            continue
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield _broken_bytes(source, number, f"not UTF-8: {e.reason} at byte {e.start}", e.object)
                continue
        # A byte-order mark opens a line inside the file where two files were joined (`cat a.jsonl b.jsonl`, b
        # written with one); the file's own first one is gone already. It is no part of the line's JSON.
        raw = raw.removeprefix("\ufeff")
        if not raw or raw.isspace():
            continue
        try:
            decoded: object = json.loads(raw)
        except (ValueError, RecursionError) as e:  # also: int longer than 4300 digits, absurd nesting
            yield _broken(source, number, json_problem(e), raw)
            continue
        yield _watch_event(decoded, source=source, line=number, raw=raw, at=at, time_required=True)


class _FloatSeen(Exception):
    """Raised by the fast decoder at the first JSON number with a fraction or exponent."""


def _refuse_float(_: str) -> float:
    raise _FloatSeen


_FAST_DECODER: Final = msgspec.json.Decoder(float_hook=_refuse_float)
"""Decoder of JSON Lines (msgspec, C). It decodes exactly as ``json.loads`` does (last duplicate key wins,
arbitrary-size integers up to its range) but refuses what would make the two readings or their canonical
encodings differ: any float (``json`` and msgspec spell exponents differently), NaN/Infinity, lone
surrogates, integers beyond 64 bits, absurd nesting. Those lines go through ``json.loads`` unchanged."""

_FAST_CANONICAL: Final = msgspec.json.Encoder(order="sorted")
"""Byte-for-byte the same canonical JSON as :data:`_CANONICAL` for values without floats (keys sorted by
code point, which UTF-8 byte order preserves; the same escapes; no spaces); a test checks it on random
values and on every fixture. Why: encoding the digest input was the largest cost of reading a line."""


def _watch_event(
    decoded: object, *, source: str, line: int, raw: str | bytes, at: datetime | None, time_required: bool,
    fast: bool = False
) -> ReadResult:
    """Check the watch envelope ``{observedAt?, type, object}`` and build the line (``raw``: as :func:`_text`)."""
    if (problem := envelope_problem(decoded)) is not None:
        return _broken(source, line, problem, _text(raw))
    decoded = cast(dict[str, JSONValue], decoded)
    event_type, obj = decoded["type"], decoded["object"]
    observed_at = at
    instant = None
    if "observedAt" in decoded:
        value = decoded["observedAt"]
        try:
            if not isinstance(value, str):
                raise Invalid(f"not an RFC 3339 time with a zone: {shorten_repr(value)}")
            observed_at, instant = _receive_time_cached(value)
        except Invalid as e:
            return _broken(source, line, f"observedAt: {e}", _text(raw))
    elif observed_at is None and time_required:
        return _broken(source, line, "missing field 'observedAt' (and no default time given)", _text(raw))
    return _watch_line(source, line, cast(WatchType, event_type), observed_at, cast(JSONObject, obj), raw, fast=fast,
                       instant=instant)


def envelope_problem(decoded: object) -> str | None:
    """Why a decoded watch event is not one the ledger can take, or ``None`` when it is.

    Checks only the envelope ``{"type": ..., "object": {...}}`` of a recorded line or of a line of a live
    watch stream (``observedAt`` and the object's own fields are checked elsewhere), in this order:
    a JSON object, a ``type`` present, not ``ERROR``, one of :data:`WATCH_TYPES`, an ``object`` present,
    and a JSON object.

    Args:
        decoded: the line as ``json.loads`` returns it (any JSON value).

    Returns:
        ``None`` for a well-formed envelope, else the reason a :class:`BrokenLine` carries, naming the
        field, e.g. ``missing field 'type'`` or ``object: not a JSON object (found string)``. Never raises.
    """
    if not isinstance(decoded, dict):
        return f"not a JSON object (found {_json_type(decoded)})"
    if "type" not in decoded:
        return "missing field 'type'"
    event_type, obj = decoded["type"], decoded.get("object")
    if event_type == "ERROR":
        message = obj.get("message") if isinstance(obj, dict) else None
        return f"type: ERROR events cannot be replayed (message: {message!r})"
    if not isinstance(event_type, str) or event_type not in WATCH_TYPES:
        return f"type: {shorten_repr(event_type)} is not ADDED, MODIFIED, DELETED or BOOKMARK"
    if "object" not in decoded:
        return "missing field 'object'"
    if not isinstance(obj, dict):
        return f"object: not a JSON object (found {_json_type(obj)})"
    return None


def json_problem(error: ValueError | RecursionError) -> str:
    """Why a line that ``json.loads`` refused is not JSON, as a replay and a live watch both report it.

    Args:
        error: what ``json.loads`` raised for one whole line (a ``str``): ``json.JSONDecodeError``,
            another ``ValueError`` (an integer longer than 4,300 digits) or ``RecursionError``
            (nested deeper than the decoder goes).

    Returns:
        ``invalid JSON: <message> (column <1-based column>)`` for a ``JSONDecodeError``, else
        ``invalid JSON: <error>``. Never raises.
    """
    if isinstance(error, json.JSONDecodeError):
        return f"invalid JSON: {error.msg} (column {error.colno})"
    return f"invalid JSON: {error}"


def error_status_problem(decoded: Mapping[str, object]) -> str | None:
    """Why an in-stream ``ERROR`` watch event carries no Status, or ``None`` when it carries one.

    A watch stream's ``ERROR`` line must carry a ``Status`` (``{"kind": "Status", "code": 410, ...}``); the
    API server never sends another object there. An object with ``kind: Status`` or an integer ``code`` is
    taken as one (a Status without ``code`` is read as a 500 by the watch). Replay refuses every ``ERROR``
    line (:func:`envelope_problem`); this is for the live watch only.

    Args:
        decoded: the line as ``json.loads`` returns it, a JSON object whose ``type`` is ``ERROR``.

    Returns:
        ``None`` for a Status, else the reason, naming the field, e.g.
        ``type: ERROR without a Status: missing field 'object'``. Never raises.
    """
    if "object" not in decoded:
        return "type: ERROR without a Status: missing field 'object'"
    obj = decoded["object"]
    if not isinstance(obj, dict):
        return f"type: ERROR without a Status: object: not a JSON object (found {_json_type(obj)})"
    code = obj.get("code")
    if obj.get("kind") != "Status" and (not isinstance(code, int) or isinstance(code, bool)):
        return "type: ERROR without a Status: object has neither kind 'Status' nor an integer 'code'"
    return None


# --------------------------------------------------------------------------------------------------
# Formats 2 and 3 in JSON: documents one after the other


_JSON_SPACE: Final = re.compile(r"[ \t\n\r]*")


def _read_json_documents(text: str, *, source: str, at: datetime | None,
                         damaged: bool = False) -> Iterator[ReadResult]:
    """Concatenated JSON documents (``kubectl get -o json``, ``--watch`` output), each a watch event, an object or a
    List. ``damaged``: as :func:`_read_documents`."""
    decoder = json.JSONDecoder()
    pos, line = 0, 1
    while True:
        space = _JSON_SPACE.match(text, pos)
        start = space.end() if space else pos
        line += text.count("\n", pos, start)
        if start >= len(text):
            return
        reason: str | None = None
        try:
            decoded, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as e:
            reason = f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        except (ValueError, RecursionError) as e:
            reason = f"invalid JSON: {e}"
        if reason is not None:
            # Resynchronise where kubectl starts its next document: a '{' in column 0.
            after = text.find("\n{", start)
            end = len(text) if after == -1 else after + 1
        raw = text[start:end]
        if damaged and (found := _ESCAPED_BYTE.search(raw)) is not None:
            yield _damaged(source, line, raw.rstrip(), found.start(), first_line=line)
        elif reason is not None:
            yield _broken(source, line, reason, raw.rstrip())
        elif _is_watch_event(decoded):
            yield _watch_event(decoded, source=source, line=line, raw=raw, at=at, time_required=False)
        else:
            yield from _objects(decoded, source=source, line=line, item_lines=None, raw=raw, at=at)
        line += text.count("\n", start, end)
        pos = end


def _is_watch_event(decoded: object) -> bool:
    """A ``{"type", "object"}`` envelope, as opposed to an object (a Secret or Event has ``type``)."""
    return isinstance(decoded, dict) and ("object" in decoded or ("type" in decoded and "kind" not in decoded))


# --------------------------------------------------------------------------------------------------
# Format 3 in YAML


_DROPPED_TAGS: Final = ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:value")
"""Implicit YAML 1.1 types not resolved: unquoted timestamps (would be datetimes) and a lone ``=``
(the safe loader cannot construct it). Both stay strings, as Kubernetes reads them."""

if TYPE_CHECKING or yaml.__with_libyaml__:
    from yaml import CSafeLoader as _BaseLoader
else:  # pure-Python fallback, same API, about 10x slower
    from yaml import SafeLoader as _BaseLoader


class _YAMLLoader(_BaseLoader):
    """Safe loader (libyaml when present) that leaves timestamps and a lone ``=`` as strings, and refuses a
    mapping that holds a key twice, as the API server's strict decoding does (PyYAML would keep the last)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        """The mapping of ``node``; raises ``yaml.constructor.ConstructorError`` for a key given twice."""
        check_mapping_keys(self, node, deep=deep, names_only=False)
        return super().construct_mapping(node, deep=deep)


def check_mapping_keys(loader: yaml.constructor.SafeConstructor, node: MappingNode, *, deep: bool,
                       names_only: bool) -> None:
    """Refuse a YAML mapping that gives a key twice, and with ``names_only`` one whose key YAML reads as
    anything but a string (an unquoted ``2024``, ``no`` or ``null``), from a loader's ``construct_mapping``.

    Merge keys (``<<``) are left to PyYAML: a key they bring in may be overridden, as YAML allows.

    Raises:
        yaml.constructor.ConstructorError: naming the key as written and its line, as PyYAML's own errors do.
    """
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        if names_only and not isinstance(key, str):
            problem = "found a collection as a key; keys are names"
            if isinstance(key_node, ScalarNode):
                written = key_node.value
                problem = (f"found the key {written!r}, which YAML reads as {type(key).__name__}, not a string: "
                           f'quote it if it is a name ("{written}")')
            raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark, problem,
                                                    key_node.start_mark)
        if isinstance(key, Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError("while reading a mapping", node.start_mark,
                                                        f"found the key {key!r} twice", key_node.start_mark)
            seen.add(key)


_YAMLLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _DROPPED_TAGS]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


def _construct_plain_string(loader: yaml.SafeLoader, node: ScalarNode) -> str:
    return loader.construct_scalar(node)


# An explicit `!!timestamp` tag still reaches the constructor: keep its text.
_YAMLLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_plain_string)


def _read_yaml(text: str, *, source: str, at: datetime | None, damaged: bool = False) -> Iterator[ReadResult]:
    """YAML documents, chunk by chunk (:func:`_yaml_chunks`); ``damaged``: as :func:`_read_documents`."""
    for first_line, chunk in _yaml_chunks(text):
        if damaged and (found := _ESCAPED_BYTE.search(chunk)) is not None:
            yield _damaged(source, _first_content_line(chunk.split("\n"), first_line), chunk, found.start(),
                           first_line=first_line)
        else:
            yield from _read_yaml_chunk(chunk, first_line=first_line, source=source, at=at)


def _yaml_chunks(text: str) -> Iterator[tuple[int, str]]:
    """Cut the text before each ``---`` line, so one broken document does not hide the next ones.

    A part holding only comments, directives or blank lines stays with the document after it.
    """
    lines = text.split("\n")
    start, has_content = 0, False
    for index, raw in enumerate(lines):
        if raw.startswith("---") and (len(raw) == 3 or raw[3] in " \t\r") and has_content:
            yield start + 1, "\n".join(lines[start:index])
            start, has_content = index, False
        stripped = raw.lstrip()
        if stripped and not stripped.startswith(("#", "%")):
            has_content = True
    yield start + 1, "\n".join(lines[start:])


def _read_yaml_chunk(chunk: str, *, first_line: int, source: str, at: datetime | None) -> Iterator[ReadResult]:
    chunk_lines = chunk.split("\n")
    error_line = _first_content_line(chunk_lines, first_line)  # where a failure is reported
    documents = _yaml_documents(chunk)
    while True:
        try:
            document = next(documents, None)
        except (
            yaml.YAMLError,
            _NotJSONError,
            RecursionError,
            # Explicit tags reach constructors that raise plain errors, e.g. `!!int x`:
            ValueError,
            TypeError,
            AttributeError,
            OverflowError,
        ) as e:
            # The loader's state is undefined after an error: give up on the rest of this chunk
            # (it is one `---` document unless `...` markers were used).
            problem = _yaml_problem(e, chunk=chunk, first_line=first_line)
            yield _broken(source, error_line, f"invalid YAML: {problem}", chunk)
            return
        if document is None:
            return
        node, converted = document
        line = first_line + node.start_mark.line
        error_line = first_line + node.end_mark.line
        raw = "\n".join(chunk_lines[node.start_mark.line : node.end_mark.line + 1])
        item_lines = _item_lines(node, first_line)
        yield from _objects(converted, source=source, line=line, item_lines=item_lines, raw=raw, at=at)


def _yaml_documents(chunk: str) -> Iterator[tuple[Node, JSONValue]]:
    """Each document's root node and its JSON value; raises what the loader raises."""
    loader = _YAMLLoader(chunk)  # the pure-Python reader already rejects bad characters here
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                return
            data: object = loader.construct_document(node)
            yield node, _to_json(data, budget=[_YAML_NODE_BUDGET], active=set())
    finally:
        loader.dispose()


def _yaml_problem(error: Exception, *, chunk: str, first_line: int) -> str:
    """One-line description of a YAML failure, with its line in the whole text (1-based)."""
    if isinstance(error, yaml.reader.ReaderError):  # a character YAML forbids, e.g. NUL
        line = first_line + chunk.count("\n", 0, error.position)
        column = error.position - (chunk.rfind("\n", 0, error.position) + 1) + 1
        char = error.character
        code = f"#x{char:04x}" if isinstance(char, int) else repr(char)
        return f"unacceptable character {code}: {error.reason} (line {line}, column {column})"
    if isinstance(error, yaml.MarkedYAMLError):
        what = f"{error.context}: {error.problem}" if error.context else f"{error.problem}"
        mark = error.problem_mark or error.context_mark
        if mark is None:
            return what
        return f"{what} (line {first_line + mark.line}, column {mark.column + 1})"
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)


def _first_content_line(chunk_lines: list[str], first_line: int) -> int:
    """Line (1-based, in the whole text) of the chunk's first content: a broken document is reported
    there, as a good one is at its root node. Comments, directives, blank lines and a bare ``---``
    marker are skipped (``--- {kind: Pod}`` holds content on the marker's own line)."""
    for offset, raw in enumerate(chunk_lines):
        stripped = raw.lstrip()
        if stripped.startswith("---") and not stripped[3:].split("#", 1)[0].strip():
            continue
        if stripped and not stripped.startswith(("#", "%")):
            return first_line + offset
    return first_line


def _item_lines(node: Node, first_line: int) -> list[int] | None:
    """Start line of each ``items[]`` entry of a List document, or None if not a plain List."""
    if not isinstance(node, MappingNode):
        return None
    found: list[int] | None = None
    for key, value in node.value:
        if isinstance(key, ScalarNode) and key.value == "items" and isinstance(value, SequenceNode):
            found = [first_line + item.start_mark.line for item in value.value]
    return found


class _NotJSONError(Exception):
    """A YAML value that cannot become JSON (a recursive alias, an alias bomb)."""


def _to_json(value: object, *, budget: list[int], active: set[int]) -> JSONValue:
    """Copy a constructed YAML value into JSON types; ``budget`` counts values left to copy."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _NotJSONError(f"document expands to more than {_YAML_NODE_BUDGET} values (alias bomb?)")
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, dict | list | tuple | set | frozenset):
        if id(value) in active:
            raise _NotJSONError("recursive alias")
        active.add(id(value))
        try:
            if isinstance(value, dict):
                return {_key_string(k): _to_json(v, budget=budget, active=active) for k, v in value.items()}
            items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
            return [_to_json(v, budget=budget, active=active) for v in items]
        finally:
            active.discard(id(value))
    return _scalar_string(value)


def _key_string(key: object) -> str:
    return key if isinstance(key, str) else _scalar_string(key)


def _scalar_string(value: object) -> str:
    """The JSON-ish text of a non-string YAML scalar: ``true``, ``null``, ``1``, ISO dates, base64."""
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, date):  # datetime too
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return str(value)


# --------------------------------------------------------------------------------------------------
# Objects and Lists (format 3)


def _objects(
    decoded: object,
    *,
    source: str,
    line: int,
    item_lines: list[int] | None,
    raw: str,
    at: datetime | None,
) -> Iterator[ReadResult]:
    """One ADDED line per item of a List, or one for a single object."""
    if decoded is None:  # an empty YAML document (only comments, or a trailing `---`)
        return
    if not isinstance(decoded, dict):
        yield _broken(source, line, f"not a Kubernetes object (found {_json_type(decoded)})", raw)
        return
    if (problem := _kind_problem(decoded)) is not None:
        yield _broken(source, line, problem, raw)
        return
    kind = cast(str, decoded["kind"])
    if not (kind == "List" or (kind.endswith("List") and "items" in decoded)):
        yield _watch_line(source, line, "ADDED", at, cast(JSONObject, decoded), raw)
        return
    items = decoded.get("items")
    if items is None:  # `kubectl get` of nothing prints `items: []`; Go may write null
        return
    if not isinstance(items, list):
        yield _broken(source, line, f"items: not a list (found {_json_type(items)})", raw)
        return
    inherited: JSONObject = {}
    if kind != "List":
        if isinstance(api_version := decoded.get("apiVersion"), str):
            inherited["apiVersion"] = api_version
        inherited["kind"] = kind.removesuffix("List")
    lines = item_lines if item_lines is not None and len(item_lines) == len(items) else [line] * len(items)
    for index, (item, item_line) in enumerate(zip(items, lines, strict=True)):
        if not isinstance(item, dict):
            problem = f"items[{index}]: not an object (found {_json_type(item)})"
            yield _broken(source, item_line, problem, _dump(item))
            continue
        missing = {k: v for k, v in inherited.items() if k not in item}
        obj = cast(JSONObject, {**missing, **item} if missing else item)
        if (problem := _kind_problem(obj)) is not None:
            yield _broken(source, item_line, f"items[{index}]: {problem}", _dump(item))
            continue
        yield _watch_line(source, item_line, "ADDED", at, obj, raw)


def _kind_problem(obj: JSONObject) -> str | None:
    if "kind" not in obj:
        return "missing field 'kind'"
    if not isinstance(obj["kind"], str):
        return f"kind: not a string (found {_json_type(obj['kind'])})"
    return None


# --------------------------------------------------------------------------------------------------
# Building results


_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False,
                                     allow_nan=False)
"""Encoder of the digest input. No cycle check (a quarter of the cost): decoded JSON cannot be
cyclic and :func:`_to_json` rejects recursive YAML aliases. ``allow_nan=False``: Python's decoders
accept ``NaN`` / ``Infinity`` (JSON) and ``.nan`` / ``.inf`` (YAML), which PostgreSQL ``jsonb`` refuses."""


def _watch_line(
    source: str, line: int, event_type: WatchType, observed_at: datetime | None, obj: JSONObject,
    raw: str | bytes | Callable[[], str], *, fast: bool = False, instant: str | None = None
) -> ReadResult:
    """Build a WatchLine; ``raw`` (as :func:`_text`) is only used if the object cannot be stored.

    ``fast``: ``obj`` came from :data:`_FAST_DECODER` (no floats, lone surrogates or NaN), so
    :data:`_FAST_CANONICAL` gives the digest input, byte for byte what :data:`_CANONICAL` gives.
    ``instant``: ``observed_at.isoformat()`` when the caller has it already (:func:`_receive_time`).
    """
    if instant is None:
        instant = observed_at.isoformat() if observed_at else ""
    envelope = [event_type, instant, obj]
    if fast:
        encoded = _FAST_CANONICAL.encode(envelope)
    else:
        try:
            canonical = _CANONICAL.encode(envelope)
        except RecursionError:
            return _broken(source, line, "object nested too deeply", _text(raw))
        except ValueError:  # NaN or Infinity (also what 1e309 reads as): the database could not store the line
            return _broken(source, line, "object holds NaN or Infinity (a number past ±1.8e308 reads as Infinity), "
                           "which the ledger cannot store", _text(raw))
        try:
            encoded = canonical.encode("utf-8")
        except UnicodeEncodeError as e:  # "\ud800" decodes to a lone surrogate: not Unicode text, not storable
            return _broken(source, line, f"object holds a lone UTF-16 surrogate {canonical[e.start]!r}, "
                           "which is not a Unicode character", _text(raw))
    # Each level needs a '{' or '[', so few brackets in all prove the depth is fine without a walk.
    if encoded.count(b"{") + encoded.count(b"[") > MAX_DEPTH and _deeper_than(obj, MAX_DEPTH):
        return _broken(source, line, f"object: nested too deeply (more than {MAX_DEPTH} levels of objects "
                       "and arrays)", _text(raw))
    # The digest input is ``[type, time, object]`` with no spaces; type and time are ASCII and need no escape,
    # so the object's text starts after the two quoted strings, the brackets and the commas.
    start = len(event_type) + len(instant) + 7
    return WatchLine(source=source, line=line, observed_at=observed_at, type=event_type, object=obj,
                     digest=hashlib.sha256(encoded).hexdigest(), object_json=encoded[start:-1],
                     holds_nul=b"\\u0000" in encoded)


def _text(raw: str | bytes | Callable[[], str]) -> str:
    """The text of a refused line: ``raw`` itself, its UTF-8 bytes decoded (bytes msgspec decoded, so valid), or what
    ``raw`` makes."""
    if isinstance(raw, str):
        return raw
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw()


def _deeper_than(obj: JSONObject, limit: int) -> bool:
    """Whether ``obj`` nests objects and arrays more than ``limit`` levels deep (``obj`` is level 1)."""
    stack: list[tuple[JSONValue, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
    return False


def _broken(source: str, line: int, reason: str, text: str) -> BrokenLine:
    text = text.rstrip("\r")
    raw = text.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(raw).hexdigest()
    # Lone surrogates become U+FFFD in the kept text, so the rejected line can still be stored.
    kept = raw.decode("utf-8", "replace")
    return BrokenLine(source=source, line=line, reason=reason, text=kept[:MAX_TEXT_CHARS], digest=digest)


def _broken_bytes(source: str, line: int, reason: str, raw: bytes) -> BrokenLine:
    raw = raw.rstrip(b"\r\n")
    text = raw.decode("utf-8", "replace")[:MAX_TEXT_CHARS]
    digest = hashlib.sha256(raw).hexdigest()
    return BrokenLine(source=source, line=line, reason=reason, text=text, digest=digest)


def _not_utf8(raw: bytes) -> str | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8: {e.reason} at byte {e.start}"
    return None


def _dump(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def watch_line(
    *, source: str, line: int, event_type: WatchType, observed_at: datetime, obj: JSONObject
) -> WatchLine | BrokenLine:
    """Build the line a live watch event would be in a recorded file (same digest as replaying it).

    Used by the watch workers so that a live event and the same event read back from a recording
    share one identity.

    Args:
        source: where the event came from, e.g. ``"watch:ResourceClaim"``.
        line: 1-based sequence number of the event from that source.
        event_type: ADDED, MODIFIED, DELETED or BOOKMARK.
        observed_at: receive time; must be tz-aware (converted to UTC).
        obj: the decoded object, as the API server sent it.

    Returns:
        A :class:`WatchLine`, or a :class:`BrokenLine` when the object is nested too deeply to digest or
        holds what PostgreSQL cannot store (NaN / Infinity, a lone UTF-16 surrogate).

    Raises:
        Invalid: ``observed_at`` is naive.
    """
    at = _as_utc(observed_at)
    # The object's text is made only for a line that is refused: a live watch's lines are rarely broken.
    return _watch_line(source, line, event_type, at, obj, lambda: _dump(obj))


def not_an_object(item: object) -> str:
    """Why an item of a List answer (``items[]``) that is no JSON object is refused (its caller checked it is none).

    Returns:
        ``list item: not a JSON object (found string)`` and so on (``array``, ``number``, ``boolean``, ``null``).
        Never raises.
    """
    return f"list item: not a JSON object (found {_json_type(item)})"


def broken_watch_line(*, source: str, line: int, reason: str, observed_at: datetime, text: str) -> BrokenLine:
    """Build the rejected line for a line of a live watch stream that is no watch event the ledger can take.

    The counterpart of :func:`watch_line` for the lines a live watch cannot take (not UTF-8, not JSON:
    :func:`json_problem`; no watch event: :func:`envelope_problem`; an ERROR without a Status:
    :func:`error_status_problem`): the watch workers store it as a rejected observation, as a replay
    stores a broken line of a file.

    Args:
        source: where the line came from, e.g. ``"watch:ResourceClaim"``.
        line: 1-based sequence number of the line from that source.
        reason: why it was refused (e.g. :func:`json_problem`, :func:`envelope_problem`).
        observed_at: receive time; must be tz-aware (converted to UTC).
        text: the line as the API server sent it, without its newline; kept up to :data:`MAX_TEXT_CHARS`.

    Returns:
        A :class:`BrokenLine` whose digest is the SHA-256 of ``text`` alone. Its observation is keyed by
        the receive time and the digest (``observations_cluster_observed_at_digest_key``), as a live
        :class:`WatchLine`'s is: the same text delivered again later (a watch resumed from before it) is
        stored again with its new receive time, as a valid event delivered again is.

    Raises:
        Invalid: ``observed_at`` is naive.
    """
    return msgspec.structs.replace(_broken(source, line, reason, text), observed_at=_as_utc(observed_at))
