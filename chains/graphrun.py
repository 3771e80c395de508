"""Running a chain that is a graph (``chains.graph``): each step starts when the steps it
waits for have succeeded, independent steps side by side, a ``for_each`` step once per item.

At most ``policy.max_parallel`` skills run at once (steps and items together). An empty or
failed step stops the run: nothing new starts, what runs finishes, the steps not run are
``skipped``; the run is ``failed`` if a step failed, else ``stopped_empty``. Every step and
item is recorded as it ends, so a run resumed after its worker died runs only what had not
succeeded (items included) and feeds the recorded outputs to later steps.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

from chains import runstore as rs
from chains.emptiness import is_empty
from chains.emptiness import parse as parse_rules
from chains.graph import Graph, item_idx
from chains.refs import StepRefs, UnresolvedReference, resolve_input, resolve_reference
from jobs import telemetry
from jobs.batching import Batcher
from jobs.crypto import redact
from jobs.envelope import failure, is_failure
from jobs.models import ChainRunStatus, StepStatus

if TYPE_CHECKING:
    from chains.schedules import ScheduleSpec, StepSpec
    from jobs.db import Sessions
    from jobs.runscope import RunScope
    from jobs.services import Services

#: a step's end: (status, output when it succeeded, error or note)
Outcome = tuple[StepStatus, Any, str | None]


class ChainAttempt(Protocol):
    """What a graph run needs of the chain attempt driving it (``chains.runner`` imports
    this module, so the attempt is named here by its shape, not imported back)."""

    svc: Services
    sm: Sessions
    spec: ScheduleSpec
    lease: rs.Lease
    final_scope: RunScope | None

    def _scope(self, i: int) -> RunScope | None: ...

    async def _context(self, skill: str) -> dict[str, Any]: ...

    async def _execute(
        self, skill: str, data: dict[str, Any], ctx: dict[str, Any] | None = None
    ) -> dict[str, Any]: ...

    async def _record(
        self,
        i: int,
        status: StepStatus,
        data: dict[str, Any] | None,
        env: object,
        error: str | None,
        *,
        started: float,
    ) -> None: ...

    async def _close_after(self, i: int, status: ChainRunStatus, error: str | None) -> str: ...

    async def _close(self, status: ChainRunStatus, error: str | None, final: object) -> str: ...


class GraphRun:
    def __init__(
        self, chain: ChainAttempt, refs: list[StepRefs], records: list[Any], graph: Graph
    ) -> None:
        self.c = chain
        self.spec = chain.spec
        self.refs = refs
        self.records = records
        self.graph = graph
        self.slots = asyncio.Semaphore(self.spec.policy.max_parallel)
        self.stopping = False

    async def run(self) -> str:
        c, n = self.c, len(self.refs)
        outputs: dict[int, Any] = {}
        for i in range(n):
            rec = self.records[i]
            if rec.status == StepStatus.SUCCEEDED:
                outputs[i] = c.svc.box.unseal(rec.output)
            elif rec.status in (
                StepStatus.STOPPED_EMPTY,
                StepStatus.FAILED,
            ):  # recorded, run not closed yet
                return await c._close_after(-1, ChainRunStatus(rec.status), rec.error)
        running: dict[asyncio.Task[Outcome], int] = {}
        stop: tuple[StepStatus, str | None] | None = None
        try:
            while True:
                if stop is None:
                    started = set(running.values())
                    for i in range(n):
                        ready = all(j in outputs for j in self.graph.deps[i])
                        if i not in outputs and i not in started and ready:
                            running[asyncio.create_task(self._step(i, dict(outputs)))] = i
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = running.pop(task)
                    status, value, error = task.result()
                    if status == StepStatus.SUCCEEDED:
                        outputs[i] = value
                    elif stop is None or (
                        status == StepStatus.FAILED and stop[0] != StepStatus.FAILED
                    ):
                        stop = (status, error)
                        self.stopping = True
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise
        if stop is not None:
            return await c._close_after(-1, ChainRunStatus(stop[0]), stop[1])
        return await c._close(ChainRunStatus.SUCCEEDED, None, outputs.get(n - 1))

    # --- one step ---------------------------------------------------------------------

    def _rules(self, step: StepSpec) -> Any:
        return parse_rules(self.spec.empty_when) + parse_rules(step.empty_when)

    def _label(self, i: int) -> str:
        return f"step {i} ({self.refs[i].id}, {self.spec.steps[i].skill})"

    async def _step(self, i: int, outputs: dict[int, Any]) -> Outcome:
        step = self.spec.steps[i]
        if step.for_each is not None:
            return await self._fan_out(i, step, outputs)
        started = time.time()
        try:
            data = resolve_input(
                i,
                self.refs,
                outputs,
                allowed=self.graph.ancestors(i),
                prev_step=self.graph.prev(i),
            )
        except UnresolvedReference as exc:
            return await self._refused(i, exc, started)
        await rs.set_step(
            self.c.sm,
            self.c.lease,
            i,
            status=StepStatus.RUNNING,
            started_at=started,
            input=redact(data),
            error=None,
        )
        last = i == len(self.refs) - 1
        scope = self.c._scope(i) if last else None
        async with self.slots:
            executing = self.c._execute(step.skill, data)
            env = await telemetry.traced(
                "skilljobs.chain_step", executing, attrs={"skilljobs.skill": step.skill}
            )
        empty = not is_failure(env) and is_empty(env, self._rules(step))
        if scope is not None and (is_failure(env) or empty):
            scope.close()
        if is_failure(env):
            error = f"{self._label(i)}: {env.get('error') or 'failed'}"
            await self.c._record(i, StepStatus.FAILED, data, env, error, started=started)
            return StepStatus.FAILED, None, error
        if empty:
            note = f"{self._label(i)} returned nothing; chain stopped"
            await self.c._record(i, StepStatus.STOPPED_EMPTY, data, env, None, started=started)
            return StepStatus.STOPPED_EMPTY, None, note
        await self.c._record(i, StepStatus.SUCCEEDED, data, env, None, started=started)
        if scope is not None:
            self.c.final_scope = scope
        return StepStatus.SUCCEEDED, env, None

    async def _refused(self, i: int, exc: UnresolvedReference, started: float) -> Outcome:
        env = failure(
            f"step {i} ({self.refs[i].id}): {exc}",
            error_type="config",
            non_retriable=True,
            reference=exc.reference,
        )
        await self.c._record(i, StepStatus.FAILED, None, env, env["error"], started=started)
        return StepStatus.FAILED, None, str(env["error"])

    # --- for_each ---------------------------------------------------------------------

    async def _fan_out(self, i: int, step: StepSpec, outputs: dict[int, Any]) -> Outcome:
        c, started = self.c, time.time()
        allowed = self.graph.ancestors(i)
        try:
            items = resolve_reference(step.for_each or "", i, self.refs, outputs, allowed=allowed)
        except UnresolvedReference as exc:
            return await self._refused(i, exc, started)
        problem = _items_problem(step, items)
        if problem is not None:
            env = failure(f"step {i} ({self.refs[i].id}): {problem}", non_retriable=True)
            await c._record(i, StepStatus.FAILED, None, env, env["error"], started=started)
            return StepStatus.FAILED, None, str(env["error"])
        assert isinstance(items, list)
        summary = {"for_each": step.for_each, "items": len(items)}
        if not items:  # nothing to run over: the guard's empty
            note = f"{self._label(i)}: for_each {step.for_each} is empty; chain stopped"
            await c._record(i, StepStatus.STOPPED_EMPTY, summary, [], None, started=started)
            return StepStatus.STOPPED_EMPTY, None, note
        await rs.set_step(
            c.sm,
            c.lease,
            i,
            status=StepStatus.RUNNING,
            started_at=started,
            input=summary,
            error=None,
        )
        rows = await rs.ensure_items(
            c.sm, c.lease, [item_idx(i, k) for k in range(len(items))], self.refs[i].id, step.skill
        )
        results: list[Any] = [None] * len(items)
        errors: list[tuple[int, str]] = []
        ctx = await c._context(step.skill)  # one configuration read for all the items

        async def write(rows: list[tuple[int, dict[str, Any]]]) -> list[None]:
            await rs.set_steps(c.sm, c.lease, rows)
            return [None] * len(rows)

        # the items' records, many per transaction (each still awaited before it counts)
        records: Batcher[tuple[int, dict[str, Any]], None] = Batcher(write, name="chain-items")
        todo = []
        for k in range(len(items)):
            row = rows[item_idx(i, k)]
            if row.status == StepStatus.SUCCEEDED:
                results[k] = c.svc.box.unseal(row.output)
            else:
                todo.append(k)

        async def one(k: int) -> None:
            try:
                data = resolve_input(
                    i,
                    self.refs,
                    outputs,
                    allowed=allowed,
                    prev_step=self.graph.prev(i),
                    item=items[k],
                )
            except UnresolvedReference as exc:
                errors.append((k, str(exc)))
                self.stopping = True
                return
            async with self.slots:
                if self.stopping:
                    return  # the run stops: this item is skipped
                began = time.time()
                env = await c._execute(step.skill, data, ctx)
            failed = is_failure(env)
            now = time.time()
            await records.submit(
                (
                    item_idx(i, k),
                    {
                        "status": StepStatus.FAILED if failed else StepStatus.SUCCEEDED,
                        "input": redact(data),
                        "output": c.svc.box.seal(rs.cap_output(env)),
                        "error": str(env.get("error") or "failed") if failed else None,
                        "started_at": began,
                        "finished_at": now,
                        "duration_ms": round((now - began) * 1000, 1),
                    },
                )
            )
            if failed:
                errors.append((k, str(env.get("error") or "failed")))
                self.stopping = True
            else:
                results[k] = env

        await asyncio.gather(*(one(k) for k in todo))
        if errors:
            k, why = min(errors)
            error = f"{self._label(i)}: item {k}: {why}"
            await rs.set_step(
                c.sm,
                c.lease,
                i,
                status=StepStatus.FAILED,
                error=error,
                finished_at=time.time(),
                duration_ms=round((time.time() - started) * 1000, 1),
            )
            return StepStatus.FAILED, None, error
        if self.stopping:  # another step stopped the run meanwhile: not all items ran
            return StepStatus.SKIPPED, None, None
        if is_empty(results, self._rules(step)):
            note = f"{self._label(i)} returned nothing; chain stopped"
            await c._record(i, StepStatus.STOPPED_EMPTY, summary, results, None, started=started)
            return StepStatus.STOPPED_EMPTY, None, note
        await c._record(i, StepStatus.SUCCEEDED, summary, results, None, started=started)
        return StepStatus.SUCCEEDED, results, None


def _items_problem(step: StepSpec, items: object) -> str | None:
    """Why ``items`` cannot be fanned out over (None: it can)."""
    if not isinstance(items, list):
        return f"for_each {step.for_each} is {type(items).__name__}, not a list"
    if len(items) > step.max_items:
        return (
            f"for_each {step.for_each} has {len(items)} items, more than max_items "
            f"({step.max_items}): raise max_items or narrow the list"
        )
    return None


__all__ = ["GraphRun"]
