"""Start-rate and concurrency limits at run time (``jobs.queue.rates``): list, set, unset."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError
from jobs.queue import rates

router = APIRouter(prefix="/api/v1")


class LimitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rate: str | None = Field(default=None, max_length=32, description='e.g. "2/10s", "30/m"')
    concurrency: int | None = Field(default=None, ge=1, le=rates.MAX_CONCURRENCY)


@router.get("/limits")
async def list_limits(request: Request) -> dict[str, Any]:
    """The limits in force: ``SKILLJOBS_LIMITS`` with the run-time ones over it."""
    return {"items": await rates.items(services_of(request))}


@router.put("/limits/{key}")
async def put_limit(key: str, body: LimitBody, request: Request) -> dict[str, Any]:
    """Set the start rate and/or concurrency of ``key`` (applies within a second)."""
    svc = services_of(request)
    try:
        await rates.set_limit(
            svc.sessionmaker,
            key,
            rate=body.rate,
            concurrency=body.concurrency,
            actor=actor_of(request),
        )
    except rates.LimitError as exc:
        raise ApiError(400, str(exc)) from exc
    item = next(i for i in await rates.items(svc) if i["key"] == key)
    return {"ok": True, **item}


@router.delete("/limits/{key}")
async def delete_limit(key: str, request: Request) -> dict[str, Any]:
    """Remove the run-time limit of ``key`` (``SKILLJOBS_LIMITS`` applies again)."""
    svc = services_of(request)
    try:
        removed = await rates.unset_limit(svc.sessionmaker, key, actor=actor_of(request))
    except rates.LimitError as exc:
        raise ApiError(400, str(exc)) from exc
    return {"ok": True, "key": key, "removed": removed}
