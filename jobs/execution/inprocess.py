"""In-process Python skills: importing the handler, binding the entry, the wall clock.

Handlers are imported by file path under a unique module name (skills never import each
other, and two skills may both have a ``handler.py``), cached per (path, mtime, size).
Async entries run as their own task so that a skill ignoring cancellation can be abandoned;
sync entries run in a daemon thread with ``ctx["db"] = None``.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.skill import Skill

ENTRY_NAMES = ("execute", "run", "handler", "main", "handle")
CANCEL_GRACE_SEC = 1.0  # how long a timed-out or cancelled skill gets to unwind


class WallExpired(Exception):
    def __init__(self, seconds: float, log: str = "") -> None:
        super().__init__(seconds)
        self.seconds = seconds
        self.log = log


class Raised(Exception):
    """Carries an exception the skill raised (as ``__cause__``) out of the run."""


class ImportFailed(Exception):
    pass


class SkillExit(Exception):
    """SystemExit/KeyboardInterrupt raised by a skill: asyncio would re-raise those into the
    event loop and stop the whole process, so they travel as an ordinary exception."""


@dataclass
class Entry:
    fn: Callable[..., Any]
    is_async: bool
    required: int  # required positional parameters: 0 → f(), 1 → f(input), ≥2 → f(input, ctx)


def required_positional(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _import_entry(skill: Skill, path: str, mtime_ns: int) -> Entry:
    mod_name = f"skilljobs_skill_{skill.name.replace('-', '_')}_{mtime_ns:x}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    folder = str(Path(path).parent)
    # Registered like any module (dataclasses, typing.get_type_hints and pickle look it up).
    sys.modules[mod_name] = module
    sys.path.insert(0, folder)  # the skill's own helper modules
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    finally:
        try:
            sys.path.remove(folder)
        except ValueError:
            pass
    names = (skill.entry_function, *ENTRY_NAMES) if skill.entry_function else ENTRY_NAMES
    fn = next((getattr(module, n) for n in names if callable(getattr(module, n, None))), None)
    if fn is None:
        raise ImportError(f"{Path(path).name} defines none of {', '.join(ENTRY_NAMES)}")
    return Entry(fn, inspect.iscoroutinefunction(fn), required_positional(fn))


class EntryCache:
    """Entry functions by handler path. The file is re-checked at most every
    ``recheck_sec`` seconds: an edited handler is picked up without a stat per run."""

    def __init__(self, recheck_sec: float = 1.0) -> None:
        self.recheck_sec = recheck_sec
        self._entries: dict[str, tuple[int, int, Entry]] = {}
        self._checked: dict[str, float] = {}

    def cached(self, skill: Skill) -> Entry | None:
        """The entry when it is known to be current, else None (``load`` must run)."""
        path = str(skill.entry)
        hit = self._entries.get(path)
        if hit is None:
            return None
        now = time.monotonic()
        if now - self._checked.get(path, 0.0) < self.recheck_sec:
            return hit[2]
        try:
            st = os.stat(path)
        except OSError:
            return None
        if hit[0] == st.st_mtime_ns and hit[1] == st.st_size:
            self._checked[path] = now
            return hit[2]
        return None

    def load(self, skill: Skill) -> Entry:
        """Import (or re-import) the handler; raises whatever the import raises."""
        path = str(skill.entry)
        st = os.stat(path)
        entry = _import_entry(skill, path, st.st_mtime_ns)
        old = self._entries.get(path)
        if old is not None and old[0] != st.st_mtime_ns:  # the previous version's module
            sys.modules.pop(getattr(old[2].fn, "__module__", ""), None)
        self._entries[path] = (st.st_mtime_ns, st.st_size, entry)
        self._checked[path] = time.monotonic()
        return entry


async def get_entry(cache: EntryCache, skill: Skill, wall: float) -> Entry:
    """The skill's entry; a first import runs in a thread under the wall clock (module-level
    code may be slow). Raises ``ImportFailed``, ``Raised`` (SystemExit) or ``WallExpired``."""
    entry = cache.cached(skill)
    if entry is not None:
        return entry
    try:
        return await in_thread(  # type: ignore[no-any-return]
            cache.load, (skill,), wall, skill.name, bind_loop=True
        )
    except Raised as wrapped:
        exc = wrapped.__cause__
        if isinstance(exc, SystemExit):
            raise
        raise ImportFailed(f"{type(exc).__name__}: {exc}") from exc


async def run_entry(
    entry: Entry, input_data: dict[str, Any], rc: dict[str, Any], wall: float, name: str
) -> Any:
    """Bind by required positional count and run under the wall clock."""
    args: tuple[Any, ...] = ((), (input_data,))[min(entry.required, 1)]
    if entry.required >= 2:
        args = (input_data, rc)
    if entry.is_async:
        return await with_wall(entry.fn(*args), wall)
    rc["db"] = None  # sync entries get no session (SPEC §2)
    rc.pop("call_skill", None)  # only async entries can await call_skill
    result = await in_thread(entry.fn, args, wall, name)
    if inspect.isawaitable(result):
        return await with_wall(result, wall)
    return result


# --- waiting under a wall clock ----------------------------------------------------------


def _wake(waiter: asyncio.Future[None], *_: Any) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def wait_done(task: asyncio.Future[Any], seconds: float) -> bool:
    """Wait until ``task`` is done or ``seconds`` pass (never raises the task's error).
    A leaner ``asyncio.wait`` for one future: this sits on every in-process run."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    cb = functools.partial(_wake, waiter)
    task.add_done_callback(cb)
    handle = loop.call_later(seconds, _wake, waiter)
    try:
        await waiter
    finally:
        handle.cancel()
        task.remove_done_callback(cb)
    return task.done()


async def _contained(coro: Any) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise SkillExit(repr(exc)) from exc


async def with_wall(coro: Any, wall: float) -> Any:
    """Await ``coro`` as its own task under the wall clock. The skill's exceptions come out
    wrapped in ``Raised``; expiry cancels it (a skill that ignores cancellation is abandoned
    after a grace period) and raises ``WallExpired``. Cancelling the caller cancels it."""
    task = asyncio.ensure_future(_contained(coro))
    try:
        done = await wait_done(task, wall)
    except asyncio.CancelledError:
        task.cancel()
        await wait_done(task, CANCEL_GRACE_SEC)
        raise
    if not done:
        task.cancel()
        await wait_done(task, CANCEL_GRACE_SEC)
        raise WallExpired(wall)
    if task.cancelled():
        raise Raised() from asyncio.CancelledError("the skill cancelled itself")
    exc = task.exception()
    if isinstance(exc, SkillExit):
        raise Raised() from exc.__cause__
    if exc is not None:
        raise Raised() from exc
    return task.result()


async def in_thread(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    wall: float,
    name: str,
    *,
    bind_loop: bool = False,
) -> Any:
    """Run ``fn`` in a daemon thread: a hung one is abandoned at the wall clock and never
    blocks shutdown (unlike a thread-pool worker). Errors come out wrapped in ``Raised``.
    ``bind_loop`` makes the service's loop that thread's event loop (module-level code that
    calls ``asyncio.get_event_loop()`` gets the loop it would have got in-line)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    def work() -> None:
        if bind_loop:
            asyncio.set_event_loop(loop)
        try:
            outcome: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # delivered to the awaiting side, never lost
            outcome = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:
            pass  # abandoned at its wall clock and the loop is gone: nobody is waiting

    threading.Thread(target=work, name=f"skill-{name}", daemon=True).start()
    try:
        done = await wait_done(fut, wall)
    except asyncio.CancelledError:
        fut.cancel()
        raise
    if not done:
        fut.cancel()
        raise WallExpired(wall)
    exc = fut.exception()
    if exc is not None:
        raise Raised() from exc
    return fut.result()
