"""Opaque page tokens: ``limit`` rows a page, results stable across pages.

A token encodes where the next page starts — the offset into the ordered result, or, for results paged
in SQL by a sort key (occupancy, claims), the key of the last row returned — the instant ``at`` the first page
was computed for (so later pages answer the same question even when ``at`` defaulted to "now"), and a
digest of the other query parameters (a token cannot be replayed against another query).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ledger.errors import Invalid
from ledger.recorded import parse_query_time
from ledger.types import MAX_GLOBAL_POSITION

T = TypeVar("T")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Page:
    """Where a page starts: ``offset`` rows in, or after the row whose sort key is ``after``, for the
    query fingerprinted by ``query`` at ``at``."""

    offset: int
    at: str | None
    after: tuple[str, ...] | None = None


def fingerprint(endpoint: str, params: Mapping[str, object]) -> str:
    """Digest of the endpoint (the request's path, ``request.url.path``, e.g. ``/v1/quotas``) and the query
    parameters that define the result (not ``pageToken`` / ``limit``, and not the instant, ``at`` or a timeline's
    ``to``: the token carries the instant its list answers, and :func:`api.deps.page_instant` refuses a request
    asking another, so a token from a first page asked without ``at`` also answers a request naming that instant).
    The endpoint is in it so that a token of one list is refused by another taking the same parameters
    (``/v1/quotas`` and ``/v1/pending`` both take ``at`` and ``cluster``): read there, its offset skipped rows of a
    list it never counted."""
    text = json.dumps({"endpoint": endpoint, "params": {k: str(v) for k, v in sorted(params.items()) if v is not None}},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode(*, offset: int, at: str | None, query: str, after: Sequence[str] | None = None) -> str:
    """Make the token for the page starting ``offset`` rows in (or after the sort key ``after``)."""
    body: dict[str, object] = {"o": offset, "at": at, "q": query}
    if after is not None:
        body["k"] = list(after)
    # UTF-8, not \u escapes: a character outside the BMP (an emoji in a cluster name) is 4 bytes, not 12.
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


MAX_TOKEN_CHARS = 16_384
"""Longest page token read; anything longer is refused before it is decoded. Tokens this API issues hold an
offset, an instant, a digest and at most one device key or claim key: under 2.5 KB for names within Kubernetes'
limits, with a cluster name of 253 emoji (1,012 bytes of UTF-8). 16 KiB is also the longest request line
uvicorn's h11 parser takes, so a token this API could not read back could not be sent either."""


def decode(token: str | None, *, query: str) -> Page:
    """Read a token (``None`` = the first page).

    Raises:
        Invalid: the token is malformed (including a sort key or instant holding a lone surrogate or a
            NUL character, an instant that is not one, an offset past the bigint range) or belongs to another
            query.
    """
    if token is None:
        return Page(offset=0, at=None)
    if len(token) > MAX_TOKEN_CHARS:
        raise Invalid("pageToken is not a token this API issued (too long)")
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset, at, q, after = data["o"], data["at"], data["q"], data.get("k")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise Invalid("pageToken is not a token this API issued") from e
    if type(offset) is not int or not 0 <= offset <= MAX_GLOBAL_POSITION or not (at is None or isinstance(at, str)):
        # An offset is a row count or (the events list) a global position: a bigint either way.
        raise Invalid("pageToken is not a token this API issued")
    if q != query:
        raise Invalid("pageToken was issued for another list (another endpoint, or other parameters than this "
                      "request's); leave pageToken out to ask for the first page")
    if after is not None and not (isinstance(after, list) and all(isinstance(k, str) for k in after)):
        raise Invalid("pageToken is not a token this API issued")
    if not all(_encodable(k) and "\x00" not in k for k in (*(after or ()), at or "")):
        # JSON can carry a lone surrogate ("\ud800") or a NUL ("\u0000"), which no text the API issues holds
        # and which the database driver cannot send: an edited token, refused here rather than by the
        # database with words that name no parameter.
        raise Invalid("pageToken is not a token this API issued")
    if at is not None:
        try:
            parse_query_time(at)  # the API wrote an instant it answered for: an edited one is the token's fault
        except (Invalid, OverflowError, ValueError) as e:
            raise Invalid("pageToken is not a token this API issued") from e
    return Page(offset=offset, at=at, after=tuple(after) if after is not None else None)


SortKey = tuple[str, str, str, str]
"""The key a list paged in SQL resumes after: occupancy's (cluster, driver, pool, device), the claims listing's
(cluster, namespace, name, uid)."""


def sort_key(page: Page) -> SortKey | None:
    """The key of the last row the previous page served, for a list paged in SQL by a four-part key; ``None`` on
    the first page.

    Raises:
        Invalid: the token holds an offset (tokens of such lists never do) or a key of another length.
    """
    if page.offset != 0 or (page.after is not None and len(page.after) != 4):
        raise Invalid("pageToken is not a token this API issued")
    return None if page.after is None else (page.after[0], page.after[1], page.after[2], page.after[3])


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def cut(rows: Sequence[T], *, page: Page, limit: int, at: str | None, query: str) -> tuple[list[T], str | None]:
    """Return this page's rows and the token of the next page (``None`` on the last)."""
    chunk = list(rows[page.offset : page.offset + limit])
    following = page.offset + limit
    token = encode(offset=following, at=at, query=query) if following < len(rows) else None
    return chunk, token
