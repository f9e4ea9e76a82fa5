"""The ``LedgerError`` tree: every failure the domain reports, as a type callers can match on."""

from __future__ import annotations

import re

MAX_ECHO_CHARS = 100
"""Longest piece of client input (a parameter's name or value, an option's value, a name in a URL path) an
error message repeats, in characters; longer input is cut to this length, its last character an ellipsis
(``…``). A name or value the ledger takes is far shorter (Kubernetes names are at most 253 characters but
a real one is rarely over 60; a page token is never echoed)."""


def shorten(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its first ``limit - 1`` and ``…`` (``limit`` in all).

    The one helper for echoing client input in an error message (an API problem detail, a CLI error): the
    caller sees which input was meant without the message growing with the input (a 100 KiB parameter
    answered with a 100 KiB detail). Cut each piece of input on its own (:func:`shorten_repr` for a
    quoted value), never the whole message, so the ledger's own words stay whole.
    """
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shorten_repr(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters like :func:`shorten`, keeping the closing quote of a string.

    A long string reads ``'abc…'`` (its first ``limit - 2`` characters of ``repr``, the ellipsis and the quote), so
    the message's own words after it are not taken for part of the value; other values are cut as
    :func:`shorten` cuts them. The one helper for echoing a quoted value in an error message.
    """
    text = repr(value)
    if len(text) <= limit or not isinstance(value, str):
        return shorten(text, limit)
    return text[: limit - 2] + "…" + text[-1]


_BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""Unicode's explicit bidirectional formatting characters (ALM, LRM, RLM, the embeddings and overrides, the
isolates): one of them makes a terminal draw the text after it in another order than it is written."""
_CONTROL_CHARACTERS = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI_CONTROLS}]")
_CONTROL_BUT_NEWLINE = re.compile(f"[\\x00-\\x09\\x0b-\\x1f\\x7f-\\x9f{_BIDI_CONTROLS}]")


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with its control characters written as Python escapes (``\\x1b``, ``\\t``; newlines too unless
    ``keep_newlines``) and its bidirectional formatting characters as ``\\u`` escapes (``\\u202e``), so that a
    string from the cluster (a device attribute, an object's kind or name in a rejection) cannot move the cursor,
    recolour, retitle or ring the operator's terminal, split a log line, or show its characters in another order."""
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL_CHARACTERS
    return pattern.sub(lambda m: repr(m.group())[1:-1], text)


class LedgerError(Exception):
    """Base of every error raised by the ledger."""


class NotFound(LedgerError):
    """Something asked for does not exist in the ledger."""


class UnknownClaim(NotFound):
    """No ResourceClaim with this namespace/name or uid was ever recorded."""


class UnknownDevice(NotFound):
    """No device with this ``(driver, pool, device)`` was ever recorded."""


class UnknownDeviceClass(NotFound):
    """No DeviceClass of this name was defined at the instant asked about (in the clusters asked about)."""


class Conflict(LedgerError):
    """The ledger moved on under the caller."""


class StreamConflict(Conflict):
    """Another writer appended to ``stream`` after ``expected``."""

    def __init__(self, *, stream: str, expected: int) -> None:
        super().__init__(f"stream {stream!r} is past position {expected}")
        self.stream = stream
        self.expected = expected


STREAM_CONFLICT_HINT = ("if no other writer of this cluster is running, its translator state entry is behind the "
                        "stream (as release 0.3.0 could leave it): run `dra-ledger db repair-state`")
"""What a ``StreamConflict`` that outlived the retries (``ledger.services.CONFLICT_RETRIES``, each after loading the
translator state again) most likely means, for the command line and the watch workers' log."""


class ObservationConflict(Conflict):
    """Another writer recorded one of a batch's observations (same digest) first; nothing of the batch was
    written. Raised by a batch translated ahead of its write, whose duplicate check ran before the append lock."""


class StateConflict(Conflict):
    """Another writer appended to the cluster after the translator state a batch was translated against was loaded
    (table ``cluster_appends`` counted a commit this writer did not make); nothing of the batch was written. Raised
    by a batch translated ahead of its write; a batch translated under the append lock loads the state again
    instead."""


class Invalid(LedgerError):
    """Input that the ledger cannot accept; the message says what and where."""


class InvalidObject(Invalid):
    """A Kubernetes object lacks a field or has one of the wrong type.

    ``path`` is the dotted field path inside the object, e.g. ``spec.pool.generation``.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class UnsupportedObject(Invalid):
    """A kind or API version the ledger does not track (e.g. ``resource.k8s.io/v1alpha3``)."""


class ProjectionFailed(LedgerError):
    """The read models could not apply a batch of events: a statement failed (a constraint, a value the
    database refused) or an event did not fit a projection.

    Nothing of the batch committed: ``projections``, caught up together in one transaction per batch, stay
    at their checkpoint, global position ``after`` (1-based; the batch is the events after it, up to
    ``through``), and the next catch-up retries from there. A bad event fails again until the data or the
    code is fixed; it is never skipped.
    """

    def __init__(self, *, projections: tuple[str, ...], after: int, through: int, reason: str) -> None:
        super().__init__(f"projections stopped at global position {after}, the events after it up to {through} "
                         f"failed ({', '.join(projections)}): {reason}")
        self.projections = projections
        self.after = after
        self.through = through
        self.reason = reason


class Unavailable(LedgerError):
    """The ledger database cannot be reached now (connection refused, server restarting); retry later."""


class RetryLater(LedgerError):
    """The answer cannot be given now, for a reason that passes: ask again after ``retry_after_s`` seconds (an API
    answers 503 with ``Retry-After``). Nothing was read or changed."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Busy(RetryLater):
    """This process already runs as much of one kind of work at once as it may, and none finished within the
    wait; retry after ``retry_after_s`` seconds. Nothing was read or changed."""


class ReadModelsRebuilding(RetryLater):
    """A read waited as long as it may (``LedgerDatabase.read_models_wait_s``) for the read models, and another
    transaction still held them: a rebuild, or a first build of the read models from a whole history, until it
    commits (its ``TRUNCATE`` keeps every read off them), or a schema migration. Retry after ``retry_after_s``
    seconds; the read models are whole again once it commits."""


class CheckpointsLocked(LedgerError):
    """Another process holds the projections' checkpoint rows: it is applying events to the read models (a
    ``replay``, ``serve``'s catch-up job or a watch worker), and the caller asked not to wait for it.

    What this process applied before it found them locked stays committed (``applied`` events); the read models
    are consistent at their checkpoints, only behind the newest event.
    """

    def __init__(self, *, applied: int) -> None:
        super().__init__("another process is applying events to the read models (their checkpoints are locked)")
        self.applied = applied


class SchemaNotReady(LedgerError):
    """The database schema is missing or older than this code; run ``dra-ledger db upgrade``."""


class StoreUnavailable(Unavailable):
    """The ledger database cannot be reached right now (connection refused or lost, server restarting).

    Transient: nothing of the failed transaction was committed; retry after a backoff.
    """


class StatementCancelled(StoreUnavailable):
    """PostgreSQL ended a statement of the ledger for a timeout of its own (SQLSTATE 57014 ``query_canceled``: a
    ``statement_timeout`` of the server, database or role, or an administrator; 55P03 ``lock_not_available``: a
    ``lock_timeout``): the database answers, but not within the time its settings allow. Transient like a lost
    connection (nothing was committed; a later try may pass), but said as what it is."""


class NoFreeConnection(StoreUnavailable):
    """Every connection of this process's database connection pool stayed in use past the pool's timeout: the
    database may be reachable, but this process has more requests at once than connections. Retry later."""
