"""Operator actions on workers (CLI ``skilljobs workers`` and the dashboard), each in the
audit trail:

* **pause** — the worker finishes what it runs and claims nothing new until resumed;
* **resume** — it claims jobs again (this also calls off a drain still under way);
* **drain** — it claims nothing new, finishes what it runs, then exits.

They are Redis flags (``worker-pause:<id>``, ``worker-drain:<id>``) that the worker reads
where it decides to claim, at most once a second.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select

from jobs import audit
from jobs.constants import WORKER_DRAIN, WORKER_PAUSE
from jobs.models import Worker
from jobs.queue import broker
from jobs.services import Services

FLAG_TTL_S = 30 * 86400  # a flagged worker that never comes back leaves no key forever
ACTIONS = ("pause", "resume", "drain")
ALIVE_S = 30.0  # a heartbeat older than this: the worker is shown stale


class WorkerControlError(Exception):
    """An action that cannot be taken now; ``status_code`` is the HTTP status to answer."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def _redis(svc: Services) -> Any:
    if svc.redis is None:
        raise WorkerControlError(
            "Redis is not connected: workers cannot be paused or drained now", 503
        )
    return svc.redis


async def states(svc: Services, worker_ids: list[str]) -> dict[str, dict[str, bool]]:
    """``{id: {"paused", "draining"}}`` for the given workers (one Redis round trip)."""
    if not worker_ids:
        return {}
    keys = [
        svc.settings.key(flag, wid) for wid in worker_ids for flag in (WORKER_PAUSE, WORKER_DRAIN)
    ]
    flags = await _redis(svc).mget(keys)
    return {
        wid: {"paused": flags[2 * i] is not None, "draining": flags[2 * i + 1] is not None}
        for i, wid in enumerate(worker_ids)
    }


async def list_workers(svc: Services, *, limit: int = 500) -> list[dict[str, Any]]:
    """Workers, latest heartbeat first, each with ``state`` (``alive``, ``stale``,
    ``stopped``), what it runs, and whether it is paused or draining."""
    async with svc.sessionmaker() as session:
        rows = list(
            await session.scalars(
                select(Worker).order_by(Worker.last_heartbeat.desc()).limit(limit)
            )
        )
    flags = await states(svc, [w.id for w in rows])
    beats = await broker.heartbeats(svc, [w.id for w in rows])
    now = time.time()
    return [
        {
            "id": w.id,
            "host": w.host,
            "pid": w.pid,
            "started_at": w.started_at,
            "last_heartbeat": w.last_heartbeat,
            "running": list(w.running or []),
            **vitals(beat),
            "state": "stopped"
            if w.stopped_at is not None
            else "alive"
            if now - w.last_heartbeat <= ALIVE_S
            else "stale",
            **flags[w.id],
        }
        for w, beat in zip(rows, beats, strict=True)
    ]


VITALS = ("concurrency", "processed", "failed", "rss_bytes", "version")


def vitals(beat: dict[str, Any]) -> dict[str, Any]:
    """What a live worker's heartbeat key says of it (None when the key is gone)."""
    return {k: beat.get(k) for k in VITALS}


async def forget(svc: Services, worker_id: str, *, actor: str) -> dict[str, Any]:
    """Remove a worker that is no longer running from the list (audited); one whose
    heartbeat is fresh is refused."""
    async with svc.sessionmaker() as session:
        worker = await session.get(Worker, worker_id)
        if worker is None:
            raise WorkerControlError(f"no worker {worker_id}", 404)
        if worker.stopped_at is None and time.time() - worker.last_heartbeat <= ALIVE_S:
            raise WorkerControlError(
                f"worker {worker_id} is alive: drain it first, then forget it once stopped",
                409,
            )
        await session.delete(worker)
        audit.record(session, action="worker.forget", target=worker_id, actor=actor)
        await session.commit()
    if svc.redis is not None:
        await svc.redis.delete(
            svc.settings.key(WORKER_PAUSE, worker_id), svc.settings.key(WORKER_DRAIN, worker_id)
        )
    return {"ok": True, "id": worker_id, "forgotten": True}


async def act(svc: Services, action: str, worker_id: str, *, actor: str) -> dict[str, Any]:
    """Pause, resume or drain ``worker_id``: ``{"ok", "id", "paused", "draining"}``."""
    if action not in ACTIONS:
        raise WorkerControlError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}", 422)
    async with svc.sessionmaker() as session:
        worker = await session.get(Worker, worker_id)
    if worker is None:
        raise WorkerControlError(f"no worker {worker_id}", 404)
    if worker.stopped_at is not None and action != "resume":
        raise WorkerControlError(f"worker {worker_id} has stopped: nothing to {action}", 409)
    redis = _redis(svc)
    pause_key = svc.settings.key(WORKER_PAUSE, worker_id)
    drain_key = svc.settings.key(WORKER_DRAIN, worker_id)
    if action == "resume":
        await redis.delete(pause_key, drain_key)
    else:
        await redis.set(pause_key if action == "pause" else drain_key, actor, ex=FLAG_TTL_S)
    async with svc.sessionmaker() as s:
        audit.record(s, action=f"worker.{action}", target=worker_id, actor=actor)
        await s.commit()
    now = (await states(svc, [worker_id]))[worker_id]
    return {"ok": True, "id": worker_id, **now}
