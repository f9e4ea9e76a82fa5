"""The single error-to-HTTP mapping: every failure leaves as RFC 9457 problem details.

``NotFound`` → 404, ``Conflict`` → 409, ``Invalid`` → 422, ``Unavailable`` (database unreachable, or no pooled
connection free: ``NoFreeConnection``) and ``RetryLater`` (``Busy``: every report slot taken;
``ReadModelsRebuilding``: a rebuild held the read models past ``api.limits.REBUILD_WAIT_S``) → 503 with ``Retry-After``,
``ClientGone`` (the client left while its report waited) → 499 that nobody reads, anything else → 500 with no
internals in the body (the traceback goes to the log).

Parameters follow one rule: 400 when the *set* of parameters is wrong (a name the endpoint does not take,
one given twice, a required one missing), 422 when a parameter is there but its *value* is not one it can
take, whoever finds out: Litestar's own validation (not a number, out of ``ge``/``le``, outside a
``Literal``'s values), the ``/v1`` guards (:mod:`api.parameters`: an integer's form, a NUL character) or
the handler (``Invalid``: a bad time, an empty window or cluster, a foreign ``pageToken``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.openapi import ResponseSpec
from litestar.plugins.problem_details import ProblemDetailsConfig, ProblemDetailsException, ProblemDetailsPlugin
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from api.deps import ClientGone
from api.parameters import client_name, literal_strings, required_query_names
from ledger.errors import (
    MAX_ECHO_CHARS,
    Conflict,
    Invalid,
    LedgerError,
    NoFreeConnection,
    NotFound,
    RetryLater,
    StatementCancelled,
    Unavailable,
    printable,
    shorten,
)

_log = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"


def _problem(status: int, detail: str, headers: dict[str, str] | None = None) -> Response[Any]:
    """A problem details answer (RFC 9457) of type ``about:blank``: its title is the status phrase
    (:func:`_phrase`), ``detail`` says what was wrong, its control and bidirectional formatting characters written
    as escapes (:func:`ledger.errors.printable`): a detail repeats what the client sent, and is read in terminals
    and logs (``curl`` prints a right-to-left override as it is)."""
    return Response(
        {"type": "about:blank", "status": status, "title": _phrase(status), "detail": printable(detail)},
        status_code=status,
        media_type=PROBLEM_JSON,
        headers=headers,
    )


def _ledger_error(_: Request[Any, Any, Any], exc: LedgerError) -> Response[Any]:
    if isinstance(exc, NotFound):
        return _problem(404, str(exc))
    if isinstance(exc, Conflict):
        return _problem(409, str(exc))
    if isinstance(exc, Invalid):
        return _problem(422, str(exc))
    if isinstance(exc, NoFreeConnection):
        _log.warning("%s", exc)
        return _problem(503, "every database connection of this API process stayed in use for the pool's timeout "
                             "(30 s): more requests at once than it has connections; retry later",
                        headers={"Retry-After": "5"})
    if isinstance(exc, StatementCancelled):
        _log.warning("%s", exc)
        return _problem(503, "the ledger database cancelled the query (a statement_timeout or lock_timeout of its "
                             "server, database or role, or an administrator); retry later, or ask for a smaller window",
                        headers={"Retry-After": "5"})
    if isinstance(exc, Unavailable):
        _log.warning("%s", exc)
        return _problem(503, "the ledger database is not reachable; retry later", headers={"Retry-After": "5"})
    if isinstance(exc, RetryLater):  # Busy (report slots), ReadModelsRebuilding
        _log.warning("%s", exc)
        return _problem(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)})
    _log.error("unmapped ledger error: %s", exc)
    return _problem(500, "the ledger failed to answer; see the server log")


def _field(request: Request[Any, Any, Any], key: object) -> Any:
    """The handler's signature field of argument ``key`` (``None`` before routing, or for another key)."""
    try:
        return request.route_handler.parsed_fn_signature.parameters.get(str(key))
    except (AttributeError, KeyError):  # no handler resolved (a 404/405 before routing)
        return None


