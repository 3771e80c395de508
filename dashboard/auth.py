"""Bearer-token access (SPEC §11 Tokens). The decision is made by ``dashboard.guard``
from the request head, before any body is read; these dependencies are the routes'
backstop (a route reached without an identity is refused) and give handlers the caller's
identity (admin / read / session), which is also the audit trail's actor."""

from __future__ import annotations

from fastapi import Request

from dashboard.guard import IDENTITY
from dashboard.tokens import Identity


class AuthError(Exception):
    """Missing or wrong token (answered with 401 and an error envelope)."""


def identity_of(request: Request) -> Identity:
    identity = request.scope.get(IDENTITY)
    if not isinstance(identity, Identity):
        raise AuthError("an API token is required: send 'Authorization: Bearer <token>'")
    return identity


async def require_token(request: Request) -> None:
    """Dependency for the JSON API, page data and ``/metrics``."""
    identity_of(request)


async def require_token_or_query(request: Request) -> None:
    """Dependency for event streams (the guard also takes ``?token=`` there, because a
    browser ``EventSource`` cannot set headers)."""
    identity_of(request)
