"""The run a skill-initiated send belongs to, so ``notify`` / ``send_message`` called by a
skill are recorded in the delivery ledger like a job's result.

The runner opens a scope for each run of a job (:func:`begin`); each send call in the run
takes the next sequence number of its content (:func:`next_call` with the content hash): the
first call sending this content is 1, a second call sending the same content again is 2. A
transient re-run of the job makes the same calls, so each gets the same number — and, with
the job id and the content hash, the same ledger key: what the first run sent is not sent
again. Counting per content keeps the numbers stable when calls run concurrently (their
order may differ between runs, their contents do not).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class SendScope:
    job_id: str
    owner: str  # the ledger owner: "<worker id>#<lease token>"
    _seq: dict[str, int] = field(default_factory=dict)

    def next_call(self, content: str) -> int:
        self._seq[content] = n = self._seq.get(content, 0) + 1
        return n


CURRENT: contextvars.ContextVar[SendScope | None] = contextvars.ContextVar(
    "skilljobs_send_scope", default=None
)


def begin(job_id: str, owner: str) -> contextvars.Token[SendScope | None]:
    """Open the scope of one run (call it in the task that starts the skill)."""
    return CURRENT.set(SendScope(job_id, owner))


def current() -> SendScope | None:
    return CURRENT.get()


def next_call(content: str) -> tuple[SendScope, int] | None:
    """The scope and this call's sequence number for ``content`` (a hash of what it sends),
    or None outside a job's run."""
    scope = CURRENT.get()
    return (scope, scope.next_call(content)) if scope is not None else None


async def run_in(job_id: str, owner: str, work: Awaitable[T]) -> T:
    """Await ``work`` inside a fresh scope (start it as its own task: the scope stays in
    that task's context and ends with it)."""
    begin(job_id, owner)
    return await work


__all__ = ["CURRENT", "SendScope", "begin", "current", "next_call", "run_in"]
