"""Idempotent dispatch: a chat layer that retries a dispatch (timeout, reconnect) gets the
same receipt, never a second job.

Keys are scoped to the caller (:func:`scoped`): org, role, channel and actor (or web
session) — the same key from another caller is another request. A key is claimed by inserting its row (the primary key makes concurrent claims race to one
winner, on PostgreSQL and SQLite alike) in the transaction that records its job
(:func:`jobs.queue.store.record_jobs`), so a new key costs no statement of its own; when it
is already taken, :func:`claim` finds out what it stands for. A later dispatch with
the same key within ``WINDOW_SEC`` gets the job the key names; with a different skill or
input it is a conflict. A key whose window has passed, or whose dispatcher died before
recording its job, is taken over by a conditional update (one taker wins).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, exists, select, text, update

from jobs.db import Sessions, engine_of, insert_new, is_sqlite, rowcount
from jobs.models import DispatchKey, Job

WINDOW_SEC = 24 * 3600.0
MAX_KEY = 255
RECORD_WAIT_SEC = 5.0  # how long a duplicate waits for the first dispatch to record its job


@dataclass(frozen=True)
class Claim:
    """What a key stands for: ``new`` means this dispatch records ``job_id`` itself."""

    job_id: str
    new: bool
    conflict: bool = False


def request_hash(skill: str, input_data: dict[str, Any]) -> str:
    """The identity of a request under a key: the skill and its input."""
    raw = json.dumps([skill, input_data], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


SCOPE_FIELDS = ("org_id", "role_id", "channel", "actor_key", "session_id")


def scoped(key: str, ctx: dict[str, Any]) -> str:
    """The key as stored: bound to its caller (organization, role, channel and the actor —
    its ``actor_key``, or the chat session for web callers). The same key sent by another
    caller names another request, so it can neither reach nor block a stranger's job."""
    parts = [str(ctx.get(name) or "") for name in SCOPE_FIELDS]
    raw = "\x1f".join([*parts, key])
    return "k1:" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot be an idempotency key, or None."""
    if not isinstance(key, str) or not key.strip():
        return "idempotency_key must be a non-empty string"
    if len(key) > MAX_KEY:
        return f"idempotency_key is longer than {MAX_KEY} characters"
    return None


async def _insert(sm: Sessions, key: str, digest: str, job_id: str, now: float) -> bool:
    """Claim a new key: one statement, no error when the key exists (False then)."""
    stmt = insert_new(sm, DispatchKey).values(
        key=key, job_id=job_id, request_hash=digest, created_at=now
    )
    async with sm() as s:
        if not is_sqlite(engine_of(sm)):
            # No wait for the WAL flush: the claim becomes durable with the job's own
            # commit (which flushes all WAL before it); a claim lost in a crash before
            # that names no job, and a retry takes the key again.
            await s.execute(text("SET LOCAL synchronous_commit = off"))
        res = await s.execute(stmt)
        await s.commit()
    return bool(rowcount(res))


async def _existing(sm: Sessions, key: str) -> tuple[DispatchKey | None, bool]:
    """The key's row and whether the job it names is recorded, in one round trip."""
    recorded = exists().where(Job.id == DispatchKey.job_id)
    async with sm() as s:
        row = (await s.execute(select(DispatchKey, recorded).where(DispatchKey.key == key))).first()
    return (None, False) if row is None else (row[0], bool(row[1]))


async def _take_over(sm: Sessions, row: DispatchKey, digest: str, job_id: str, now: float) -> bool:
    """Point a stale key at ``job_id``; False when another dispatch changed it first."""
    async with sm() as s:
        res = await s.execute(
            update(DispatchKey)
            .where(DispatchKey.key == row.key, DispatchKey.job_id == row.job_id)
            .values(job_id=job_id, request_hash=digest, created_at=now)
        )
        await s.commit()
    return bool(rowcount(res))


async def _recorded(sm: Sessions, job_id: str, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        async with sm() as s:
            if await s.scalar(select(Job.id).where(Job.id == job_id)) is not None:
                return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)


async def claim(
    sm: Sessions,
    key: str,
    digest: str,
    job_id: str,
    *,
    now: float | None = None,
    record_wait: float = RECORD_WAIT_SEC,
    taken: bool = False,
) -> Claim:
    """Claim ``key`` for a new job ``job_id``, or learn which job it already stands for.
    ``taken``: the caller already saw the key exist (its first pass only looks)."""
    for _ in range(5):  # each pass either decides or saw another dispatch change the row
        stamp = time.time() if now is None else now
        if not taken and await _insert(sm, key, digest, job_id, stamp):
            return Claim(job_id, new=True)
        taken = False
        row, recorded = await _existing(sm, key)
        if row is None:
            continue  # pruned meanwhile: insert again
        if not recorded:  # its dispatch may still be recording it
            recorded = await _recorded(sm, row.job_id, record_wait)
        if row.created_at < stamp - WINDOW_SEC or not recorded:
            if await _take_over(sm, row, digest, job_id, stamp):
                return Claim(job_id, new=True)
            continue
        return Claim(row.job_id, new=False, conflict=row.request_hash != digest)
    raise RuntimeError(f"idempotency key {key!r} kept changing under concurrent dispatches")


async def release(sm: Sessions, key: str, job_id: str) -> None:
    """Forget ``key`` when its dispatch did not produce a job that will run."""
    async with sm() as s:
        await s.execute(
            delete(DispatchKey).where(DispatchKey.key == key, DispatchKey.job_id == job_id)
        )
        await s.commit()


__all__ = ["WINDOW_SEC", "Claim", "claim", "key_problem", "release", "request_hash"]
