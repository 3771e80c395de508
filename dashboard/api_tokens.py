"""Per-session credentials: ``POST /api/v1/sessions/{id}/token`` (operator token only)
issues a signed, expiring token that reads that session's messages and live stream —
nothing else. A browser web-chat client gets one from its chat layer instead of the
operator token."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Path, Request
from pydantic import BaseModel, Field

from dashboard import tokens
from dashboard.api_jobs import actor_of, services_of
from jobs.models import OpsAction

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
        s.add(
            OpsAction(
                action="session_token",
                target=session_id[:255],
                actor=actor_of(request),
                details={"ttl_sec": ttl, "expires_at": expires},
            )
        )
        await s.commit()
    return {"token": token, "session_id": session_id, "expires_at": expires}
