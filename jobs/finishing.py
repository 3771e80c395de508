"""What finishes a job once its skill has answered, as the queue sees it.

The worker wiring (``jobs.queue.worker.build_worker``) hands the runner a ``Finisher``:
delivery's pipeline, which post-processes the result (files, links, artifacts), delivers
it to the job's origin and records what it sent. The runner, the lost-job notice and the
executor know only this protocol, so the queue never imports the rooms above it.
"""

from __future__ import annotations

from typing import Any, Protocol

from jobs.db import Fence
from jobs.models import JobRow
from jobs.runscope import RunScope
from jobs.services import Services


class Finished(Protocol):
    """What the runner records of a finished job: the result as delivered, the fetches."""

    @property
    def result(self) -> dict[str, Any]: ...

    @property
    def fetches(self) -> list[dict[str, Any]]: ...


class Progress(Protocol):
    """The "still working" notice of one run: ``progress()`` is the skill's own call."""

    def progress(self, *args: Any, **kwargs: Any) -> None: ...

    async def close(self) -> None: ...


class Notices(Protocol):
    """The short notices a job's person gets besides its result (``delivery.notices``)."""

    def working(self, services: Services, job: JobRow, fence: Fence) -> Progress: ...

    async def cancelled(self, services: Services, job: JobRow) -> None: ...


class Finisher(Protocol):
    """Post-process ``result``, deliver it and record the deliveries. ``fence`` is asked
    before each write and send (False: the attempt lost its lease; nothing more happens);
    ``scope``: the run's workspace snapshot; ``normalized``: ``result`` is already the
    executor's envelope of a successful run."""

    async def __call__(
        self,
        services: Services,
        job: JobRow,
        result: object,
        *,
        fence: Fence,
        scope: RunScope | None = None,
        normalized: bool = False,
    ) -> Finished: ...
