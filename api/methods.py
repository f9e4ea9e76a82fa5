"""``HEAD`` answered like ``GET``, without the body (RFC 9110 §9.3.2).

Litestar 2 routes ``HEAD`` only to handlers registered for it, and its ``@head`` decorator wants a handler
that returns no body, which would mean a second handler per endpoint computing the same headers. Instead
every read is registered for both methods with :func:`read` (Litestar's own multi-method routes): a
``HEAD`` runs the ``GET`` handler, so status and headers, ``Content-Type`` and ``Content-Length`` included,
are the ones ``GET`` would send (a server may send the ``GET`` length on a ``HEAD``, RFC 9110 §8.6).
Litestar hands the body to the server as for ``GET``; the HTTP server leaves it out, as HTTP/1.1 framing
requires (uvicorn writes no body bytes for a ``HEAD``, with h11 and with httptools; tested against
``dra-ledger serve``'s server in ``tests/api/test_serve_http.py``).
"""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, route
from litestar.handlers import HTTPRouteHandler
from litestar.types import Method
from litestar.types.internal_types import PathParameterDefinition


def head_operation_id(get_operation_id: str) -> str:
    """The OpenAPI ``operationId`` of the ``HEAD`` twin of ``GET`` operation ``get_operation_id``:
    ``getOccupancy`` → ``headOccupancy``, ``listEvents`` → ``headListEvents``."""
    rest = get_operation_id.removeprefix("get")
    return "head" + rest[:1].upper() + rest[1:]


def read(path: str | None = None, *, operation_id: str, **kwargs: Any) -> HTTPRouteHandler:
    """Litestar's ``@route`` for ``GET`` and ``HEAD``: the decorator every read endpoint uses instead of ``@get``.

    Args:
        path: as for ``@get``.
        operation_id: the ``GET`` operation's ``operationId``; the ``HEAD`` one is :func:`head_operation_id`
            (OpenAPI wants each unique).
        kwargs: any other ``@get`` argument (``responses``, ``summary``, ``sync_to_thread``, ...).

    Returns:
        The route handler decorator; the server sends its ``HEAD`` answers without the body.
    """

    def operation_ids(_: HTTPRouteHandler, method: Method, __: list[str | PathParameterDefinition]) -> str:
        return head_operation_id(operation_id) if method == HttpMethod.HEAD else operation_id

    return route(path, http_method=[HttpMethod.GET, HttpMethod.HEAD], operation_id=operation_ids, **kwargs)
