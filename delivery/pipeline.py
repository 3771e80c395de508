"""Post-processing of a background result, in the order of the contract:

1. fake-success flip (the result envelope is normalized),
2. ``local_path`` filled from ``filename``,
3. remote URLs materialized into the workspace (outbound policy enforced),
4. artifacts collected (declared + backfill of what this run wrote) and stored,
5. delivery to the job's origin, each item once (the ledger).

A failed result skips 2–4: the user gets a short failure notice, not half an artifact set.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete

from delivery.artifacts import ArtifactInfo, acollect, fill_local_path
from delivery.channels.base import Delivered
from delivery.materialize import materialize, mentions_urls
from delivery.net.fetch import SafeFetcher
from delivery.router import deliver_result, workspace_of
from jobs import telemetry
from jobs.db import Fence, Sessions
from jobs.envelope import is_failure, normalize
from jobs.models import Artifact, JobRow
from jobs.runscope import RunScope
from jobs.services import Services

log = logging.getLogger(__name__)


@dataclass
class PostResult:
    result: dict[str, Any]
    artifacts: list[ArtifactInfo] = field(default_factory=list)
    fetches: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[Delivered] = field(default_factory=list)
    #: declared files that were refused or missing: ``{"path", "field", "reason"}``
    problems: list[dict[str, Any]] = field(default_factory=list)


async def store_artifacts(
    sessionmaker: Sessions, job_id: str, artifacts: list[ArtifactInfo]
) -> None:
    """The job's artifact rows, replaced as a whole (a re-run records its own set once)."""
    async with sessionmaker() as s:
        await s.execute(delete(Artifact).where(Artifact.job_id == job_id))
        s.add_all(
            Artifact(
                job_id=job_id,
                filename=a.filename,
                local_path=a.local_path,
                media=a.media,
                mime=a.mime,
                size=a.size,
                sha256=a.sha256,
                source_url=a.source_url,
            )
            for a in artifacts
        )
        await s.commit()


async def postprocess(
    services: Services,
    job: JobRow,
    result: Any,
    *,
    fence: Fence,
    deliver: bool = True,
    scope: RunScope | None = None,
    workspace: Path | None = None,
    store: bool = True,
    normalized: bool = False,
) -> PostResult:
    """Run the post-processing steps for ``job``'s ``result`` and deliver it.

    ``fence`` (``async () -> bool``) is checked before writes and before each send; once it
    says False nothing more is written or sent. ``scope`` is the run's workspace snapshot:
    backfill then takes only the files this run wrote (without it, every top-level file).
    ``workspace`` overrides the job's (a chain's steps run in the schedule's workspace);
    ``store=False`` keeps the artifacts off the job's rows (a chain run records them itself).
    ``normalized``: ``result`` is the executor's envelope of a successful run (normalized
    there; not copied and normalized again).
    """
    settings = services.settings
    changes = scope.finish() if scope is not None else None
    env = result if normalized and isinstance(result, dict) else normalize(result, job.skill)
    post = PostResult(result=env)
    if not is_failure(env):
        workspace = workspace or workspace_of(settings, job)
        # one stat, not worth a thread hop (a mkdir of an existing folder costs more)
        if not os.path.isdir(workspace):  # noqa: ASYNC240
            os.makedirs(workspace, exist_ok=True)
        env = fill_local_path(env, workspace)
        if mentions_urls(env) or telemetry.enabled():  # (most results: no URL to fetch)
            try:
                async with SafeFetcher(settings.allow_hosts) as fetcher:
                    fetching = materialize(env, workspace, fetcher)
                    env, post.fetches = await telemetry.traced("skilljobs.materialize", fetching)
            except Exception as exc:  # a broken download step must not cost the user the result
                log.exception("job %s: materialization failed", job.id)
                post.problems.append({"path": "", "field": "materialize", "reason": str(exc)})
        post.result = env
        post.artifacts = await acollect(env, workspace, post.problems, changes)
        if not await fence():
            return post
        if store and (post.artifacts or getattr(job, "attempts", 1) > 1):
            # (a first attempt without files has no rows to write or replace)
            await store_artifacts(services.sessionmaker, job.id, post.artifacts)
        if post.problems:
            post.result = env = {**env, "artifact_problems": post.problems}
    if deliver:
        post.deliveries = await deliver_result(
            services, job, env, post.artifacts, fence=fence, workspace=workspace
        )
    return post
