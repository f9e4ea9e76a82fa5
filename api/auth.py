"""Bearer-token authentication and team scoping.

Tokens come from the configuration file (``[[api.tokens]]``). A request to ``/v1`` must carry
``Authorization: Bearer <token>`` when any token is configured; a token with ``teams`` sees only those
teams' rows and totals. Tokens are compared with :func:`hmac.compare_digest` against every configured
token (constant time per token) and never logged. With no tokens configured the API is open, and
``dra-ledger serve`` then refuses to bind anywhere but loopback unless told otherwise.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler

from ledger.config import LedgerConfig


@dataclass(frozen=True, slots=True)
class Access:
    """Who is asking: ``teams`` is ``None`` for full access, else the teams whose rows are visible."""

    name: str
    teams: frozenset[str] | None

    def sees(self, team: object) -> bool:
        """Whether a row billed to ``team`` is visible."""
        return self.teams is None or team in self.teams


OPEN = Access(name="anonymous", teams=None)


@dataclass(frozen=True, slots=True)
class TokenTable:
    """Configured tokens by their SHA-256 digest (the clear text is not kept)."""

    entries: tuple[tuple[bytes, Access], ...]

    @classmethod
    def from_config(cls, config: LedgerConfig) -> TokenTable:
        """Build the table from ``config.api.tokens`` (reading ``tokenEnv`` variables now).

        Raises:
            Invalid: a ``tokenEnv`` variable is unset or too short, or two entries have the same token
                (:meth:`ledger.config.ApiConfig.secrets`): one request must match one entry only.
        """
        entries = []
        for token, secret in zip(config.api.tokens, config.api.secrets(), strict=True):
            digest = hashlib.sha256(secret.encode()).digest()
            entries.append(
                (digest, Access(name=token.name, teams=frozenset(token.teams) if token.teams is not None else None))
            )
        return cls(entries=tuple(entries))

    @property
    def enabled(self) -> bool:
        """Whether any token is configured (else the API is open)."""
        return bool(self.entries)

    def check(self, headers: Sequence[str]) -> Access:
        """Return the access of the bearer token in the request's ``Authorization`` header.

        Args:
            headers: every ``Authorization`` field of the request, in the order sent (none, one, or more).

        Raises:
            NotAuthorizedException: no token, a malformed header, an unknown token, or more than one
                ``Authorization`` field (401): the field holds one credential (RFC 9110 §11.6.2), and taking the
                first or the last of two would let the order decide who is asking.
        """
        if not self.enabled:
            return OPEN
        if len(headers) > 1:
            raise NotAuthorizedException(f"the Authorization header was sent {len(headers)} times; send one bearer "
                                         "token", headers={"WWW-Authenticate": "Bearer"})
        header = headers[0] if headers else None
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise NotAuthorizedException("a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
        digest = hashlib.sha256(value.strip().encode()).digest()
        found: Access | None = None
        for known, access in self.entries:  # compare with every token: timing does not reveal which matched
            if hmac.compare_digest(known, digest):
                found = access
        if found is None:
            raise NotAuthorizedException("the bearer token is not valid", headers={"WWW-Authenticate": "Bearer"})
        return found


def require_token(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """Litestar guard on ``/v1``: authenticates and stores the :class:`Access` in ``connection.state``.

    ``OPTIONS`` is let through without a token: Litestar answers it with the route's ``Allow`` list only
    (204, no body), which says no more than the open OpenAPI document, and a CORS preflight never carries
    credentials (Fetch standard), so refusing it would only turn a browser's preflight into a 401. The API
    sends no CORS headers, so a browser still refuses the cross-origin request that follows.

    Raises:
        NotAuthorizedException: (401) see :meth:`TokenTable.check`.
    """
    if connection.scope.get("method") == "OPTIONS":
        return
    table: TokenTable = connection.app.state.tokens
    connection.state.access = table.check(connection.headers.getall("authorization", []))


def provide_access(request: Request[Any, Any, Any]) -> Access:
    """Dependency: the :class:`Access` the guard stored for this request."""
    access = getattr(request.state, "access", None)
    return access if isinstance(access, Access) else OPEN
