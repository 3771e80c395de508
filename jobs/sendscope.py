"""The run a skill-initiated send belongs to, so ``notify`` / ``send_message`` called by a
skill are recorded in the delivery ledger like a job's result.

The runner opens a scope for each run of a job (:func:`begin`); each send call in the run
takes the next sequence number of its content (:func:`next_call` with the content hash): the
first call sending this content is 1, a second call sending the same content again is 2. A
transient re-run of the job makes the same calls, so each gets the same number — and, with
the job id and the content hash, the same ledger key: what the first run sent is not sent
again. Counting per content keeps the numbers stable when calls run concurrently (their
order may differ between runs, their contents do not).

In a worker the scope also carries the worker's outbox (``delivery.outbox``): a send whose
chat has no rate-limit token now is parked there and the skill goes on at once (the
outbox sends it in order, exactly once), so waiting for a bucket does not hold the job's
slot. Only a short wait is made in place, ``INLINE_BUDGET`` seconds in all for the run:
enough for a second message to the same chat (Telegram's 1/s per chat) to be sent — and
answered as ``sent`` — while a burst of messages is parked after it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

#: seconds a run's sends may wait for rate-limit tokens in place, in all, before parking
INLINE_BUDGET = 1.5


@dataclass
class SendScope:
    job_id: str
    owner: str  # the ledger owner: "<worker id>#<lease token>"
    #: the worker's ``delivery.outbox.Outbox`` (None: sends wait for their tokens in place)
    outbox: Any = None
    #: what is left of the run's in-place wait for tokens (``INLINE_BUDGET``)
    inline_left: float = INLINE_BUDGET
    _seq: dict[str, int] = field(default_factory=dict)

    def next_call(self, content: str) -> int:
        self._seq[content] = n = self._seq.get(content, 0) + 1
        return n


CURRENT: contextvars.ContextVar[SendScope | None] = contextvars.ContextVar(
    "skilljobs_send_scope", default=None
)


def begin(job_id: str, owner: str, outbox: object = None) -> contextvars.Token[SendScope | None]:
    """Open the scope of one run (call it in the task that starts the skill)."""
    return CURRENT.set(SendScope(job_id, owner, outbox))


def current() -> SendScope | None:
    return CURRENT.get()


def next_call(content: str) -> tuple[SendScope, int] | None:
    """The scope and this call's sequence number for ``content`` (a hash of what it sends),
    or None outside a job's run."""
    scope = CURRENT.get()
    return (scope, scope.next_call(content)) if scope is not None else None


async def run_in(job_id: str, owner: str, work: Awaitable[T], outbox: object = None) -> T:
    """Await ``work`` inside a fresh scope (start it as its own task: the scope stays in
    that task's context and ends with it)."""
    begin(job_id, owner, outbox)
    return await work


__all__ = ["CURRENT", "INLINE_BUDGET", "SendScope", "begin", "current", "next_call", "run_in"]
