"""Tasks whose first step runs at once, in the caller's turn of the event loop.

A task made by ``asyncio.create_task`` takes its first step a loop pass later, after every
callback already waiting; on a worker busy with a hundred runs that pass is a millisecond
or more, paid again by every task a skill's start goes through. :func:`start` runs the new
task's first step before returning (up to the coroutine's first real wait, e.g. the timer
of a skill's ``asyncio.sleep``), as Python 3.12's ``eager_start`` does — and is exactly that
there. On 3.11 the step runs in the task's own context and as the current task (what
``asyncio.current_task`` and ``asyncio.timeout`` inside it see), and the task carries on
from where the step stopped: a cancel that arrives before it is thrown in there, like any
other.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


def start(
    coro: Coroutine[Any, Any, T], *, context: contextvars.Context | None = None
) -> asyncio.Task[T]:
    """``coro`` as a task of the running loop, its first step already taken."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context() if context is None else context
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, context=ctx, eager_start=True)
    rest = _Started(coro)
    task: asyncio.Task[T] = loop.create_task(rest, context=ctx)
    caller = asyncio.current_task(loop)
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)
    asyncio.tasks._enter_task(loop, task)
    try:
        ctx.run(rest.first_step)
    finally:
        asyncio.tasks._leave_task(loop, task)
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)
    return task


class _Started(Coroutine[Any, Any, Any]):
    """A coroutine whose first step has been taken outside its task: the task's own first
    step hands over what that step yielded (or its outcome), the rest goes straight on."""

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._first = True  # the task has not taken its own first step yet
        self._yielded: Any = None
        self._outcome: tuple[bool, Any] | None = None  # the coroutine ended in that step

    def first_step(self) -> None:
        try:
            self._yielded = self._coro.send(None)
        except StopIteration as stop:
            self._outcome = (True, stop.value)
        except BaseException as exc:  # raised in the task, as from any step of it
            self._outcome = (False, exc)

    def _ended(self) -> Any:
        assert self._outcome is not None
        ok, value = self._outcome
        self._outcome = None
        if ok:
            raise StopIteration(value)
        raise value

    def send(self, value: object) -> Any:
        if self._first:
            self._first = False
            if self._outcome is not None:
                return self._ended()
            return self._yielded
        return self._coro.send(value)

    def throw(
        self,
        typ: type[BaseException] | BaseException,
        val: object = None,
        tb: TracebackType | None = None,
    ) -> Any:
        if self._first:
            self._first = False
            if self._outcome is not None:  # ended already: the cancel comes too late
                return self._ended()
        if val is None and tb is None:
            return self._coro.throw(typ)
        if isinstance(typ, BaseException):  # pragma: no cover (the old signature)
            if val is not None:
                raise TypeError("instance exception may not have a separate value")
            return self._coro.throw(typ, None, tb)
        return self._coro.throw(typ, val, tb)  # pragma: no cover (the old signature)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return (yield from self._coro.__await__())  # pragma: no cover (a task drives it)

    def __repr__(self) -> str:
        return f"<started {self._coro!r}>"


__all__ = ["start"]
