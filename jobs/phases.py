"""What a job's run is doing before its skill itself runs (``preparing environment``).

The job runner gives each run a reporter (:func:`reporting`); code on the run's path — the
dependency environments of ``jobs.execution.envs`` — calls :func:`report` with a phase name
and a detail, and with None when that is over. Outside a job (the sync line) nothing is
reported. The runner records the phase on the job row, where the dashboard and
``skilljobs jobs show`` read it.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
Reporter = Callable[[str | None, str], Awaitable[object]]

log = logging.getLogger(__name__)

CURRENT: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "skilljobs_run_phase", default=None
)


async def reporting(reporter: Reporter, work: Awaitable[T]) -> T:
    """Await ``work`` with ``reporter`` as the run's phase reporter (await it inside the
    task that runs the skill: the reporter stays in that task's context)."""
    CURRENT.set(reporter)
    return await work


async def report(name: str | None, detail: str = "") -> None:
    """Tell whoever watches the current run what it does now (None: the phase is over)."""
    reporter = CURRENT.get()
    if reporter is None:
        return
    try:
        await reporter(name, detail)
    except Exception:  # the phase is for people watching; the run goes on without it
        log.warning("could not record the run's phase %r", name, exc_info=True)
