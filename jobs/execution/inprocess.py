"""In-process Python skills: importing the handler, binding the entry, the wall clock.

Handlers are imported by file path under a unique module name (skills never import each
other, and two skills may both have a ``handler.py``), cached per (path, mtime, size).
Async entries run as their own task so that a skill ignoring cancellation can be abandoned;
sync entries run in a daemon thread with ``ctx["db"] = None``. Every import and call runs
guarded (``hostguard``): its own ``sys.argv`` (``[handler path]``), its prints captured as
the run's log. An entry that calls ``sys.exit`` (an argparse error, say) is a clean failure
naming the reason; only a file with a ``__main__`` block is tried again as a CLI skill.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib.util
import inspect
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from jobs import eager
from jobs.execution.hostguard import guarded
from jobs.skill import Skill
from jobs.texts import meaningful_line

T = TypeVar("T")

ENTRY_NAMES = ("execute", "run", "handler", "main", "handle")
CANCEL_GRACE_SEC = 1.0  # how long a timed-out or cancelled skill gets to unwind

#: the skill tasks of one run (set by whoever runs it: the job runner, the chain runner), so
#: they can be cancelled directly — cancelling the caller reaches them a loop pass later,
#: too late after a pause (their own wake-ups run first)
RUN_TASKS: contextvars.ContextVar[set[asyncio.Task[Any]] | None] = contextvars.ContextVar(
    "skilljobs_run_tasks", default=None
)

#: called once, from the skill's own task, the moment a run's skill body returns or raises
#: (set by the job runner: the worker's slot is free then, before the executor reads and
#: shapes the result); a skill's nested runs (``call_skill``) do not call it
SKILL_ENDED: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "skilljobs_skill_ended", default=None
)


class WallExpired(Exception):
    """A run over its wall clock; ``log`` / ``stdout``: what it had written by then (a
    subprocess's stderr and stdout tails; an in-process run's prints are its stdout)."""

    def __init__(self, seconds: float, log: str = "", *, stdout: str = "") -> None:
        super().__init__(seconds)
        self.seconds = seconds
        self.log = log
        self.stdout = stdout


class Raised(Exception):
    """Carries an exception the skill raised (as ``__cause__``) out of the run, and what the
    run printed before it (``stdout``)."""

    stdout: str = ""


class ImportFailed(Exception):
    pass


@dataclass
class Entry:
    fn: Callable[..., Any]
    is_async: bool
    required: int  # required positional parameters: 0 → f(), 1 → f(input), ≥2 → f(input, ctx)
    path: str = ""  # the handler file: the run's sys.argv[0]
    main_block: bool = False  # the file has ``if __name__ == "__main__":`` (it can run as a CLI)


def required_positional(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


class EntryOf(Protocol):
    """What finding a skill's entry reads of it (a ``Skill``, or the sandbox's stand-in)."""

    @property
    def name(self) -> str: ...
    @property
    def entry_function(self) -> str | None: ...


def _import_entry(skill: EntryOf, path: str, mtime_ns: int) -> Entry:
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
    return Entry(
        fn,
        inspect.iscoroutinefunction(fn),
        required_positional(fn),
        path=path,
        main_block=_has_main_block(path),
    )


_MAIN_BLOCK = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", re.M)


def _has_main_block(path: str) -> bool:
    try:
        return _MAIN_BLOCK.search(Path(path).read_text(errors="replace")) is not None
    except OSError:
        return False


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
        with guarded(str(skill.entry)):  # module-level code sees its own argv, prints nowhere
            return await in_thread(cache.load, (skill,), wall, skill.name, bind_loop=True)
    except Raised as wrapped:
        exc = wrapped.__cause__
        if isinstance(exc, SystemExit):
            raise
        raise ImportFailed(f"{type(exc).__name__}: {exc}") from exc


async def run_entry(
    entry: Entry, input_data: dict[str, Any], rc: dict[str, Any], wall: float, name: str
) -> tuple[Any, str]:
    """Bind by required positional count and run under the wall clock, guarded; returns
    the result and what the run printed. ``sys.exit`` in the entry is a failure envelope,
    except in a file with a ``__main__`` block (``Raised`` from SystemExit: run it as a CLI)."""
    args: tuple[Any, ...] = ((), (input_data,))[min(entry.required, 1)]
    if entry.required >= 2:
        args = (input_data, rc)
    if not entry.is_async:
        rc["db"] = None  # sync entries get no session (SPEC §2)
        rc.pop("call_skill", None)  # only async entries can await call_skill
    with guarded(entry.path or name) as run:
        try:
            if entry.is_async:
                result = await with_wall(entry.fn(*args), wall)
            else:
                result = await in_thread(entry.fn, args, wall, name)
                if inspect.isawaitable(result):
                    result = await with_wall(result, wall)
        except WallExpired as expired:
            expired.stdout = expired.stdout or run.text()
            raise
        except Raised as wrapped:
            exc = wrapped.__cause__
            if isinstance(exc, SystemExit) and not entry.main_block:
                return exited(name, exc, run.text()), run.text()
            wrapped.stdout = run.text()  # kept on the attempt with the traceback
            raise
    return result, run.text()


def exited(name: str, exc: SystemExit, printed: str) -> dict[str, Any]:
    """The failure of an in-process entry that called ``sys.exit``: the reason it gave
    (``sys.exit("…")``, or the meaningful line it printed, e.g. argparse's ``error:``)."""
    # lazy: the envelope imports the database models, which the sandbox runner never needs
    from jobs.envelope import failure

    code = exc.code
    if isinstance(code, str) and code.strip():
        reason = code.strip()
    else:
        reason = meaningful_line(printed) if printed.strip() else ""
        reason = reason or f"exit status {code if code is not None else 0}"
    return failure(
        f"skill {name!r} called sys.exit() instead of returning a result: {reason}. An "
        "in-process entry gets its input as an argument, never a command line; a script "
        "that parses its command line runs as a CLI skill with an "
        '`if __name__ == "__main__":` block',
        error_type="config",
        non_retriable=True,
        skill=name,
        user_message=reason,
        exit_code=code if isinstance(code, int) else 1,
    )


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


class _Run:
    """One skill run under :func:`with_wall`: how it ended, and whom to tell first."""

    __slots__ = ("ended", "outcome")

    def __init__(self) -> None:
        #: ``SKILL_ENDED`` of the caller, set once the skill's first step is over
        self.ended: Callable[[], None] | None = None
        #: ``(True, result)`` or ``(False, exception)`` once the skill body has ended
        self.outcome: tuple[bool, Any] | None = None


async def _contained(coro: Awaitable[Any], waiter: asyncio.Future[None], run: _Run) -> None:
    """Run the skill, its outcome kept in ``run`` (the task itself never fails: asyncio
    would re-raise a skill's SystemExit into the event loop, and stop the whole process)."""
    SKILL_ENDED.set(None)  # (this task's own context: the skill's nested runs end nothing)
    try:
        run.outcome = (True, await coro)
    except asyncio.CancelledError as exc:
        run.outcome = (False, exc)
        raise
    except BaseException as exc:
        run.outcome = (False, exc)
    finally:
        # The next job waiting for this slot is woken first, then the caller (not a loop
        # pass later, from the task's done callback). A skill that ends in its first step
        # leaves the slot with its caller, in this same turn of the loop.
        if run.ended is not None:
            run.ended()
        _wake(waiter)


async def with_wall(coro: Awaitable[Any], wall: float) -> Any:
    """Await ``coro`` as its own task under the wall clock, started at once (its first step
    runs before this waits: ``jobs.eager``). The skill's exceptions come out wrapped in
    ``Raised``; expiry cancels it (a skill that ignores cancellation is abandoned after a
    grace period) and raises ``WallExpired``. Cancelling the caller cancels it."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    run = _Run()
    task = eager.start(_contained(coro, waiter, run))
    run.ended = SKILL_ENDED.get()
    run_tasks = RUN_TASKS.get()
    if run_tasks is not None:
        run_tasks.add(task)
        task.add_done_callback(run_tasks.discard)
    if run.outcome is None:  # (else the skill ended in its first step)
        handle = loop.call_later(wall, _wake, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            task.cancel()
            await wait_done(task, CANCEL_GRACE_SEC)
            raise
        finally:
            handle.cancel()
    if run.outcome is None:  # the wall clock ran out first
        task.cancel()
        await wait_done(task, CANCEL_GRACE_SEC)
        raise WallExpired(wall)
    ok, value = run.outcome
    if ok:
        return value
    if isinstance(value, asyncio.CancelledError):
        raise Raised() from asyncio.CancelledError("the skill cancelled itself")
    raise Raised() from value


async def in_thread(
    fn: Callable[..., T],
    args: tuple[Any, ...],
    wall: float,
    name: str,
    *,
    bind_loop: bool = False,
) -> T:
    """Run ``fn`` in a daemon thread: a hung one is abandoned at the wall clock and never
    blocks shutdown (unlike a thread-pool worker). Errors come out wrapped in ``Raised``.
    ``bind_loop`` makes the service's loop that thread's event loop (module-level code that
    calls ``asyncio.get_event_loop()`` gets the loop it would have got in-line)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def succeed(value: T) -> None:
        if not fut.done():
            fut.set_result(value)

    def fail(exc: BaseException) -> None:
        if not fut.done():
            fut.set_exception(exc)

    context = contextvars.copy_context()  # the run's argv and streams (hostguard) go along

    def work() -> None:
        if bind_loop:
            asyncio.set_event_loop(loop)
        try:
            settle = functools.partial(succeed, context.run(fn, *args))
        except BaseException as exc:  # delivered to the awaiting side, never lost
            settle = functools.partial(fail, exc)
        try:
            loop.call_soon_threadsafe(settle)
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
