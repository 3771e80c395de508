"""Notices to the person about a background job that are not its result: "still working"
(once, when the run outlasts ``SKILLJOBS_NOTICE_AFTER_S`` or the skill calls
``ctx["progress"]()``) and "cancelled" (when an operator or the person cancels it).

Each goes to the job's origin like its result, through the delivery ledger under its own
item (``notice:working`` / ``notice:cancelled``): a re-run or a second worker never sends
it twice. Both can be turned off (``SKILLJOBS_NOTICE_WORKING=false`` — or no timer with
``SKILLJOBS_NOTICE_AFTER_S=0``, the default — and ``SKILLJOBS_NOTICE_CANCELLED=false``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from delivery.channels.base import Delivered
from delivery.channels.registry import channels_for
from delivery.router import deliver_result, origin_of
from jobs.db import Fence
from jobs.models import JobRow
from jobs.services import Services
from jobs.settings import Settings
from jobs.texts import language_of, text

log = logging.getLogger(__name__)

WORKING = "working"
CANCELLED = "cancelled"
NOTICE_WAIT_S = 15.0  # how long the end of a run waits for a notice in flight


async def _always() -> bool:
    return True


def wanted(settings: Settings, kind: str) -> bool:
    if kind == CANCELLED:
        return bool(getattr(settings, "notice_cancelled", True))
    return bool(getattr(settings, "notice_working", True))


async def send_notice(
    services: Services, job: JobRow, kind: str, *, fence: Fence | None = None, force: bool = False
) -> list[Delivered]:
    """Tell the job's origin ``kind`` (``working`` / ``cancelled``) in the person's language;
    nothing when turned off (``force``: a skill's own progress call) or when the job has
    nowhere to deliver (its result would say why)."""
    settings = services.settings
    if not force and not wanted(settings, kind):
        return []
    origin = origin_of(job)
    if origin.error is not None or origin.channel not in channels_for(services):
        return []  # nowhere to say it (the result's own delivery records why)
    ctx = job.context if isinstance(job.context, dict) else None
    lang = language_of(settings, ctx)
    message = text(f"notice_{kind}", lang, name=job.skill)
    try:
        return await deliver_result(
            services, job, {"ok": True, "message": message}, [], fence=fence or _always, notice=kind
        )
    except Exception as exc:  # a notice never costs the job its run or its record
        log.warning("job %s: %s notice not sent: %r", job.id, kind, exc)
        return []


class WorkingNotice:
    """The "still working" notice of one run: sent once, when the run outlasts
    ``SKILLJOBS_NOTICE_AFTER_S`` or when the skill calls ``progress()`` (from any thread);
    never after the run has ended (:meth:`close` waits for one in flight, so it arrives
    before the result)."""

    def __init__(self, services: Services, job: JobRow, fence: Fence) -> None:
        self.services, self.job, self.fence = services, job, fence
        self.loop = asyncio.get_running_loop()
        self.enabled = bool(getattr(services.settings, "notice_working", True))
        self._over = False
        self._task: asyncio.Task[Any] | None = None
        after = float(getattr(services.settings, "notice_after_s", 0.0) or 0.0)
        self._timer = (
            self.loop.call_later(after, self._fire) if self.enabled and after > 0 else None
        )

    def progress(self, *_: Any, **__: Any) -> None:
        """``ctx["progress"](…)``: the skill says it is busy; the person is told once."""
        with contextlib.suppress(RuntimeError):  # the loop is gone: the run is over
            self.loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        if self._over or not self.enabled or self._task is not None:
            return
        self._task = self.loop.create_task(
            send_notice(self.services, self.job, WORKING, fence=self.fence, force=True)
        )

    async def close(self) -> None:
        self._over = True
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._task), NOTICE_WAIT_S)


def working(services: Services, job: JobRow, fence: Fence) -> WorkingNotice:
    """The "still working" notice of the run of ``job`` that starts now."""
    return WorkingNotice(services, job, fence)


async def cancelled(services: Services, job: JobRow) -> None:
    """Tell the person ``job`` was cancelled (once, through the ledger; off-able)."""
    await send_notice(services, job, CANCELLED)


__all__ = [
    "CANCELLED",
    "WORKING",
    "WorkingNotice",
    "cancelled",
    "send_notice",
    "wanted",
    "working",
]
