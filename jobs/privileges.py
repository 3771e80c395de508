"""The worker keeps its memory to itself: ``make_undumpable`` (``prctl(PR_SET_DUMPABLE, 0)``)
keeps other processes of the same user out of ``/proc/<pid>/environ`` and the memory of the
worker and the web app. Skills are isolated by the sandbox (:mod:`jobs.execution.sandbox`).
"""

from __future__ import annotations

import ctypes

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, arg, 0, 0, 0))


def make_undumpable() -> bool:
    """Mark this process non-dumpable (Linux); False where that is not possible."""
    try:
        return _prctl(PR_SET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):
        return False


def is_dumpable() -> bool | None:
    try:
        return _prctl(PR_GET_DUMPABLE) == 1
    except (OSError, AttributeError):
        return None
