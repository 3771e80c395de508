"""Per-session credentials: ``POST /api/v1/sessions/{id}/token`` (operator token only)
issues a signed, expiring token that reads that session's messages and live stream —
nothing else. A browser web-chat client gets one from its chat layer instead of the
operator token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Path, Request, Response
from pydantic import BaseModel, Field

from dashboard import tokens
from dashboard.api_jobs import actor_of, services_of
from dashboard.auth import identity_of
from dashboard.errors import ApiError
from dashboard.guard import BROWSER_SESSION
from jobs import audit

router = APIRouter(prefix="/api/v1")


class TokenRequest(BaseModel):
    ttl_sec: int = Field(default=tokens.DEFAULT_TTL_SEC, ge=60, le=tokens.MAX_TTL_SEC)


@router.post("/sessions/{session_id}/token")
async def session_token(
    request: Request,
    session_id: str = Path(min_length=1, max_length=255),
    body: TokenRequest | None = Body(None),
) -> dict[str, Any]:
    """``{"token", "session_id", "expires_at"}``; send it as ``Authorization: Bearer``
    (or ``?token=`` on the event stream)."""
    ttl = (body or TokenRequest()).ttl_sec
    key: tokens.TokenKey = request.app.state.token_key
    token, expires = tokens.issue(key.get(), session_id, ttl)
    async with services_of(request).sessionmaker() as s:
        audit.record(
            s,
            action="session_token",
            target=session_id[:255],
            actor=actor_of(request),
            details={"ttl_sec": ttl, "expires_at": expires},
        )
        await s.commit()
    return {"token": token, "session_id": session_id, "expires_at": expires}


@router.get("/session")
async def browser_session_state(request: Request) -> dict[str, Any]:
    """The caller's identity, whether the page's session cookie signed it in (then it can
    sign out), and ``language``: SKILLJOBS_LANGUAGE when set (else the page follows the
    browser's language)."""
    ident = identity_of(request)
    settings = request.app.state.settings
    return {
        "kind": ident.kind,
        "actor": ident.actor,
        "can_change": ident.can_change,
        "browser_session": bool(request.scope.get(BROWSER_SESSION)),
        "language": settings.language if "language" in settings.model_fields_set else None,
    }


@router.post("/session")
async def browser_session(request: Request, response: Response) -> dict[str, Any]:
    """Sign the page in for this browser session: called with ``Authorization: Bearer
    <admin or read token>``, it sets an HttpOnly, SameSite=Strict cookie that every tab of
    this browser sends (until the browser closes, 12 h at most, or the token changes), so
    the token is typed once and never kept in page script storage."""
    ident = identity_of(request)
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if ident.kind not in ("admin", "read") or scheme.lower() != "bearer" or not token.strip():
        if request.scope.get(BROWSER_SESSION):
            return {"kind": ident.kind, "actor": ident.actor, "can_change": ident.can_change}
        raise ApiError(403, "sign in with the admin or read token (Authorization: Bearer …)")
    key: tokens.TokenKey = request.app.state.token_key
    value = tokens.issue_browser(key.get(), ident.kind, token.strip())
    response.set_cookie(
        tokens.COOKIE,
        value,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return {"kind": ident.kind, "actor": ident.actor, "can_change": ident.can_change}


@router.delete("/session")
async def end_browser_session(response: Response) -> dict[str, Any]:
    """Sign the page out: the cookie is cleared."""
    response.delete_cookie(tokens.COOKIE, path="/", httponly=True, samesite="strict")
    return {"ok": True}
