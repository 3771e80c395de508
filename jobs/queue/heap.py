"""The garbage-collector policy of a worker process while it runs jobs, and of the web
process (``skilljobs web``/``up``) while it serves.

CPython's cyclic collector walks every tracked object of a generation when it runs. A
worker holds a large, long-lived heap from its imports (SQLAlchemy, pydantic, the catalog)
and allocates a stream of short-lived objects per job (futures, tasks, rows). With the
default thresholds the objects of the ~100 jobs in flight survive the young collections,
reach the oldest generation and make it collect often, each time walking the whole
import heap: measured at ~20 % of the worker's CPU on the no-op drain.

While a worker runs, the heap that existed at its start is frozen (``gc.freeze``: never
scanned, never freed: it lives as long as the process anyway) and the youngest generation
is collected every 20,000 net allocations instead of 700. Cyclic garbage is still
collected; it only waits a little longer. Undone when the last worker of the process
stops (tests start many workers in one process).
"""

from __future__ import annotations

import gc

#: the youngest generation's threshold while a worker runs, and the older two
THRESHOLDS = (20_000, 20, 20)

_active = 0
_saved: tuple[int, int, int] | None = None


def settle() -> None:
    """A worker starts: freeze the heap it starts with and widen the young generation."""
    global _active, _saved
    _active += 1
    if _active == 1:
        _saved = gc.get_threshold()
        gc.freeze()  # (garbage among it waits for restore(): no full collection at start)
        gc.set_threshold(*THRESHOLDS)


def restore() -> None:
    """A worker stops: the last one gives the collector back its heap and thresholds."""
    global _active, _saved
    if _active == 0:
        return
    _active -= 1
    if _active == 0:
        gc.unfreeze()
        if _saved is not None:
            gc.set_threshold(*_saved)
            _saved = None


__all__ = ["THRESHOLDS", "restore", "settle"]
