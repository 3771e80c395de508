"""The delivery ledger on both backends: one claim wins, re-runs send nothing twice, a dead
claimant's pending row is picked up again, transient failures are retried."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import select

from delivery.channels.base import Courier, Receipt
from delivery.errors import DeliveryPermanentError, DeliveryTransientError
from delivery.ledger import (
    LeaseLost,
    Parcel,
    claim,
    deliver_once,
    for_job,
    get,
    ledger_key,
    mark_sent,
    owner_id,
)
from jobs.models import Delivery, Job, Worker


class Sender:
    """Records sends; scripted exceptions are raised first, in order."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.sent = 0
        self.calls = 0

    async def __call__(self) -> Receipt:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        self.sent += 1
        return Receipt.of(str(self.sent))


def test_ledger_key_is_stable_and_distinct() -> None:
    k = ledger_key("j1", "telegram:1", "text")
    assert k == ledger_key("j1", "telegram:1", "text") and len(k) == 64
    assert (
        len(
            {
                k,
                ledger_key("j2", "telegram:1", "text"),
                ledger_key("j1", "telegram:2", "text"),
                ledger_key("j1", "telegram:1", "file:/a"),
            }
        )
        == 4
    )


@pytest.mark.slow
async def test_concurrent_claims_one_winner(sessionmaker) -> None:
    key = ledger_key("j1", "feishu:ou_a", "text")
    results = await asyncio.gather(
        *(claim(sessionmaker, key, recipient="feishu:ou_a", owner=f"w{i}#1") for i in range(12))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    async with sessionmaker() as s:
        rows = (await s.execute(select(Delivery))).scalars().all()
    assert len(rows) == 1 and rows[0].claimed_by == winners[0].claimed_by


async def test_rerun_sends_nothing_twice(sessionmaker) -> None:
    async with sessionmaker() as s:
        s.add(Job(id="j1", skill="demo"))
        await s.commit()
    send = Sender()
    parcel = Parcel(ledger_key("j1", "web:s1", "text"))

    def by(owner: str) -> Courier:
        return Courier("web:s1", owner, job_id="j1")

    first = await deliver_once(sessionmaker, send, by("w1#1"), parcel)
    again = await deliver_once(sessionmaker, send, by("w2#2"), parcel)  # a re-run
    same = await deliver_once(sessionmaker, send, by("w1#1"), parcel)  # a retried delivery
    assert first["status"] == "sent" and again["status"] == "sent" and same["status"] == "sent"
    assert send.sent == 1
    assert await for_job(sessionmaker, "j1") == [
        {"recipient": "web:s1", "kind": "text", "status": "sent", "error": None}
    ]


@pytest.mark.slow
async def test_dead_claimant_is_picked_up_live_one_is_not(sessionmaker) -> None:
    now = time.time()
    async with sessionmaker() as s:
        s.add(Worker(id="alive", last_heartbeat=now))
        s.add(Worker(id="dead", last_heartbeat=now - 600))
        s.add(Worker(id="stopped", last_heartbeat=now, stopped_at=now))
        await s.commit()
    for claimant, expect_pickup in (("alive", False), ("dead", True), ("stopped", True)):
        key = ledger_key("j", "telegram:1", claimant)
        assert await claim(sessionmaker, key, recipient="telegram:1", owner=owner_id(claimant, 1))
        taken = await claim(
            sessionmaker, key, recipient="telegram:1", owner="other#2", dead_after=30
        )
        assert (taken is not None) is expect_pickup, claimant
        if taken is not None:
            assert taken.claimed_by == "other#2"
            # ... and the dead claimant, should it wake up, cannot record over the new owner
            assert not await mark_sent(sessionmaker, key, owner_id(claimant, 1))


@pytest.mark.slow
async def test_pending_row_of_unknown_claimant_freed_only_when_stale(sessionmaker) -> None:
    key = ledger_key("j", "telegram:1", "text")
    assert await claim(sessionmaker, key, recipient="telegram:1", owner="cli#0")
    assert await claim(sessionmaker, key, recipient="telegram:1", owner="w#1") is None
    await asyncio.sleep(0.05)
    assert await claim(sessionmaker, key, recipient="telegram:1", owner="w#1", stale_after=0.01)


async def test_worker_killed_mid_delivery_then_rerun_delivers(sessionmaker) -> None:
    """A worker claims, then dies before sending: the next run sends it, exactly once."""
    async with sessionmaker() as s:
        s.add(Worker(id="w1", last_heartbeat=time.time()))
        await s.commit()
    key = ledger_key("j1", "wecom:zhangsan", "text")
    assert await claim(sessionmaker, key, recipient="wecom:zhangsan", owner="w1#1")
    send = Sender()
    # while w1 is alive, another attempt must not send
    r = await deliver_once(sessionmaker, send, Courier("wecom:zhangsan", "w2#2"), Parcel(key))
    assert r["status"] == "pending" and send.calls == 0
    async with sessionmaker() as s:
        (await s.get(Worker, "w1")).last_heartbeat = time.time() - 3600  # type: ignore[union-attr]
        await s.commit()
    r = await deliver_once(sessionmaker, send, Courier("wecom:zhangsan", "w2#2"), Parcel(key))
    assert r["status"] == "sent" and send.sent == 1


@pytest.mark.slow
async def test_transient_retried_with_retry_after(sessionmaker) -> None:
    send = Sender(DeliveryTransientError("429", retry_after=0.2), DeliveryTransientError("timeout"))
    key = ledger_key("j", "telegram:1", "text")
    t0 = time.monotonic()
    r = await deliver_once(
        sessionmaker, send, Courier("telegram:1", "w#1", backoff=0.01), Parcel(key)
    )
    assert r["status"] == "sent" and send.calls == 3
    assert time.monotonic() - t0 >= 0.2
    row = await get(sessionmaker, key)
    assert row is not None and row.tries == 3 and row.sent_at


@pytest.mark.slow
async def test_transient_gives_up_after_three_and_permanent_recorded(sessionmaker) -> None:
    send = Sender(*(DeliveryTransientError("HTTP 503") for _ in range(3)))
    r = await deliver_once(
        sessionmaker, send, Courier("feishu:ou", "w#1", backoff=0.01), Parcel("k1")
    )
    assert r == {
        "recipient": "feishu:ou",
        "kind": "text",
        "status": "failed",
        "error": "gave up after 3 tries: HTTP 503",
    }
    assert send.calls == 3
    send2 = Sender(DeliveryPermanentError("chat not found"))
    r2 = await deliver_once(sessionmaker, send2, Courier("telegram:9", "w#1"), Parcel("k2"))
    assert r2["status"] == "failed" and r2["error"] == "chat not found" and send2.calls == 1
    row = await get(sessionmaker, "k2")
    assert row is not None and row.status == "failed" and row.error == "chat not found"
    # a failed item was never delivered: a later run may try it again
    r3 = await deliver_once(sessionmaker, send2, Courier("telegram:9", "w#2"), Parcel("k2"))
    assert r3["status"] == "sent" and send2.sent == 1


@pytest.mark.slow
async def test_fence_lost_sends_nothing_and_leaves_it_for_the_next_run(sessionmaker) -> None:
    send = Sender(DeliveryTransientError("503", retry_after=0))
    state = {"ok": True}

    async def fence() -> bool:
        ok = state["ok"]
        state["ok"] = False  # lost right after the first try
        return ok

    with pytest.raises(LeaseLost):
        await deliver_once(sessionmaker, send, Courier("web:s", "w#1", fence=fence), Parcel("k"))
    assert send.sent == 0
    row = await get(sessionmaker, "k")
    assert row is not None and row.status == "pending" and row.claimed_by is None
    r = await deliver_once(sessionmaker, send, Courier("web:s", "w#2"), Parcel("k"))
    assert r["status"] == "sent" and send.sent == 1

    async def never() -> bool:
        return False

    with pytest.raises(LeaseLost):
        await deliver_once(sessionmaker, send, Courier("web:s", "w#3", fence=never), Parcel("k9"))
    assert await get(sessionmaker, "k9") is None


@pytest.mark.parametrize("dedup", [False, True])
@pytest.mark.slow
async def test_cancelled_mid_send_is_unknown_unless_the_platform_dedups(
    sessionmaker, dedup: bool
) -> None:
    """A send cancelled while its request was out may have landed: ``unknown`` (never sent
    again blindly); where the platform drops repeats it is released for the next run."""
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(
        deliver_once(sessionmaker, slow, Courier("x:s", "w#1"), Parcel("kc", dedup=dedup))
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 15  # the shielded record finishes (late on a loaded host)
    while True:
        row = await get(sessionmaker, "kc")
        if (row is not None and row.error is not None) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert row is not None and row.error == "interrupted while sending"
    if dedup:
        assert row.status == "pending" and row.claimed_by is None
    else:
        assert row.status == "unknown"
