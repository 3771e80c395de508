"""Pause per skill (operator action, CLI and dashboard): workers stop claiming a paused
skill's jobs, which stay queued (parked in Redis by ``jobs.queue.broker``) until it is
resumed. Each change is recorded in the audit trail."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from typing import Any, cast

from jobs import audit
from jobs.queue import broker
from jobs.services import Services, connect_redis
from jobs.settings import Settings


class UnknownSkill(LookupError):
    """Neither a skill of the registry nor one with jobs waiting."""


async def _audit(svc: Services, action: str, skill: str, actor: str, **details: Any) -> None:
    async with svc.sessionmaker() as s:
        audit.record(s, action=action, target=skill, actor=actor, details=details)
        await s.commit()


def _known(svc: Services, skill: str) -> None:
    if svc.registry.get(skill) is None:
        raise UnknownSkill(f"no skill {skill!r} (see `skilljobs skills list`)")


async def pause(svc: Services, skill: str, *, actor: str = "") -> dict[str, Any]:
    """Workers take none of ``skill``'s jobs until :func:`resume`; running ones finish."""
    _known(svc, skill)
    changed = await broker.pause_skill(svc, skill)
    await _audit(svc, "skill.pause", skill, actor, changed=changed)
    return {"skill": skill, "paused": True, "changed": changed}


async def resume(svc: Services, skill: str, *, actor: str = "") -> dict[str, Any]:
    """Workers take ``skill``'s jobs again, in the order they were queued."""
    paused = await broker.paused_skills(svc)
    if skill not in paused:
        _known(svc, skill)
    requeued = await broker.resume_skill(svc, skill)
    await _audit(svc, "skill.resume", skill, actor, changed=skill in paused, requeued=requeued)
    return {"skill": skill, "paused": False, "changed": skill in paused, "requeued": requeued}


async def paused_skills(svc: Services, *, required: bool = True) -> set[str]:
    """The paused skills. ``required=False`` (what a listing shows beside the jobs): an
    empty set when Redis is not connected or not reachable."""
    if svc.redis is not None:
        if required:
            return await broker.paused_skills(svc)
        with contextlib.suppress(Exception):
            return await broker.paused_skills(svc)
        return set()
    if required:
        raise RuntimeError("no Redis connection: the paused skills live in Redis")
    return await _peek(svc)


async def _peek(svc: Services) -> set[str]:
    """Read the paused skills over a connection of its own, giving up quietly."""
    found = await peek(svc.settings)
    return found or set()


async def peek(settings: Settings) -> set[str] | None:
    """The paused skills read over a short-lived connection; None when Redis is not
    configured or does not answer within 2 s."""
    import asyncio

    if not settings.redis_url:
        return None
    try:
        async with asyncio.timeout(2):
            redis = await connect_redis(settings, retries=0)
    except Exception:
        return None
    try:
        raw = await cast("Awaitable[set[Any]]", redis.smembers(settings.queue_name + ":paused"))
        return {v.decode() if isinstance(v, bytes) else str(v) for v in raw}
    except Exception:
        return None
    finally:
        await redis.aclose()
