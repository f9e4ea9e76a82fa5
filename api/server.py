"""What ``dra-ledger serve`` hands uvicorn: the app, wrapped so that a forced exit ends its lifespan quietly."""

from __future__ import annotations

import asyncio
from typing import cast

from litestar import Litestar
from litestar.types import LifeSpanReceive, LifeSpanReceiveMessage, LifeSpanScope, LifeSpanSend, Receive, Scope, Send

from api.app import create_app_for_worker


class LifespanEndsOnCancel:
    """``app`` as an ASGI app whose lifespan, cancelled while it waits for the server's shutdown message, takes the
    cancel for that message: it runs the app's shutdown hook and reports a shutdown complete.

    Why: a forced exit (a second Ctrl-C while uvicorn stops, 10-50 ms after the first) skips uvicorn's lifespan
    shutdown; the lifespan still waited when the event loop closed and cancelled it, and Litestar reported a failed
    shutdown that uvicorn logged as ``ERROR: Traceback ... CancelledError`` while ``serve`` exited 0. The cancel
    comes from the loop closing, so there is nothing left for the lifespan to do but end; the shutdown hook is
    instant (:func:`api.app.create_app`: ``gc.unfreeze``). Requests (every other scope) pass through untouched.
    """

    def __init__(self, app: Litestar) -> None:
        self.app = app

    async def __call__(self, scope: Scope | LifeSpanScope, receive: Receive | LifeSpanReceive,
                       send: Send | LifeSpanSend) -> None:
        """Serve ``scope`` (ASGI 3) with :attr:`app`."""
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        lifespan_receive = cast("LifeSpanReceive", receive)  # a lifespan scope comes with the lifespan's receive

        async def received() -> LifeSpanReceiveMessage:
            try:
                return await lifespan_receive()
            except asyncio.CancelledError:  # the loop is closing: shut down, as the server would have asked
                return {"type": "lifespan.shutdown"}

        await self.app(scope, received, send)


def worker_app() -> LifespanEndsOnCancel:
    """The app factory uvicorn calls in each worker process of ``dra-ledger serve --workers N``: the app of
    :func:`api.app.create_app_for_worker` in :class:`LifespanEndsOnCancel`.

    Raises:
        Invalid: as :func:`api.app.create_app_for_worker`.
    """
    return LifespanEndsOnCancel(create_app_for_worker())
