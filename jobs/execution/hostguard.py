"""What an in-process skill sees of the interpreter it shares with the host (SPEC C6).

In-process skills run on the host's event loop and in its threads, and several may run at
once. Each run gets, for itself alone:

* ``sys.argv`` = ``[<its handler's path>]``. The ``sys`` module's class gets an ``argv``
  property backed by a context variable, so a run reads (and may replace or mutate) its own
  list while the host and every other run keep theirs. The host's list is never touched.
* ``sys.stdout`` / ``sys.stderr``: what the run prints is captured (the last
  :data:`CAPTURE_CHARS` characters) instead of going into the host's output; it becomes the
  run's log. The streams are replaced by proxies only while some run is active, and only
  writes made in a run's context are captured.

Async entries get the context when their task is created, sync entries through the
context copied into their thread (``inprocess.in_thread``), so both see their own argv and
streams, and so do the tasks they start.
"""

from __future__ import annotations

import contextvars
import io
import sys
import threading
import types
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO, cast

CAPTURE_CHARS = 64 * 1024


@dataclass
class RunIO:
    """One in-process run's command line and captured output."""

    argv: list[str]
    out: deque[str] = field(default_factory=deque)
    size: int = 0

    def write(self, text: str) -> None:
        self.out.append(text)
        self.size += len(text)
        while self.size > CAPTURE_CHARS and len(self.out) > 1:
            self.size -= len(self.out.popleft())

    def text(self) -> str:
        """What the run printed (its tail when it printed more than the cap)."""
        return "".join(self.out)[-CAPTURE_CHARS:]


_RUN: contextvars.ContextVar[RunIO | None] = contextvars.ContextVar("skill_run_io", default=None)


class _GuardedSys(types.ModuleType):
    """The ``sys`` module with ``argv`` served per run (outside a run: the host's)."""

    @property
    def argv(self) -> list[str]:
        run = _RUN.get()
        return run.argv if run is not None else self.__dict__["argv"]

    @argv.setter
    def argv(self, value: list[str]) -> None:
        run = _RUN.get()
        if run is not None:
            run.argv = value  # the run's own command line; the host's stays as it is
        else:
            self.__dict__["argv"] = value


class _Stream:
    """``sys.stdout`` / ``sys.stderr`` while runs are active: a run's writes go to its
    capture, everybody else's to the stream that was there. Not an ``io.TextIOBase``: its
    ``encoding``/``errors`` would read None instead of the host stream's."""

    def __init__(self, host: TextIO) -> None:
        self.host = host

    def write(self, text: str) -> int:
        run = _RUN.get()
        if run is None:
            return self.host.write(text)
        run.write(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if _RUN.get() is None:
            self.host.flush()

    def isatty(self) -> bool:
        return False if _RUN.get() is not None else self.host.isatty()

    def fileno(self) -> int:
        if _RUN.get() is not None:
            raise io.UnsupportedOperation("a skill's output stream has no file descriptor")
        return self.host.fileno()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer… of the host stream
        return getattr(self.host, name)


_lock = threading.Lock()
_active = 0


def _install_argv() -> None:
    if not isinstance(sys, _GuardedSys):
        sys.__class__ = _GuardedSys


def _wrap_streams() -> None:
    for name in ("stdout", "stderr"):
        current = sys.__dict__.get(name)
        if current is not None and not isinstance(current, _Stream):
            sys.__dict__[name] = _Stream(current)


def _unwrap_streams() -> None:
    for name in ("stdout", "stderr"):
        current = sys.__dict__.get(name)
        if isinstance(current, _Stream):  # someone else's replacement is left alone
            sys.__dict__[name] = current.host


@contextmanager
def guarded(script: str) -> Iterator[RunIO]:
    """Tasks and threads started inside this block (with the current context) see
    ``sys.argv == [script]`` and print into the returned :class:`RunIO`."""
    global _active
    with _lock:
        _install_argv()
        _wrap_streams()
        _active += 1
    run = RunIO([script])
    token = _RUN.set(run)
    try:
        yield run
    finally:
        _RUN.reset(token)
        with _lock:
            _active -= 1
            if _active == 0:
                _unwrap_streams()


def host_argv() -> list[str]:
    """The host's own command line, whatever run is current."""
    return cast(list[str], sys.__dict__["argv"])


__all__ = ["CAPTURE_CHARS", "RunIO", "guarded", "host_argv"]
