"""Aggregates shared by every viewer of one API process for a few seconds.

The overview, the charts and ``/metrics`` summarise the last hour or day of jobs: each is a
range scan of tens of thousands of rows, the same for everyone who looks at the same
moment. ``Shared.get`` computes such an answer once per key and serves it to every caller
under one freshness rule, stated in each answer that uses it (``as_of``, ``max_age_s``):

* younger than ``refresh_s``: served as it is;
* older than that but younger than ``max_age_s`` (= 3 × ``refresh_s``): served as it is
  while one recomputation runs in the background (no caller waits for it);
* older than ``max_age_s``, or never computed: computed now, once however many ask.

So an answer is never older than ``max_age_s`` seconds, and only the first caller after a
quiet spell waits for the SQL.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import State

log = logging.getLogger(__name__)

STALE_FACTOR = 3.0


@dataclass(frozen=True)
class Answer:
    value: Any
    as_of: float  # epoch seconds when it was computed
    max_age_s: float  # it is never served older than this

    def freshness(self) -> dict[str, float]:
        return {"as_of": round(self.as_of, 3), "max_age_s": self.max_age_s}


class Shared:
    """One process's shared answers by key (see the module's freshness rule)."""

    def __init__(self) -> None:
        self.values: dict[Hashable, tuple[float, Answer]] = {}  # key -> (monotonic, answer)
        self._locks: dict[Hashable, asyncio.Lock] = {}
        self._refreshing: dict[Hashable, asyncio.Task[None]] = {}

    async def get(
        self, key: Hashable, refresh_s: float, compute: Callable[[], Awaitable[Any]]
    ) -> Answer:
        max_age = refresh_s * STALE_FACTOR
        hit = self.values.get(key)
        if hit is not None:
            age = time.monotonic() - hit[0]
            if age < refresh_s:
                return hit[1]
            if age < max_age:
                if key not in self._refreshing:
                    task = asyncio.create_task(self._refresh(key, max_age, compute))
                    self._refreshing[key] = task
                return hit[1]
        async with self._locks.setdefault(key, asyncio.Lock()):
            hit = self.values.get(key)
            if hit is not None and time.monotonic() - hit[0] < max_age:
                return hit[1]  # computed by the caller this one waited behind
            return await self._store(key, max_age, compute)

    async def _store(
        self, key: Hashable, max_age: float, compute: Callable[[], Awaitable[Any]]
    ) -> Answer:
        started, as_of = time.monotonic(), time.time()
        answer = Answer(await compute(), as_of, max_age)
        self.values[key] = (started, answer)
        return answer

    async def _refresh(
        self, key: Hashable, max_age: float, compute: Callable[[], Awaitable[Any]]
    ) -> None:
        try:
            async with self._locks.setdefault(key, asyncio.Lock()):
                await self._store(key, max_age, compute)
        except Exception:  # the next caller past max_age computes it (and sees the error)
            log.warning("refreshing a shared aggregate failed", exc_info=True)
        finally:
            self._refreshing.pop(key, None)

    async def close(self) -> None:
        """Wait out background refreshes (before the engine they use is closed)."""
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def of(state: State) -> Shared:
    """The app's ``Shared`` (``app.state.aggregates``), made on first use."""
    shared: Shared | None = getattr(state, "aggregates", None)
    if shared is None:
        shared = state.aggregates = Shared()
    return shared
