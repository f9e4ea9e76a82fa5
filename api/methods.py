"""``HEAD`` answered like ``GET``, without the body (RFC 9110 §9.3.2).

Litestar 2 routes ``HEAD`` only to handlers registered for it, and its ``@head`` decorator wants a handler
that returns no body, which would mean a second handler per endpoint computing the same headers. Instead
every read is registered for both methods with :func:`read` (Litestar's own multi-method routes): a
``HEAD`` runs the ``GET`` handler, so status and headers, ``Content-Type`` and ``Content-Length`` included,
are the ones ``GET`` would send (a server may send the ``GET`` length on a ``HEAD``, RFC 9110 §8.6).
Litestar hands the body to the server as for ``GET``; the HTTP server leaves it out, as HTTP/1.1 framing
requires (uvicorn writes no body bytes for a ``HEAD``, with h11 and with httptools; tested against
``dra-ledger serve``'s server in ``tests/api/test_serve_http.py``).

The OpenAPI pages under ``/schema`` are made by Litestar's OpenAPI plugin, which registers each for ``GET``
only. :class:`JsonRenderPluginWithHead` uses the hook Litestar gives render plugins to add routes to that
router (``OpenAPIRenderPlugin.receive_router``) to register a ``HEAD`` twin of each: the same function,
so the same status and headers as ``GET``. One trace of the twins being added afterwards: ``OPTIONS`` on a
schema page still answers ``Allow: GET, OPTIONS``, because Litestar makes a route's ``OPTIONS`` handler
when its first handler is registered and keeps it when another method joins the route.
"""

from __future__ import annotations

from typing import Any

from litestar import HttpMethod, Router, route
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.routes import HTTPRoute
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


class JsonRenderPluginWithHead(JsonRenderPlugin):
    """Litestar's render plugin of ``/schema/openapi.json`` that also answers ``HEAD`` on every schema page.

    Give it last in ``OpenAPIConfig.render_plugins``: Litestar calls each plugin's :meth:`receive_router`
    in that order, after registering every page (``/schema``, ``/schema/openapi.json``, the viewers, the
    ``/schema/{path}`` 404 page), and a plugin after it could still add a ``GET`` route (Swagger adds
    ``/schema/oauth2-redirect.html``) that would then have no ``HEAD`` twin.
    """

    def receive_router(self, router: Router) -> None:
        """Register on the schema ``router`` a ``HEAD`` route for each ``GET`` handler it holds.

        Each twin runs the ``GET`` handler's function with its paths and media type (a ``HEAD`` route, as
        :func:`read` makes, whose body the server leaves out), outside the OpenAPI document like the pages.

        Args:
            router: the router Litestar built for ``OpenAPIConfig.path`` (``/schema``).
        """
        handlers = {id(h): h for r in router.routes if isinstance(r, HTTPRoute) for h in r.route_handlers
                    if HttpMethod.GET in h.http_methods and HttpMethod.HEAD not in h.http_methods}
        for r in router.routes:
            if isinstance(r, HTTPRoute) and any(id(h) in handlers for h in r.route_handlers):
                # Litestar's OPTIONS answer lists the methods of the route it was made for ("GET, OPTIONS"), and
                # register() keeps it when it merges the HEAD twin into a new route: without it, the new route
                # makes its own, which lists HEAD too (as a 405 on the same path does).
                r.route_handlers[:] = [h for h in r.route_handlers if set(h.http_methods) != {HttpMethod.OPTIONS}]
        for handler in handlers.values():
            router.register(route(sorted(handler.paths), http_method=[HttpMethod.HEAD], media_type=handler.media_type,
                                  sync_to_thread=False, include_in_schema=False)(handler.fn))
