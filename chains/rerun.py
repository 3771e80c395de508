"""Re-running a chain run from a step: a new run whose earlier steps are the recorded ones.

The new run starts with copies of the source run's step records before ``from_step`` (in a
graph: of every succeeded step that does not wait for ``from_step``) (status ``succeeded``,
their stored outputs); the runner skips succeeded steps and feeds
their outputs to later references, so those steps do not run again. Its fire key is
``rerun:<source run id>:<uuid>`` and its fire time the source's (the steps see the same
``triggered_at``).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from sqlalchemy import select

from chains.runs import arq_job_id, enqueue_run
from chains.schedules import spec_of
from jobs import audit
from jobs.models import ChainRun, ChainRunStatus, ChainStep, Schedule, StepStatus

if TYPE_CHECKING:
    from jobs.services import Services


class RerunError(ValueError):
    """A re-run that cannot start (the reason says why)."""


def step_index(from_step: int | str, step_ids: list[str]) -> int:
    """``from_step`` as an index: an index, or a step id."""
    if isinstance(from_step, str) and from_step in step_ids:
        return step_ids.index(from_step)
    try:
        idx = int(from_step)
    except (TypeError, ValueError):
        raise RerunError(f"no step {from_step!r}: steps are {', '.join(step_ids)}") from None
    if not 0 <= idx < len(step_ids):
        raise RerunError(f"step index {idx} is out of range 0-{len(step_ids) - 1}")
    return idx


async def rerun_from(
    services: Services,
    run_id: str,
    from_step: int | str,
    *,
    actor: str | None = None,
    enqueue: bool = True,
) -> tuple[str, int]:
    """Start a new run of ``run_id``'s schedule from ``from_step``: (new run id, step index).
    ``enqueue=False`` only records it (the caller runs it in-process)."""
    sm = services.sessionmaker
    async with sm() as s:
        source = await s.get(ChainRun, run_id)
        if source is None:
            raise LookupError(f"no chain run {run_id!r}")
        schedule = await s.get(Schedule, source.schedule_id)
        q = select(ChainStep).where(ChainStep.run_id == run_id).order_by(ChainStep.idx)
        recorded = {st.idx: st for st in (await s.execute(q)).scalars()}
    if schedule is None:
        raise LookupError(f"the schedule of chain run {run_id!r} no longer exists")
    spec = spec_of(schedule)
    step_ids = [r.id for r in spec.step_refs()]
    idx = step_index(from_step, step_ids)
    graph = spec.graph()
    # a line: the steps before it; a graph: the steps it waits for must have succeeded, and
    # every step that does not wait for it keeps its output when it has one
    if graph.is_graph:
        again = graph.descendants(idx) | {idx}
        required = sorted(graph.ancestors(idx))
        kept = [
            i
            for i in range(len(step_ids))
            if i not in again
            and (st := recorded.get(i)) is not None
            and st.status == StepStatus.SUCCEEDED
        ]
    else:
        required = kept = list(range(idx))
    for i in required:
        st = recorded.get(i)
        if st is None or st.status != StepStatus.SUCCEEDED:
            state = st.status if st else "not recorded"
            raise RerunError(
                f"step {i} ({step_ids[i]}) of run {run_id} is {state}, so it has no output "
                f"to reuse; re-run from step {i} or earlier"
            )
        if (st.step_id, st.skill) != (step_ids[i], spec.steps[i].skill):
            raise RerunError(
                f"step {i} of the schedule changed since run {run_id} "
                f"({st.step_id}/{st.skill} → {step_ids[i]}/{spec.steps[i].skill}); "
                f"re-run from step {i} or earlier"
            )
    now = time.time()
    new_id = uuid.uuid4().hex
    async with sm() as s:
        s.add(
            ChainRun(
                id=new_id,
                schedule_id=schedule.id,
                fire_key=f"rerun:{run_id}:{uuid.uuid4().hex}",
                trigger="rerun",
                fire_at=source.fire_at,
                status=ChainRunStatus.QUEUED,
                arq_job_id=arq_job_id(new_id, 0),
                created_at=now,
            )
        )
        await s.flush()
        for i in kept:
            st = recorded[i]
            s.add(
                ChainStep(
                    run_id=new_id,
                    idx=i,
                    step_id=st.step_id,
                    skill=st.skill,
                    status=StepStatus.SUCCEEDED,
                    input=st.input,
                    output=st.output,
                    started_at=st.started_at,
                    finished_at=st.finished_at,
                    duration_ms=st.duration_ms,
                )
            )
        audit.record(
            s,
            action="chain_run.rerun",
            target=run_id,
            actor=actor or "",
            details={"run_id": new_id, "from_step": idx},
        )
        await s.commit()
    if enqueue:
        await enqueue_run(services, new_id, 0)
    return new_id, idx