def _client_name(request: Request[Any, Any, Any], key: object) -> object:
    """The name the client sends for the handler argument ``key`` (``groupBy`` for ``group_by``): Litestar's
    validation errors name the Python argument. Unknown keys are returned as they are."""
    field = _field(request, key)
    return key if field is None else client_name(field, str(key))


def _choices(request: Request[Any, Any, Any], key: object) -> str:
    """`` (one of: a, b)`` for an argument declared as a ``Literal`` of strings (optional or not), else ``""``."""
    values = literal_strings(getattr(_field(request, key), "annotation", None))
    return f" (one of: {', '.join(values)})" if values else ""


def _cut_echoes(request: Request[Any, Any, Any], key: object, message: object) -> str:
    """Litestar's validation ``message`` about argument ``key``, with each value the client sent for it
    passed through :func:`ledger.errors.shorten` where the message repeats it (msgspec's
    ``Invalid enum value 'zzz…'`` repeated a 5,000-character ``state=`` whole)."""
    text = str(message)
    name = str(_client_name(request, key))
    sent = [*request.query_params.getall(name, []), *([str(request.path_params[name])]
                                                      if name in request.path_params else [])]
    for value in sent:
        if len(value) > MAX_ECHO_CHARS and value in text:
            text = text.replace(value, shorten(value))
    return text


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    detail = exc.detail
    extra = exc.extra
    status = exc.status_code
    if isinstance(extra, list) and extra:
        # Litestar's parameter validation: [{"message": ..., "key": ..., "source": ...}], one per value it
        # could not take; a 422 like every other unusable value (the module docstring gives the rule).
        parts = [f"{_client_name(request, e.get('key'))}: {_cut_echoes(request, e.get('key'), e.get('message'))}"
                 f"{_choices(request, e.get('key'))}" for e in extra if isinstance(e, dict)]
        detail = "; ".join(parts) or detail
        status = 422
    elif isinstance(detail, str) and detail.startswith("Missing required "):
        detail = _missing(request, detail)
    headers = dict(exc.headers or {})
    for name in [h for h in headers if h.lower() == "allow"]:
        # A 405 lists the route's methods in the router's order (OPTIONS first); OPTIONS answers them sorted
        # (GET, HEAD, OPTIONS). One order for both: a client comparing the two sees one set.
        headers[name] = ", ".join(sorted(m.strip() for m in headers[name].split(",") if m.strip()))
    return _problem(status, str(detail), headers=headers or None)


def _missing(request: Request[Any, Any, Any], detail: str) -> str:
    """Litestar's 400 for a missing parameter, naming every required query parameter the request lacks
    (:func:`api.parameters.required_query_names`, in declaration order), where Litestar names the first it
    meets: ``Missing required query parameters 'from' and 'to'``.

    Another kind of parameter (a header), or none found missing, keeps Litestar's words without the path:
    ``Missing required query parameter 'from' for path /v1/usage?to=...`` repeats, with the query string
    Litestar appends, what the client sent; the parameter's name is the news.
    """
    if detail.startswith("Missing required query parameter "):
        handler = request.route_handler
        given = request.query_params
        missing = [name for name in required_query_names(handler, frozenset(request.path_params))
                   if name not in given]
        if len(missing) == 1:
            return f"Missing required query parameter {missing[0]!r}"
        if missing:
            return f"Missing required query parameters {', '.join(map(repr, missing[:-1]))} and {missing[-1]!r}"
    return detail.split(" for path ", 1)[0]


def _phrase(status: int) -> str:
    """The HTTP status phrase of ``status`` (RFC 9110): the title RFC 9457 asks for with type ``about:blank``."""
    return UNPROCESSABLE if status == 422 else HTTPStatus(status).phrase if status in _KNOWN_STATUSES else "Error"


UNPROCESSABLE = "Unprocessable Content"
"""RFC 9110's phrase for 422 (Python 3.11's ``HTTPStatus`` still says "Unprocessable Entity", RFC 4918's)."""
_KNOWN_STATUSES = frozenset(s.value for s in HTTPStatus)


