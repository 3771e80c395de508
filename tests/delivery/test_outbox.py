"""The outbox: a delivery waiting for its chat's rate limit is parked (``pending`` in the
ledger, queued in Redis), not waited for in the worker. With one run slot and a slow
channel limit the other jobs still run and finish while deliveries wait; every parked
message then arrives once, in the order the results were handed over per chat."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from delivery.ledger import PARKED
from jobs.models import Delivery
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.helpers.jobs import dispatch, wait_status
from tests.helpers.settings import make_settings

SKILLS = Path(__file__).parent / "outbox_skills"


def _ctx(chat: str, n: int) -> dict[str, Any]:
    return {
        "channel": "telegram",
        "actor_key": chat,
        "role_id": "r1",
        "org_id": "o1",
        "session_id": f"s-{chat}-{n}",
    }


async def _rows(svc: Services) -> list[Delivery]:
    async with svc.sessionmaker() as s:
        return list((await s.scalars(select(Delivery).order_by(Delivery.id))).all())


async def _settings(tmp_path: Path, database_url: str, redis_url: str, prefix: str, tg: Any, **kw):
    return make_settings(
        tmp_path,
        redis_url=redis_url,
        prefix=prefix,
        database_url=database_url,
        skills_path=str(SKILLS),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        **kw,
    )


async def _cleanup(svc: Services) -> None:
    if svc.redis is not None:
        keys = [
            k async for k in svc.redis.scan_iter(count=1000, match=f"{svc.settings.redis_prefix}*")
        ]
        if keys:
            await svc.redis.delete(*keys)
    await svc.close()


@pytest.mark.slow
async def test_waiting_deliveries_hold_no_slot(
    tmp_path: Path, database_url: str, redis_server_url: str, redis_prefix: str, tg: Any
) -> None:
    """max_jobs 1 (finishing stage 2), one message per 4 s to a chat: four results for one
    chat and four for others. Every job finishes while the first chat's messages still
    wait in the outbox; then each arrives once, in the order they were parked."""
    tg.enforce_rates = True
    # (4 s: the eight jobs run one after another, and on a loaded host they take seconds;
    # the third message to the slow chat must still be waiting when the last job ends)
    slow = json.dumps({"telegram": {"chat": [1, 4]}})
    settings = await _settings(
        tmp_path, database_url, redis_server_url, redis_prefix, tg, rate_limits=slow
    )
    tg.known_chats.update({"5001", "5002", "5003", "5004", "5005"})
    svc = await Services.open(settings)
    w = build_worker(svc, handle_signals=False, scheduler=False, max_jobs=1)
    run = asyncio.create_task(w.async_run())
    try:
        slow_ids = [
            await dispatch(svc, "say", {"text": f"5001 n{n}"}, _ctx("5001", n)) for n in range(4)
        ]
        other = [
            await dispatch(svc, "say", {"text": f"{c} n0"}, _ctx(c, 0))
            for c in ("5002", "5003", "5004", "5005")
        ]
        for job_id in slow_ids + other:
            await wait_status(svc, job_id, {"succeeded"}, limit=60)
        # every job is finished, yet the slow chat's later messages are still parked: the
        # waits held neither a run slot nor a finishing-stage slot
        rows = {r.job_id: r for r in await _rows(svc)}
        waiting = [rows[j] for j in slow_ids if rows[j].status == "pending"]
        assert len(waiting) >= 2, [rows[j].status for j in slow_ids]
        assert all(r.claimed_by == PARKED and "rate limit" in (r.error or "") for r in waiting)
        for j in other:
            assert rows[j].status == "sent"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(r.status == "sent" for r in await _rows(svc)):
                break
            await asyncio.sleep(0.1)
        rows_after = await _rows(svc)
        assert [r.status for r in rows_after] == ["sent"] * 8
        assert all(r.message_id and r.verified for r in rows_after)
    finally:
        await w.close()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await _cleanup(svc)
    assert tg.too_many == 0
    texts = [m["text"] for m in tg.sent if m["chat_id"] == "5001"]
    assert texts == [f"5001 n{n}" for n in range(4)]  # once each, in the order handed over
    assert sorted(m["text"] for m in tg.sent) == sorted(
        [f"5001 n{n}" for n in range(4)] + [f"{c} n0" for c in ("5002", "5003", "5004", "5005")]
    )


@pytest.mark.slow
async def test_lost_queue_is_rebuilt_from_the_ledger(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str, tg: Any
) -> None:
    """Redis forgets the outbox (a restart, a flush): the parked rows are still ``pending``
    in the ledger, and the sweep queues them again; each is sent once."""
    from delivery import outbox as ob

    slow = json.dumps({"telegram": {"chat": [1, 10]}})  # one per 10 s: still parked below
    settings = await _settings(
        tmp_path, sqlite_url, redis_server_url, redis_prefix, tg, rate_limits=slow
    )
    tg.known_chats.add("6001")
    svc = await Services.open(settings)
    w = build_worker(svc, handle_signals=False, scheduler=False, max_jobs=1)
    run = asyncio.create_task(w.async_run())
    try:
        ids = [
            await dispatch(svc, "say", {"text": f"6001 n{n}"}, _ctx("6001", n)) for n in range(3)
        ]
        for job_id in ids:
            await wait_status(svc, job_id, {"succeeded"}, limit=60)
        outbox = svc.outbox
        assert isinstance(outbox, ob.Outbox)
        keys = [k async for k in svc.redis.scan_iter(count=1000, match=f"{redis_prefix}*outbox*")]
        assert keys
        await svc.redis.delete(*keys)  # the outbox's Redis entries are gone
        parked = [r for r in await _rows(svc) if r.claimed_by == PARKED]
        assert parked  # still in custody in the database
        async with svc.sessionmaker() as s:  # as if parked long ago
            for r in parked:
                row = await s.get(Delivery, r.id)
                row.updated_at -= 2 * ob.SWEEP_AFTER
            await s.commit()
        assert await outbox.sweep() == len(parked)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(r.status == "sent" for r in await _rows(svc)):
                break
            await asyncio.sleep(0.1)
    finally:
        await w.close()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await _cleanup(svc)
    texts = [m["text"] for m in tg.sent if m["chat_id"] == "6001"]
    assert texts == [f"6001 n{n}" for n in range(3)]


@pytest.mark.slow
async def test_a_chat_being_sent_to_is_left_to_its_sender(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str, tg: Any
) -> None:
    """While one worker's outbox is sending a chat's queue (waiting for its next token in
    place), the chat is not due for the others: they do not keep trying to take it."""
    from delivery import outbox as ob

    slow = json.dumps({"telegram": {"chat": [1, 2]}})  # the sender waits 2 s in place
    settings = await _settings(
        tmp_path, sqlite_url, redis_server_url, redis_prefix, tg, rate_limits=slow
    )
    tg.known_chats.add("6101")
    svc = await Services.open(settings)
    w = build_worker(svc, handle_signals=False, scheduler=False, max_jobs=1)
    run = asyncio.create_task(w.async_run())
    other = ob.Outbox(svc, "another-worker")
    try:
        ids = [
            await dispatch(svc, "say", {"text": f"6101 n{n}"}, _ctx("6101", n)) for n in range(4)
        ]
        for job_id in ids:
            await wait_status(svc, job_id, {"succeeded"}, limit=60)
        outbox = svc.outbox
        assert isinstance(outbox, ob.Outbox)
        deadline = time.monotonic() + 30
        while "telegram:6101" not in outbox.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert "telegram:6101" in outbox.active  # its sender is on the chat
        score = await svc.redis.zscore(outbox.due_key, "telegram:6101")
        assert score is not None and score > time.time() * 1000 + ob.LOCK_MS / 2
        await other.drain_once()
        assert not other.active  # not due: nothing started there
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(r.status == "sent" for r in await _rows(svc)):
                break
            await asyncio.sleep(0.1)
    finally:
        await w.close()
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await _cleanup(svc)
    texts = [m["text"] for m in tg.sent if m["chat_id"] == "6101"]
    assert texts == [f"6101 n{n}" for n in range(4)]
