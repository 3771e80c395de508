"""Skills API: the loaded skills with their pause state, and pause / resume per skill
(``jobs.queue.pauses``: workers stop claiming a paused skill's jobs; audited)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from dashboard.api_jobs import actor_of, services_of
from dashboard.errors import ApiError
from jobs.queue import pauses

router = APIRouter(prefix="/api/v1")


@router.get("/skills")
async def list_skills(request: Request) -> dict[str, Any]:
    """Every loaded skill: name, type, whether it runs in the background, load error, and
    ``paused``."""
    svc = services_of(request)
    paused = await pauses.paused_skills(svc, required=False)
    items = [
        {
            "name": s.name,
            "type": s.skill_type.value,
            "async": s.is_async,
            "category": s.category,
            "error": s.error,
            "paused": s.name in paused,
        }
        for s in svc.registry
    ]
    return {"items": items, "paused": sorted(paused)}


async def _act(request: Request, fn: Any, skill: str) -> dict[str, Any]:
    try:
        result: dict[str, Any] = await fn(services_of(request), skill, actor=actor_of(request))
    except LookupError as exc:
        raise ApiError(404, str(exc.args[0] if exc.args else exc)) from exc
    return result


@router.post("/skills/{skill}/pause")
async def pause_skill(skill: str, request: Request) -> dict[str, Any]:
    """Workers take none of the skill's jobs (they stay queued) until it is resumed."""
    return await _act(request, pauses.pause, skill)


@router.post("/skills/{skill}/resume")
async def resume_skill(skill: str, request: Request) -> dict[str, Any]:
    """Workers take the skill's jobs again, in the order they were queued."""
    return await _act(request, pauses.resume, skill)
