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
``outbox:lock:<recipient>``. While a chat's sender holds it, the chat's due time is past its
lock, so the other workers do not keep trying to take it; a sender that leaves sets it to
when the chat's next send may go. Parked rows whose Redis entry was lost (a restart, a
flush) are queued again by :meth:`Outbox.sweep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any, cast

from redis.commands.core import AsyncScript
from sqlalchemy import select, update

from delivery.channels.base import Channel
from delivery.channels.limits import LimitedChannel, Limiter, Target, credit, parse_target
from delivery.custody import adapter_for, sender_for
from delivery.ledger import (
    PARKED,
    SENDING,
    UNKNOWN,
    UNKNOWN_DIED,
    RetryWindow,
    claim,
    claim_parked,
    owner_id,
    send_claimed,
)
from jobs.db import rowcount
from jobs.models import PENDING, Delivery, Job, JobStatus, Worker
from jobs.services import Services

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
#: an ``unknown`` delivery on a de-duplicating channel is repeated while it is this recent
#: (seconds since its first send: within WeCom's 600 s duplicate check and Feishu's hour)
DEDUP_REPEAT_SEC = 300.0
#: a job in these states may still send its own deliveries
_OPEN_JOBS = (str(JobStatus.QUEUED), str(JobStatus.RUNNING))

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
# KEYS: lock, due. ARGV: owner, lock ms, recipient, now ms, ms until a look again when held.
# Takes (or renews) a chat for its sender and moves the chat's due time past the lock, so
# other workers do not look at it while it is held; a chat held by another is looked at
# again in ARGV[5] ms. 1 when the caller holds the chat.
_HOLD = """
local mine = redis.call('GET', KEYS[1]) == ARGV[1]
if mine or redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if mine then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
  redis.call('ZADD', KEYS[2], 'XX', tonumber(ARGV[4]) + tonumber(ARGV[2]), ARGV[3])
  return 1
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 or left > tonumber(ARGV[5]) then left = tonumber(ARGV[5]) end
redis.call('ZADD', KEYS[2], 'XX', tonumber(ARGV[4]) + left, ARGV[3])
return 0
"""
# KEYS: lock, due. ARGV: owner, recipient, due ms ('' leaves it). A sender leaves its chat.
_LEAVE = """
if ARGV[3] ~= '' then redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[2]) end
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


def _queue_of(row: Delivery) -> str:
    """The chat a parked row is queued under: its ledger recipient (a reply's ``#anchor``
    travels in the row's content, so one queue per chat)."""
    return str(row.recipient).partition("#")[0]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gate:
    """One send's turn at its chat (:class:`delivery.ledger.Gate`)."""

    def __init__(
        self,
        outbox: Outbox,
        adapter: LimitedChannel,
        limiter: Limiter,
        recipient: str,
        contact: str,
        inline: float = INLINE_WAIT,
    ):
        self.outbox = outbox
        self.inline = inline
        self.adapter = adapter
        self.limiter = limiter
        self.recipient = recipient
        self.target: Target = parse_target(contact)
        self.token = uuid.uuid4().hex
        self.locked = False
        self.wait_ms = 0
        self.waited = 0.0  # seconds waited in place for the token
        self._credit: contextlib.ExitStack | None = None
        self.note = f"waiting for the {adapter.name} rate limit (in the outbox)"
        self.retry: RetryWindow | None = outbox.retry_for(adapter.name)

    async def enter(self) -> bool:
        ob = self.outbox
        q, lock = ob.queue_key(self.recipient), ob.lock_key(self.recipient)
        try:
            ahead = not int(await ob.script("enter")(keys=[q, lock], args=[self.token, LOCK_MS]))
        except Exception as exc:
            # Redis away: the order of this chat's queue cannot be kept, yet the send goes
            # (the ledger, in the database, still sends it once), and that is logged
            log.warning("outbox unavailable (%s: %s): sending unqueued", type(exc).__name__, exc)
            ob.forget_scripts()
            return True
        if ahead:
            return False  # others are ahead: this one queues behind them
        self.locked = True
        deadline = time.monotonic() + self.inline
        waited = 0.0
        while True:
            ms = await self.limiter.try_take(self.adapter.name, self.target)
            if ms <= 0:
                self._credit = contextlib.ExitStack()
                self._credit.enter_context(credit(self.adapter.name, self.target))
                if waited:  # counted for /metrics
                    await self.limiter.count_wait(self.adapter.name, waited)
                return True
            if time.monotonic() + ms / 1000 > deadline:
                self.wait_ms = ms
                return False
            await asyncio.sleep(ms / 1000)
            waited += ms / 1000
            self.waited = waited

    async def parked(self, row_id: int, wait: float | None = None) -> None:
        ob = self.outbox
        due = _ms() + (int(wait * 1000) if wait else self.wait_ms)
        keys = [ob.queue_key(self.recipient), ob.due_key, ob.lock_key(self.recipient)]
        front = "1" if self.locked else "0"
        self.locked = False
        self._end_credit()
        try:
            await ob.script("park")(
                keys=keys, args=[row_id, self.recipient, due, self.token, front]
            )
        except Exception as exc:
            # Redis away: the row is parked in the database (the record); the sweep queues
            # it again once Redis answers
            log.warning(
                "outbox: row %s parked, not queued (%s: %s)", row_id, type(exc).__name__, exc
            )
            ob.forget_scripts()
            ob.sweep_soon()
            return
        ob.wake.set()
        await self.limiter.count_wait(self.adapter.name, 0.0, parked=True)

    async def leave(self) -> None:
        self._end_credit()
        if self.locked:
            self.locked = False
            ob = self.outbox
            # whoever queued meanwhile may go now, on any worker (their chat is due now)
            keys = [ob.lock_key(self.recipient), ob.due_key]
            try:
                await ob.script("leave")(keys=keys, args=[self.token, self.recipient, _ms()])
            except Exception as exc:  # Redis away: the lock expires by itself
                log.warning("outbox: chat not left (%s: %s)", type(exc).__name__, exc)
                ob.forget_scripts()
            ob.wake.set()

    def _end_credit(self) -> None:
        if self._credit is not None:
            self._credit.close()
            self._credit = None


class _Hold:
    """The gate of a send from the outbox: a 429's ``retry_after`` parks the row again
    (it is still its queue's head) instead of using up its tries."""

    def __init__(self, channel: str, retry: RetryWindow | None = None) -> None:
        self.note = f"waiting for the {channel} rate limit (in the outbox)"
        self.retry = retry
        self.wait_ms: int | None = None

    async def enter(self) -> bool:
        return True

    async def parked(self, row_id: int, wait: float | None = None) -> None:
        self.wait_ms = max(1, int((wait or 1.0) * 1000))

    async def leave(self) -> None:
        return None


class Outbox:
    """The parked deliveries of one deployment, drained by every worker that runs one."""

    def __init__(self, services: Services, worker_id: str) -> None:
        if services.redis is None:
            raise RuntimeError("the outbox needs Redis (its queues and locks live there)")
        self.svc = services
        self.redis = services.redis
        self.owner = owner_id(worker_id, 0)
        self.wake = asyncio.Event()
        self.active: dict[str, asyncio.Task[Any]] = {}
        self.due_key = services.settings.key("outbox", "due")
        self._scripts: dict[str, AsyncScript] = {}
        self._swept = 0.0
        self.stopping = False

    def queue_key(self, recipient: str) -> str:
        return str(self.svc.settings.key("outbox", "q", recipient))

    def lock_key(self, recipient: str) -> str:
        return str(self.svc.settings.key("outbox", "lock", recipient))

    def retry_for(self, channel: str) -> RetryWindow:
        """How an outage of ``channel`` is waited out (the settings' window for it)."""
        st = self.svc.settings
        return RetryWindow(
            window=st.delivery_retry_window(channel),
            base=float(st.delivery_retry_base_sec),
            cap=float(st.delivery_retry_max_sec),
        )

    def forget_scripts(self) -> None:
        """After a Redis error: register the scripts again (a restarted Redis lost them;
        redis-py reloads them on NOSCRIPT, but a fresh object costs nothing)."""
        self._scripts.clear()

    def sweep_soon(self) -> None:
        """Have the next pass of the loop sweep (a row was parked while Redis was away)."""
        self._swept = 0.0
        self.wake.set()

    def script(self, name: str) -> AsyncScript:
        if name not in self._scripts:
            body = {
                "enter": _ENTER,
                "park": _PARK,
                "pop": _POP,
                "hold": _HOLD,
                "leave": _LEAVE,
            }[name]
            self._scripts[name] = self.redis.register_script(body)
        return self._scripts[name]

    def gate(
        self, adapter: Channel, recipient: str, contact: str, *, inline: float = INLINE_WAIT
    ) -> Gate | None:
        """The gate of a send on ``adapter``, or None when it has no shared rate limit.
        ``inline``: the longest wait for a token in place before the send is parked (a
        skill's own sends wait what is left of their run's ``jobs.sendscope.INLINE_BUDGET``:
        its job's slot is not the outbox's to hold)."""
        if not isinstance(adapter, LimitedChannel) or adapter.limiter is None:
            return None
        return Gate(self, adapter, adapter.limiter, recipient, contact, inline)

    # --- draining --------------------------------------------------------------------

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Send what is due until ``stop``; the chats being sent to finish their message."""
        try:
            while not stop.is_set():
                try:
                    delay = await self.drain_once()
                    if time.monotonic() - self._swept > self.sweep_every:
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
        """Send the heads of one chat's queue while its tokens allow, in order.

        While it holds the chat, the chat's due time is past its lock (other workers do not
        look at it); the head's row is read while its token is not due yet, so once it is
        only the token, the row's claim (``sending``) and the request itself stand between
        two messages."""
        lock, q = self.lock_key(recipient), self.queue_key(recipient)
        token = uuid.uuid4().hex
        hold = self.script("hold")
        keys = [lock, self.due_key]
        if not int(await hold(keys=keys, args=[token, LOCK_MS, recipient, _ms(), HELD_MS])):
            return  # another worker (or a send going out at once) has this chat
        due: int | None = -1  # -1 until the loop says how it ended (-1: abnormally)
        head: Delivery | None = None  # the head's row, read while its token was not due
        renewed = time.monotonic()
        try:
            while not self.stopping:
                if head is None:
                    raw = await cast("Awaitable[bytes | None]", self.redis.lindex(q, 0))
                    if raw is None:
                        left = self.script("pop")(keys=[q, self.due_key], args=["", recipient])
                        if not int(await left):
                            due = None  # nothing left: the chat is off the due queue
                            return
                        continue
                    head = await self._load(int(_text(raw)))
                    if head is not None and _queue_of(head) != recipient:
                        # Redis decides nothing about recipients: the ledger row does. A row
                        # under another chat's key is not sent from here (the sweep puts it
                        # back under its own recipient).
                        log.warning(
                            "outbox: delivery %s is queued under %r but its ledger row is "
                            "for %r; not sent from this queue",
                            head.id,
                            recipient,
                            head.recipient,
                        )
                        head = None
                    if head is None:  # recorded meanwhile: sent, failed, unknown, dismissed
                        await self.script("pop")(
                            keys=[q, self.due_key], args=[_text(raw), recipient]
                        )
                        continue
                row_id = head.id
                wait, keep = await self._send_head(recipient, head)
                if not keep:
                    head = None  # a send was tried: read the row again before the next
                if wait is not None and wait <= STAY_MS and not self.stopping:
                    # the chat's next token is near: wait for it here, still its sender
                    await asyncio.sleep(wait / 1000)
                    # (renewed after each send; here only when that was long ago: a renewal
                    # would stand between the token and the request)
                    if time.monotonic() - renewed > LOCK_MS / 3000:
                        if not await self._still_ours(hold, keys, token, recipient):
                            due = None
                            return
                        renewed = time.monotonic()
                    continue
                if wait is not None:
                    due = _ms() + wait
                    return
                await self.script("pop")(keys=[q, self.due_key], args=[str(row_id), recipient])
                if not await self._still_ours(hold, keys, token, recipient):
                    due = None
                    return
                renewed = time.monotonic()
        finally:
            if due == -1:  # stopping: due now, for another worker; an error: in a while
                due = _ms() + (0 if self.stopping else HELD_MS)
            args = [token, recipient, "" if due is None else due]
            await self.script("leave")(keys=keys, args=args)

    @staticmethod
    async def _still_ours(hold: AsyncScript, keys: list[str], token: str, recipient: str) -> bool:
        """Renew this sender's hold on its chat; False when it lapsed (a stall longer than
        the lock) and another sender has the chat now."""
        return bool(int(await hold(keys=keys, args=[token, LOCK_MS, recipient, _ms(), HELD_MS])))

    async def _load(self, row_id: int) -> Delivery | None:
        """Parked row ``row_id`` while it is still to be sent (None once it is recorded)."""
        async with self.svc.sessionmaker() as s:
            row: Delivery | None = await s.get(Delivery, row_id)
        return row if row is not None and row.status in (PENDING, SENDING) else None

    async def _send_head(self, recipient: str, row: Delivery) -> tuple[int | None, bool]:
        """Send the parked ``row`` (read by :meth:`_load`). Returns ``(wait, keep)``:
        ``wait`` None when the row is done with (sent, failed, or not parked any more),
        else the ms until it may be tried again; ``keep`` when nothing was tried and the
        row as read still stands."""

        sm = self.svc.sessionmaker
        adapter = adapter_for(self.svc, row)
        if not isinstance(adapter, LimitedChannel):
            log.warning("outbox: channel %r is not configured here; leaving it", row.channel)
            return 5000, False
        contact = _queue_of(row).partition(":")[2]  # the ledger's, never the queue key's
        target = parse_target(contact)
        if adapter.limiter is not None:
            # the last answer here said when the chat's next token is due: no need to ask
            # before then (the buckets decide once it is)
            ms = adapter.limiter.due_in(adapter.name, target)
            if ms <= 0:
                ms = int(await adapter.limiter.try_take(adapter.name, target))
            if ms > 0:
                return ms, True
        sending = False
        if row.claimed_by == PARKED:
            # taken out of the outbox and marked ``sending`` in one statement: the request
            # follows at once
            if not await claim_parked(sm, row, self.owner, sending=True):
                return None, False
            sending = True
        else:  # a sender took it out and stopped answering (its worker died mid-send?)
            taken = await self._take_over(row, adapter.dedups_for(contact))
            if taken is None:
                return (HELD_MS if await self._still_held(row.id) else None), False
            row = taken
        send = sender_for(self.svc, adapter, contact, row.content or {}, row.kind)
        hold = _Hold(adapter.name, self.retry_for(adapter.name))
        with credit(adapter.name, target):
            await send_claimed(
                sm,
                send,
                row,
                self.owner,
                dedup=adapter.dedups_for(contact),
                gate=hold,
                sending=sending,
            )
        return hold.wait_ms, False  # a 429 put it back at the head of its queue, for that long

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

    @property
    def sweep_every(self) -> float:
        return float(getattr(self.svc.settings, "outbox_sweep_sec", SWEEP_AFTER))

    @property
    def dead_after(self) -> float:
        """A claimant's worker silent this long is presumed dead (as its jobs are: three
        heartbeats and a second)."""
        return 3 * float(self.svc.settings.worker_heartbeat_sec) + 1.0

    async def adopt_orphans(self) -> int:
        """Hand the outbox the deliveries nobody will send: ``pending`` rows whose claimant
        is gone (its worker died or stopped) or whose job is over (its attempt stopped
        before sending them — a fault, a lost lease). A ``sending`` one of a dead claimant
        becomes ``unknown`` (repeated only where the platform drops repeats). Only rows of
        channels this outbox sends (rate-limited ones). How many were taken."""

        now = time.time()
        cutoff = now - self.sweep_every
        async with self.svc.sessionmaker() as s:
            rows = (
                await s.scalars(
                    select(Delivery)
                    .where(
                        Delivery.status.in_([PENDING, SENDING]),
                        (Delivery.claimed_by != PARKED) | Delivery.claimed_by.is_(None),
                        Delivery.updated_at < cutoff,
                    )
                    .order_by(Delivery.id)
                    .limit(500)
                )
            ).all()
            if not rows:
                return 0
            owners = {r.claimed_by.rsplit("#", 1)[0] for r in rows if r.claimed_by}
            workers = {
                w.id: w
                for w in (await s.scalars(select(Worker).where(Worker.id.in_(owners)))).all()
            }
            job_ids = {r.job_id for r in rows if r.job_id}
            open_jobs = set(
                (
                    await s.scalars(
                        select(Job.id).where(Job.id.in_(job_ids), Job.status.in_(_OPEN_JOBS))
                    )
                ).all()
            )
        taken = 0
        for row in rows:
            adapter = adapter_for(self.svc, row)
            if not isinstance(adapter, LimitedChannel):
                continue
            w = workers.get(row.claimed_by.rsplit("#", 1)[0]) if row.claimed_by else None
            dead = w is not None and (
                w.stopped_at is not None or w.last_heartbeat < now - self.dead_after
            )
            over = row.job_id is not None and row.job_id not in open_jobs
            # a live claimant may be mid-request: only a dead one's ``sending`` row is
            # taken; a ``pending`` one also when its job is over (a worker's claim, or a
            # released one) — not an operator's resend in progress
            if not dead and (row.status == SENDING or not over):
                continue
            if not dead and row.claimed_by is not None and w is None:
                continue
            dedup = adapter.dedups_for(row.recipient.partition(":")[2])
            if row.status == SENDING and not dedup:
                values: dict[str, Any] = {"status": UNKNOWN, "error": UNKNOWN_DIED}
            else:
                values = {"status": PENDING, "claimed_by": PARKED}
            async with self.svc.sessionmaker() as s:
                res = await s.execute(
                    update(Delivery)
                    .where(
                        Delivery.id == row.id,
                        Delivery.status == row.status,
                        Delivery.updated_at == row.updated_at,
                        Delivery.generation == row.generation,
                    )
                    # (a taken row counts as untouched: queued by the pass below at once)
                    .values(updated_at=cutoff - 1 if values["status"] == PENDING else now, **values)
                )
                await s.commit()
            if rowcount(res) == 1 and values["status"] == PENDING:
                taken += 1
        if taken:
            log.warning("outbox: %s deliveries of gone claimants taken over", taken)
        return taken

    async def repeat_unknown(self) -> int:
        """Resolve ``unknown`` deliveries where the platform allows it: on a channel that
        drops a repeat of the same request key (Feishu's ``uuid``, WeCom's duplicate check)
        a recent one is sent again under its key — delivered once whether or not the first
        request landed. Within :data:`DEDUP_REPEAT_SEC` of its first send (inside the
        platforms' de-duplication windows). How many were handed to the outbox."""

        now = time.time()
        cutoff = now - self.sweep_every
        async with self.svc.sessionmaker() as s:
            rows = (
                await s.scalars(
                    select(Delivery)
                    .where(
                        Delivery.status == UNKNOWN,
                        Delivery.created_at > now - DEDUP_REPEAT_SEC,
                        Delivery.updated_at < cutoff,
                    )
                    .order_by(Delivery.id)
                    .limit(200)
                )
            ).all()
        taken = 0
        for row in rows:
            adapter = adapter_for(self.svc, row)
            contact = row.recipient.partition(":")[2]
            if not isinstance(adapter, LimitedChannel) or not adapter.dedups_for(contact):
                continue
            if not row.content:
                continue
            async with self.svc.sessionmaker() as s:
                res = await s.execute(
                    update(Delivery)
                    .where(
                        Delivery.id == row.id,
                        Delivery.status == UNKNOWN,
                        Delivery.updated_at == row.updated_at,
                        Delivery.generation == row.generation,
                    )
                    .values(
                        status=PENDING,
                        claimed_by=PARKED,
                        error=f"{row.error or 'outcome unknown'}; repeated under the same key",
                        updated_at=cutoff - 1,
                    )
                )
                await s.commit()
            taken += int(rowcount(res) == 1)
        if taken:
            log.info(
                "outbox: %s unknown deliveries repeated where the platform de-duplicates", taken
            )
        return taken

    async def sweep(self) -> int:
        """Take over the deliveries of gone claimants (:meth:`adopt_orphans`) and repeat
        the recent ``unknown`` ones a platform de-duplicates (:meth:`repeat_unknown`), then
        queue again the parked rows whose Redis entry is gone; how many were queued."""
        await self.adopt_orphans()
        await self.repeat_unknown()
        cutoff = time.time() - self.sweep_every
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
        if not rows:
            return 0
        # one round trip for every look (they hold up this worker's due queue meanwhile)
        places = [(int(row_id), str(name).partition("#")[0]) for row_id, name in rows]
        async with self.redis.pipeline(transaction=False) as p:
            for row_id, recipient in places:
                p.lpos(self.queue_key(recipient), str(row_id))
            where = await p.execute()
        missing = {r: q for (r, q), at in zip(places, where, strict=True) if at is None}
        if missing:  # sent meanwhile (and so out of its queue)? then it is not missing
            async with self.svc.sessionmaker() as s:
                still = (
                    await s.scalars(
                        select(Delivery.id).where(
                            Delivery.id.in_(list(missing)),
                            Delivery.status == PENDING,
                            Delivery.claimed_by == PARKED,
                        )
                    )
                ).all()
            missing = {r: missing[r] for r in sorted(still)}
        found = len(missing)
        if missing:
            async with self.redis.pipeline(transaction=True) as p:
                for row_id, recipient in missing.items():
                    # a reply's anchor travels in the row's content: one queue per chat
                    p.rpush(self.queue_key(recipient), row_id)
                    p.zadd(self.due_key, {recipient: _ms()}, nx=True)
                await p.execute()
        if found:
            log.info("outbox: %s parked deliveries queued again", found)
            self.wake.set()
        return found


def outbox_of(services: Services) -> Outbox | None:
    """The outbox this process drains (a worker's), or None: then sends wait in place."""
    ob = getattr(services, "outbox", None)
    return ob if isinstance(ob, Outbox) else None


__all__ = ["INLINE_WAIT", "Gate", "Outbox", "outbox_of"]
