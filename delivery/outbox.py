"""The outbox: deliveries waiting for a chat's rate limit, parked instead of waited for.

A worker's finishing stage must not sit in a token bucket: while it waits no other job
can finish there (and, once the stage is full, no other job can run). So a send that
cannot go at once is *parked*: its ledger row stays ``pending`` with its content (custody
is the database's, not a process's), and its id joins the chat's queue in Redis. Every
worker's outbox loop takes the queues whose next token is due and sends their heads in
order, one sender per chat at a time (a lock in Redis), through the same ledger: claim,
``sending``, receipt or ``failed`` / ``unknown``.

Order per chat: a send goes straight out only when its chat's queue is empty and no other
worker is sending to that chat; otherwise it queues behind. So messages reach a chat in
the order they were handed over, whichever workers send them.

Redis keys (under the deployment's prefix): ``outbox:due`` (a sorted set of recipients by
when their next send may go, ms), ``outbox:q:<recipient>`` (a list of delivery row ids) and
``outbox:lock:<recipient>``. Parked rows whose Redis entry was lost (a restart, a flush)
are queued again by :meth:`Outbox.sweep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from typing import Any

from sqlalchemy import select

from delivery.channels.base import Channel
from delivery.channels.limits import LimitedChannel, Target, credit, parse_target
from delivery.ledger import PARKED, SENDING, claim, claim_parked, owner_id, send_claimed
from jobs.models import PENDING, Delivery

log = logging.getLogger(__name__)

#: a wait this short (one message interval of a chat limited to 1/s) is waited out in
#: place: a result's next item then follows it at once; longer waits are parked
INLINE_WAIT = 1.0
#: how long one sender holds a chat (renewed with each message it sends), longer than the
#: stalls of a loaded host (a sender that took a token and stalled must still be the one
#: to send to that chat). Expiry is safe for custody:
#: the head stays queued until it is recorded, and the ledger lets one claimant send it.
LOCK_MS = 15_000
#: a chat's sender waits this long for its next token itself (it holds no worker slot);
#: a longer wait goes back to the due queue
STAY_MS = 3_000
#: how often a head held by another claimant that still looks alive is looked at again
HELD_MS = 1_000
#: the longest the loop sleeps before looking at the due queues again
IDLE = 0.5
#: parked rows untouched this long are checked against their queue (``sweep``)
SWEEP_AFTER = 30.0
#: chats drained at the same time by one worker
MAX_CHATS = 64

# KEYS: queue, lock. ARGV: lock owner, lock ms. 1 when the caller may send now (lock taken).
_ENTER = """
if redis.call('LLEN', KEYS[1]) > 0 then return 0 end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0
"""
# KEYS: queue, due, lock. ARGV: row id, recipient, due ms, lock owner, front (1/0).
# The lock holder's item was at the head (it goes back there); others queue behind.
_PARK = """
if ARGV[5] == '1' then
  redis.call('LPUSH', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
else
  redis.call('RPUSH', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[2])
end
if redis.call('GET', KEYS[3]) == ARGV[4] then redis.call('DEL', KEYS[3]) end
return 1
"""
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: queue, due. ARGV: head, recipient. Drops the head if it still is; forgets an empty queue.
_POP = """
if ARGV[1] ~= '' and redis.call('LINDEX', KEYS[1], 0) == ARGV[1] then
  redis.call('LPOP', KEYS[1])
end
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[2]) end
return redis.call('LLEN', KEYS[1])
"""


def _ms() -> int:
    return int(time.time() * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gate:
    """One send's turn at its chat (:class:`delivery.ledger.Gate`)."""

    def __init__(self, outbox: Outbox, adapter: LimitedChannel, recipient: str, contact: str):
        self.outbox = outbox
        self.adapter = adapter
        self.recipient = recipient
        self.target: Target = parse_target(contact)
        self.token = uuid.uuid4().hex
        self.locked = False
        self.wait_ms = 0
        self._credit: contextlib.ExitStack | None = None
        self.note = f"waiting for the {adapter.name} rate limit (in the outbox)"

    async def enter(self) -> bool:
        ob = self.outbox
        q, lock = ob.queue_key(self.recipient), ob.lock_key(self.recipient)
        if not int(await ob.script("enter")(keys=[q, lock], args=[self.token, LOCK_MS])):
            return False  # others are ahead: this one queues behind them
        self.locked = True
        deadline = time.monotonic() + INLINE_WAIT
        waited = 0.0
        while True:
            ms = await self.adapter.limiter.try_take(self.adapter.name, self.target)
            if ms <= 0:
                self._credit = contextlib.ExitStack()
                self._credit.enter_context(credit(self.adapter.name, self.target))
                if waited:  # counted for /metrics
                    await self.adapter.limiter.count_wait(self.adapter.name, waited)
                return True
            if time.monotonic() + ms / 1000 > deadline:
                self.wait_ms = ms
                return False
            await asyncio.sleep(ms / 1000)
            waited += ms / 1000

    async def parked(self, row_id: int, wait: float | None = None) -> None:
        ob = self.outbox
        due = _ms() + (int(wait * 1000) if wait else self.wait_ms)
        keys = [ob.queue_key(self.recipient), ob.due_key, ob.lock_key(self.recipient)]
        front = "1" if self.locked else "0"
        await ob.script("park")(keys=keys, args=[row_id, self.recipient, due, self.token, front])
        self.locked = False
        self._end_credit()
        ob.wake.set()
        await self.adapter.limiter.count_wait(self.adapter.name, 0.0, parked=True)

    async def leave(self) -> None:
        self._end_credit()
        if self.locked:
            self.locked = False
            lock = self.outbox.lock_key(self.recipient)
            await self.outbox.script("unlock")(keys=[lock], args=[self.token])
            self.outbox.wake.set()  # whoever queued meanwhile may go now

    def _end_credit(self) -> None:
        if self._credit is not None:
            self._credit.close()
            self._credit = None