async def html_error_as_problem(response: Response[Any]) -> Response[Any]:
    """Turn an HTML 404 page into problem details (``after_request`` of the whole app).

    Litestar's OpenAPI router answers a name under ``/schema`` that no page has with an HTML 404 page that it returns
    itself, not by raising, so the handlers above never see it. The API answers every error as RFC 9457 problem
    details and never with HTML, so that page is replaced. Other responses pass unchanged.

    A coroutine though it awaits nothing: Litestar runs a plain function hook in its thread pool, for every
    response, so when report requests filled the pool even ``/healthz`` waited for a thread.
    """
    media_type = response.media_type  # a str, or a MediaType member (a str whose str() is its name)
    if response.status_code == 404 and isinstance(media_type, str) and media_type.startswith("text/html"):
        return _problem(404, "no such page; the API description is at /schema (/schema/openapi.json)")
    return response


CLIENT_CLOSED_REQUEST = 499
"""The status of a request whose client closed its connection before the answer (nginx's convention): never
sent, since nobody reads it, but it is what the access log shows."""


_access_log = logging.getLogger("uvicorn.access")
"""uvicorn's access log: it writes no line for an answer sent after the client left (its ``send`` returns first),
so the 499 of :func:`_client_gone` is written here, as uvicorn writes its lines."""


def _client_gone(request: Request[Any, Any, Any], _: ClientGone) -> Response[Any]:
    scope: Any = request.scope  # an HTTP scope: uvicorn's helpers take its TypedDict, Litestar's differs
    # The line uvicorn writes, from uvicorn's own helpers: client address, method, target, HTTP version, status.
    _access_log.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                     get_path_with_query_string(scope), scope["http_version"], CLIENT_CLOSED_REQUEST)
    return Response(None, status_code=CLIENT_CLOSED_REQUEST)


def _internal(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    _log.exception("unhandled error", exc_info=exc)
    return _problem(500, "the ledger failed to answer; see the server log")


EXCEPTION_HANDLERS: dict[int | type[Exception], Callable[[Request[Any, Any, Any], Any], Response[Any]]] = {
    LedgerError: _ledger_error,
    HTTPException: _http_error,
    ClientGone: _client_gone,
    Exception: _internal,
}
"""Handlers registered on the app (most specific class wins)."""


def problem_details_plugin() -> ProblemDetailsPlugin:
    """The Litestar plugin that renders :class:`ProblemDetailsException` (used for 401 and 403)."""
    return ProblemDetailsPlugin(ProblemDetailsConfig())


def problem_responses(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI documentation of the problem-details answers a handler can give (for ``responses=``)."""
    from api.schemas import Problem

    reasons = {
        400: "A query parameter the endpoint does not take, one given more than once, or a required one missing.",
        401: "No bearer token, or an unknown one (when tokens are configured).",
        403: "The token may not read this resource.",
        404: "The named object was never recorded.",
        422: "A parameter's value is not one it can take (not a number, out of range, not one of the listed "
        "values, a bad time or duration, an empty window or cluster, a foreign pageToken, a NUL character).",
        503: "The ledger database is not reachable, every database connection of this API process is in use, a "
        "rebuild of the read models has held them for 5 s, or (whole-fleet reports) the process is computing as "
        "many reports at once as it may; retry after Retry-After seconds.",
    }
    return {
        code: ResponseSpec(
            data_container=Problem, description=reasons[code], media_type=PROBLEM_JSON, generate_examples=False
        )
        for code in codes
    }


V1_PROBLEMS = problem_responses(400, 401, 422, 503)
"""What every ``/v1`` read may answer besides 200."""
V1_NOT_FOUND = problem_responses(400, 401, 404, 422, 503)
"""... and for reads of one named object, or filtered by one that must exist (occupancy's ``deviceClass``)."""
V1_FORBIDDEN = problem_responses(400, 401, 403, 422, 503)
"""... and for reads a team-limited token may not make."""

__all__ = [
    "EXCEPTION_HANDLERS",
    "PROBLEM_JSON",
    "V1_FORBIDDEN",
    "V1_NOT_FOUND",
    "V1_PROBLEMS",
    "ProblemDetailsException",
    "problem_details_plugin",
    "problem_responses",
]
