"""Bearer-token access (SPEC §11 Tokens): health checks are open, everything else needs
``Authorization: Bearer <token>`` when a token is configured. Server-sent event streams
also take ``?token=`` because a browser ``EventSource`` cannot set headers."""

from __future__ import annotations

import hmac

from fastapi import Request

from jobs.settings import Settings


class AuthError(Exception):
    """Missing or wrong token (answered with 401 and an error envelope)."""


def expected_token(settings: Settings) -> str | None:
    token = settings.api_token.get_secret_value() if settings.api_token else ""
    return token or None


def token_matches(settings: Settings, supplied: str | None) -> bool:
    expected = expected_token(settings)
    if expected is None:
        return True
    if not supplied:
        return False
    return hmac.compare_digest(supplied.encode(), expected.encode())


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def _check(request: Request, supplied: str | None) -> None:
    settings: Settings = request.app.state.settings
    if token_matches(settings, supplied):
        return
    if supplied:
        raise AuthError("the API token is wrong")
    raise AuthError("an API token is required: send 'Authorization: Bearer <token>'")


async def require_token(request: Request) -> None:
    """Dependency for the JSON API, page data and ``/metrics``."""
    _check(request, _bearer(request))


async def require_token_or_query(request: Request) -> None:
    """Dependency for event streams: the header, or ``?token=``."""
    _check(request, _bearer(request) or request.query_params.get("token"))