class _Hold:
    """The gate of a send from the outbox: a 429's ``retry_after`` parks the row again
    (it is still its queue's head) instead of using up its tries."""

    def __init__(self, channel: str) -> None:
        self.note = f"waiting for the {channel} rate limit (in the outbox)"
        self.wait_ms: int | None = None

    async def enter(self) -> bool:
        return True

    async def parked(self, row_id: int, wait: float | None = None) -> None:
        self.wait_ms = max(1, int((wait or 1.0) * 1000))

    async def leave(self) -> None:
        return None


class Outbox:
    """The parked deliveries of one deployment, drained by every worker that runs one."""

    def __init__(self, services: Any, worker_id: str) -> None:
        self.svc = services
        self.redis = services.redis
        self.owner = owner_id(worker_id, 0)
        self.wake = asyncio.Event()
        self.active: dict[str, asyncio.Task[Any]] = {}
        self.due_key = services.settings.key("outbox", "due")
        self._scripts: dict[str, Any] = {}
        self._swept = 0.0
        self.stopping = False

    def queue_key(self, recipient: str) -> str:
        return str(self.svc.settings.key("outbox", "q", recipient))

    def lock_key(self, recipient: str) -> str:
        return str(self.svc.settings.key("outbox", "lock", recipient))

    def script(self, name: str) -> Any:
        if name not in self._scripts:
            body = {"enter": _ENTER, "park": _PARK, "unlock": _UNLOCK, "pop": _POP}[name]
            self._scripts[name] = self.redis.register_script(body)
        return self._scripts[name]

    def gate(self, adapter: Channel, recipient: str, contact: str) -> Gate | None:
        """The gate of a send on ``adapter``, or None when it has no shared rate limit."""
        if not isinstance(adapter, LimitedChannel) or adapter.limiter is None:
            return None
        return Gate(self, adapter, recipient, contact)

    # --- draining --------------------------------------------------------------------

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Send what is due until ``stop``; the chats being sent to finish their message."""
        try:
            while not stop.is_set():
                try:
                    delay = await self.drain_once()
                    if time.monotonic() - self._swept > SWEEP_AFTER:
                        self._swept = time.monotonic()
                        await self.sweep()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Redis or the database away: try again shortly
                    log.warning("outbox: %s: %s", type(exc).__name__, exc)
                    delay = 1.0
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self.wake.wait()
        finally:
            self.stopping = True  # each chat's sender ends after the message it is sending
            if self.active:
                await asyncio.gather(*self.active.values(), return_exceptions=True)

    async def drain_once(self) -> float:
        """Start a sender for every chat whose next send is due; the seconds until the
        next one is."""
        now = _ms()
        due = await self.redis.zrangebyscore(self.due_key, "-inf", now, start=0, num=MAX_CHATS)
        for raw in due:
            recipient = _text(raw)
            if recipient in self.active or len(self.active) >= MAX_CHATS:
                continue
            task = asyncio.create_task(self._drain(recipient))
            self.active[recipient] = task
            task.add_done_callback(functools.partial(self._done, recipient))
        head = await self.redis.zrange(self.due_key, 0, 0, withscores=True)
        if not head:
            return IDLE
        return max(0.01, min(IDLE, (float(head[0][1]) - now) / 1000))

    def _done(self, recipient: str, _task: asyncio.Task[Any]) -> None:
        task = self.active.pop(recipient, None)
        if task is not None and not task.cancelled() and task.exception() is not None:
            log.warning("outbox: sending to %s failed: %r", recipient, task.exception())
        self.wake.set()

    async def settle(self, patience: float = 600.0) -> None:
        """Drain until nothing is parked (``skilljobs worker --burst`` and tests)."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            delay = await self.drain_once()
            if not self.active and not await self.redis.zcard(self.due_key):
                return
            await asyncio.sleep(min(delay, 0.05))

    async def _drain(self, recipient: str) -> None:
        """Send the heads of one chat's queue while its tokens allow, in order."""
        lock, q = self.lock_key(recipient), self.queue_key(recipient)
        token = uuid.uuid4().hex
        if not await self.redis.set(lock, token, nx=True, px=LOCK_MS):
            return  # another worker is sending to this chat
        try:
            while not self.stopping:
                head = await self.redis.lindex(q, 0)
                if head is None:
                    if not int(
                        await self.script("pop")(keys=[q, self.due_key], args=["", recipient])
                    ):
                        return
                    continue
                wait = await self._send_head(recipient, int(_text(head)))
                if wait is not None and wait <= STAY_MS and not self.stopping:
                    # the chat's next token is near: wait for it here, still its sender
                    await asyncio.sleep(wait / 1000)
                    await self.redis.pexpire(lock, LOCK_MS)
                    continue
                if wait is not None:
                    await self.redis.zadd(self.due_key, {recipient: _ms() + wait}, xx=True)
                    return
                await self.script("pop")(keys=[q, self.due_key], args=[_text(head), recipient])
                await self.redis.pexpire(lock, LOCK_MS)
        finally:
            await self.script("unlock")(keys=[lock], args=[token])

    async def _send_head(self, recipient: str, row_id: int) -> int | None:
        """Send parked row ``row_id``: None when it is done with (sent, failed, or not
        parked any more), else the ms to wait for its chat's next token."""
        from delivery.custody import adapter_for, sender_for

        sm = self.svc.sessionmaker
        async with sm() as s:
            row: Delivery | None = await s.get(Delivery, row_id)
        if row is None or row.status not in (PENDING, SENDING):
            return None  # recorded meanwhile: sent, failed, unknown or dismissed
        adapter = adapter_for(self.svc, row)
        if not isinstance(adapter, LimitedChannel):
            log.warning("outbox: channel %r is not configured here; leaving it", row.channel)
            return 5000
        contact = recipient.partition(":")[2]
        target = parse_target(contact)
        if adapter.limiter is not None:
            ms = int(await adapter.limiter.try_take(adapter.name, target))
            if ms > 0:
                return ms
        if row.claimed_by == PARKED:
            if not await claim_parked(sm, row, self.owner):
                return None
        else:  # a sender took it out and stopped answering (its worker died mid-send?)
            taken = await self._take_over(row, adapter.dedups_for(contact))
            if taken is None:
                return HELD_MS if await self._still_held(row_id) else None
            row = taken
        send = sender_for(self.svc, adapter, contact, row.content or {}, row.kind)
        hold = _Hold(adapter.name)
        with credit(adapter.name, target):
            await send_claimed(
                sm, send, row, self.owner, dedup=adapter.dedups_for(contact), gate=hold
            )
        return hold.wait_ms  # a 429 put it back at the head of its queue, for that long

    async def _take_over(self, row: Delivery, dedup: bool) -> Delivery | None:
        """The ledger's take-over rules: a ``sending`` row of a dead claimant becomes
        ``unknown`` (repeated only where the platform drops repeats), a ``pending`` one is
        ours; None while its claimant looks alive."""
        lease = float(self.svc.settings.worker_lease_sec)
        return await claim(
            self.svc.sessionmaker,
            row.ledger_key,
            recipient=row.recipient,
            owner=self.owner,
            kind=row.kind,
            item=row.item,
            channel=row.channel,
            dedup=dedup,
            dead_after=lease * 2,
        )

    async def _still_held(self, row_id: int) -> bool:
        async with self.svc.sessionmaker() as s:
            row: Delivery | None = await s.get(Delivery, row_id)
        return row is not None and row.status in (PENDING, SENDING)

    async def sweep(self) -> int:
        """Queue again the parked rows whose Redis entry is gone; how many were."""
        cutoff = time.time() - SWEEP_AFTER
        async with self.svc.sessionmaker() as s:
            rows = (
                await s.execute(
                    select(Delivery.id, Delivery.recipient)
                    .where(
                        Delivery.status == PENDING,
                        Delivery.claimed_by == PARKED,
                        Delivery.updated_at < cutoff,
                    )
                    .order_by(Delivery.id)
                    .limit(1000)
                )
            ).all()
        found = 0
        for row_id, recipient in rows:
            q = self.queue_key(recipient)
            if await self.redis.lpos(q, str(row_id)) is not None:
                continue
            found += 1
            async with self.redis.pipeline(transaction=True) as p:
                p.rpush(q, row_id)
                p.zadd(self.due_key, {recipient: _ms()}, nx=True)
                await p.execute()
        if found:
            log.info("outbox: %s parked deliveries queued again", found)
            self.wake.set()
        return found


def outbox_of(services: Any) -> Outbox | None:
    """The outbox this process drains (a worker's), or None: then sends wait in place."""
    ob = getattr(services, "outbox", None)
    return ob if isinstance(ob, Outbox) else None


__all__ = ["INLINE_WAIT", "Gate", "Outbox", "outbox_of"]
