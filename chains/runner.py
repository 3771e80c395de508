"""Running one chain: steps in order through the shared executor, under the chain policy.

* Identity comes from the schedule (``channel: "schedule"``, ``triggered_at`` = fire time),
  configs are looked up per ``role_id`` + step skill, ``chat_mode`` is False and the
  policy's wall clock applies. ``async: true`` skills run inline (the chain is already in
  the background).
* Progress is durable: each step's record is committed as it happens, so a run resumed
  after its worker died skips the steps that already succeeded and feeds their stored
  outputs to later references.
* A step whose output is empty stops the chain (``stopped_empty``; later steps
  ``skipped``) — empty by the guard or by the schedule's or step's ``empty_when``
  (``chains.emptiness``); with ``quiet_when_empty`` such a run sends nothing. A failed step fails the run with that step's error; a reference that does
  not resolve fails the step ``non_retriable`` before it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from chains import policies
from chains import runstore as rs
from chains.deliver import deliver_outcome, deliver_step_files, workspace_of_spec
from chains.emptiness import Rule, is_empty
from chains.emptiness import parse as parse_rules
from chains.graphrun import GraphRun
from chains.refs import UnresolvedReference, resolve_input
from chains.runs import enqueue_run
from chains.schedules import ScheduleSpec, StepSpec, spec_of
from jobs import telemetry
from jobs.catalog.configs import ConfigStore
from jobs.constants import MAX_RUNS
from jobs.context import background_context
from jobs.crypto import redact
from jobs.envelope import failure, is_failure, is_non_retriable
from jobs.execution.inprocess import RUN_TASKS
from jobs.models import ChainRun, ChainRunStatus, Schedule, StepStatus
from jobs.queue.store import LOST_CAP_REASON
from jobs.runscope import RunScope
from jobs.runscope import begin as begin_scope

if TYPE_CHECKING:
    from jobs.execution.executor import Executor
    from jobs.queue.runner import WorkerContext
    from jobs.services import Services

log = logging.getLogger("skilljobs.chains")

TRANSIENT_BACKOFF_SEC = 1.0

#: this process's chain attempts: stop event → the in-process skill tasks of its step
_ATTEMPTS: dict[asyncio.Event, set[asyncio.Task[Any]]] = {}
#: hand-backs in flight: a stopping worker waits for them before it closes its connections
#: (a second cancel of the attempt would otherwise leave one half done: the run queued in
#: the database, its queue entry never written)
_HANDING_BACK: set[asyncio.Task[None]] = set()


def stop_attempts() -> int:
    """This process was stopped long enough for peers to presume it dead (SIGSTOP, a frozen
    VM) and is running again: its chain attempts stop before their steps take another step
    (a peer may be running them) and hand their runs back (a no-op when a peer took them).
    The number of attempts stopped."""
    for stop, tasks in _ATTEMPTS.items():
        stop.set()
        for task in tasks:
            task.cancel()  # now, before their own wake-ups run
    return len(_ATTEMPTS)


async def chain_job(ctx: WorkerContext, run_id: str) -> str:
    """The arq job body registered under ``FN_RUN_CHAIN``."""
    return await run_chain(
        ctx["services"],
        ctx["executor"],
        run_id,
        worker_id=ctx["worker_id"],
        arq_id=ctx.get("job_id"),
    )


async def run_chain(
    services: Services,
    executor: Executor,
    run_id: str,
    *,
    worker_id: str,
    arq_id: str | None = None,
) -> str:
    """Run (or resume) chain run ``run_id``; returns its final status, ``"busy"`` when
    another live worker holds it, ``"superseded"`` when queue entry ``arq_id`` is not the
    run's latest, or ``"lost"`` when the lease was taken over meanwhile."""
    sm = services.sessionmaker
    lease_sec = services.settings.worker_lease_sec
    lease = await rs.take_lease(sm, run_id, worker_id, lease_sec, arq_id=arq_id)
    if lease is None:
        async with sm() as s:
            run = await s.get(ChainRun, run_id)
        if run is None:
            log.warning("chain run %s does not exist", run_id)
            return "missing"
        if run.status in rs.RUN_FINAL:
            return run.status
        return "superseded" if arq_id and run.arq_job_id != arq_id else "busy"

    stop = asyncio.Event()
    skill_tasks: set[asyncio.Task[Any]] = set()
    RUN_TASKS.set(skill_tasks)  # (this attempt's own task: a context of its own)
    _ATTEMPTS[stop] = skill_tasks
    beat = asyncio.create_task(_heartbeat(services, lease, stop))
    try:
        running = _ChainRun(services, executor, lease, stop).run()
        attrs = {"skilljobs.chain_run.id": run_id}
        parent = telemetry.derived(run_id)  # one trace however many workers resume the run
        return await telemetry.traced(
            "skilljobs.chain_run", running, parent=parent, attrs=attrs, outcome=_ended
        )
    except rs.LeaseLost:
        log.warning("chain run %s: lease lost; this attempt stops", run_id)
        await _hand_back(services, lease)  # (fenced: only when no peer has taken it)
        return "lost"
    except asyncio.CancelledError:
        # The worker is stopping (its grace period is over): the run goes back to the
        # queue for another worker, not counted as lost; its succeeded steps are kept.
        handing = asyncio.ensure_future(_hand_back(services, lease))
        _HANDING_BACK.add(handing)
        handing.add_done_callback(_HANDING_BACK.discard)
        await asyncio.shield(handing)
        raise
    finally:
        _ATTEMPTS.pop(stop, None)
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await beat


def _step(index: int, step_id: str, skill: str) -> dict[str, str | int]:
    return {"skilljobs.step": index, "skilljobs.step.id": step_id, "skilljobs.skill": skill}


def _ended(status: str) -> dict[str, str]:
    return {"skilljobs.outcome": status}


async def handed_back(limit_s: float = 10.0) -> None:
    """Wait (up to ``limit_s``) for the hand-backs in flight, before connections close."""
    if _HANDING_BACK:
        await asyncio.wait(set(_HANDING_BACK), timeout=limit_s)


async def _hand_back(services: Services, lease: rs.Lease) -> None:
    try:
        n = await rs.hand_back(services.sessionmaker, lease)
        if n is not None:
            await enqueue_run(services, lease.run_id, n)
            log.info("chain run %s: handed back", lease.run_id)
    except Exception as exc:  # its lease runs out and the reconciliation pass re-runs it
        log.warning("chain run %s: hand back failed: %s", lease.run_id, exc)


async def _heartbeat(services: Services, lease: rs.Lease, lost: asyncio.Event) -> None:
    settings = services.settings
    interval = max(0.05, min(settings.worker_heartbeat_sec, settings.worker_lease_sec / 3))
    while True:
        await asyncio.sleep(interval)
        try:
            await rs.renew(services.sessionmaker, lease, settings.worker_lease_sec)
        except rs.LeaseLost:
            lost.set()
            return
        except Exception as exc:  # a database hiccup: keep trying while the lease lasts
            log.warning("chain run %s: lease renewal failed: %s", lease.run_id, exc)


class _ChainRun:
    def __init__(
        self, services: Services, executor: Executor, lease: rs.Lease, lost: asyncio.Event
    ):
        self.svc = services
        self.sm = services.sessionmaker
        self.executor = executor
        self.lease = lease
        self.lost = lost
        # what this attempt's steps wrote (backfill takes only that) and what they delivered
        self.final_scope: RunScope | None = None
        self.sent: dict[str, list[Any]] = {"deliveries": [], "artifacts": [], "fetches": []}

    async def run(self) -> str:
        async with self.sm() as s:
            run = await s.get(ChainRun, self.lease.run_id)
            schedule = await s.get(Schedule, run.schedule_id) if run else None
        assert run is not None
        if schedule is None:
            await rs.finish(
                self.sm, self.lease, ChainRunStatus.FAILED, error="the schedule no longer exists"
            )
            return ChainRunStatus.FAILED
        spec = spec_of(schedule)
        self.run_row, self.schedule, self.spec = run, schedule, spec
        refs = spec.step_refs()
        records = await rs.ensure_steps(
            self.sm, self.lease, [(r.id, st.skill) for r, st in zip(refs, spec.steps, strict=True)]
        )
        if self.lease.lost >= MAX_RUNS:
            return await self._fail_lost(records)
        graph = spec.graph()
        if graph.is_graph:  # needs / for_each: chains.graphrun
            return await GraphRun(self, refs, records, graph).run()
        outputs: list[Any] = []
        for i, step in enumerate(spec.steps):
            rec = records[i]
            if rec.status == StepStatus.SUCCEEDED:
                outputs.append(self.svc.box.unseal(rec.output))
                continue
            if rec.status in (
                StepStatus.STOPPED_EMPTY,
                StepStatus.FAILED,
            ):  # recorded, run not closed yet
                return await self._close_after(i, ChainRunStatus(rec.status), rec.error)
            try:
                data = resolve_input(i, refs, outputs)
            except UnresolvedReference as exc:
                env = failure(
                    f"step {i} ({refs[i].id}): {exc}",
                    error_type="config",
                    non_retriable=True,
                    reference=exc.reference,
                )
                await self._record(
                    i, StepStatus.FAILED, None, env, env["error"], started=time.time()
                )
                return await self._close_after(i, ChainRunStatus.FAILED, env["error"])
            started = time.time()
            await rs.set_step(
                self.sm,
                self.lease,
                i,
                status=StepStatus.RUNNING,
                started_at=started,
                input=redact(data),
                error=None,
            )
            scope = self._scope(i)
            executing = self._execute(step.skill, data)
            env = await telemetry.traced(
                "skilljobs.chain_step", executing, attrs=_step(i, refs[i].id, step.skill)
            )
            empty = not is_failure(env) and is_empty(env, self._empty_rules(step))
            if scope is not None and (is_failure(env) or empty):
                scope.close()
            if is_failure(env):
                error = f"step {i} ({refs[i].id}, {step.skill}): {env.get('error') or 'failed'}"
                await self._record(i, StepStatus.FAILED, data, env, error, started=started)
                return await self._close_after(i, ChainRunStatus.FAILED, error)
            if empty:
                note = f"step {i} ({refs[i].id}, {step.skill}) returned nothing; chain stopped"
                await self._record(i, StepStatus.STOPPED_EMPTY, data, env, None, started=started)
                return await self._close_after(i, ChainRunStatus.STOPPED_EMPTY, note)
            await self._record(i, StepStatus.SUCCEEDED, data, env, None, started=started)
            outputs.append(env)
            if i == len(spec.steps) - 1:
                self.final_scope = scope
            elif self._each_step():
                sent = await deliver_step_files(
                    self.svc, self.lease, run, spec, i, step.skill, env, scope=scope
                )
                self._keep(sent)
            elif scope is not None:
                scope.close()
        final = outputs[-1] if outputs else None
        return await self._close(ChainRunStatus.SUCCEEDED, None, final)

    def _scope(self, i: int) -> RunScope | None:
        """A snapshot of the chain's workspace as step ``i`` starts: its backfill then
        takes only the files that step wrote."""

        ws = workspace_of_spec(self.svc, self.spec)
        return begin_scope(ws, f"{self.lease.run_id}:{i}") if ws is not None else None

    def _empty_rules(self, step: StepSpec) -> list[Rule]:
        """The schedule's ``empty_when`` and the step's (validated when they were stored)."""
        return parse_rules(self.spec.empty_when) + parse_rules(step.empty_when)

    def _each_step(self) -> bool:
        return bool((self.spec.deliver or {}).get("each_step"))

    def _keep(self, sent: dict[str, Any]) -> None:
        for key in self.sent:
            self.sent[key].extend(sent.get(key) or [])

    async def _fail_lost(self, records: list[Any]) -> str:
        """Every allowed run was lost (each time its worker died or stalled, perhaps because
        of a step): the run fails instead of running that step again, the running step
        failed with the reason, the rest skipped, the outcome delivered as any failure."""
        reason = LOST_CAP_REASON.format(n=self.lease.lost)
        log.warning("chain run %s: %s; not run again", self.lease.run_id, reason)
        at = -1
        for i, rec in enumerate(records):
            if rec.status == StepStatus.RUNNING:
                await rs.set_step(
                    self.sm,
                    self.lease,
                    i,
                    status=StepStatus.FAILED,
                    error=reason,
                    finished_at=time.time(),
                )
                at = i
                break
            if rec.status != StepStatus.SUCCEEDED:
                break
            at = i
        return await self._close_after(at, ChainRunStatus.FAILED, reason)

    async def _execute(
        self, skill: str, data: dict[str, Any], ctx: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Run ``skill`` (transient failures again, up to the run cap). ``ctx``: a context
        built by :meth:`_context` already (the items of a for_each step share one)."""
        runs = 0
        while True:
            runs += 1
            env = await self._execute_once(skill, data, ctx)
            transient = is_failure(env) and env.get("error_type") == "transient"
            if not transient or is_non_retriable(env) or runs >= MAX_RUNS:
                return env
            log.info("chain run %s: %s failed transiently (run %s)", self.lease.run_id, skill, runs)
            await asyncio.sleep(TRANSIENT_BACKOFF_SEC * 2 ** (runs - 1))

    async def _execute_once(
        self, skill: str, data: dict[str, Any], shared: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        ctx = dict(shared) if shared is not None else await self._context(skill)
        wall = self.spec.policy.wall_sec
        task = asyncio.ensure_future(self.executor.run(skill, data, ctx, policy_wall_sec=wall))
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            done, _ = await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the worker is stopping: so does the skill
            task.cancel()
            raise
        finally:
            lost.cancel()
        if task not in done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise rs.LeaseLost(self.lease.run_id)
        try:
            env = task.result()
        except Exception as exc:  # the executor normally never raises; be safe anyway
            log.exception("chain run %s: executor raised", self.lease.run_id)
            return failure(f"skill {skill!r} could not run: {exc.__class__.__name__}: {exc}")
        if not isinstance(env, dict):
            env = {"ok": True, "result": env}
        return env

    async def _context(self, skill: str) -> dict[str, Any]:
        """The chain's runtime context: the schedule's identity, chain policy."""

        identity = dict(self.spec.identity)
        role_id = str(identity.get("role_id") or "")
        configs: dict[str, Any] = {}
        if role_id:
            configs = await ConfigStore(self.sm, self.svc.box).get(role_id, skill)
        origin = {
            **identity,
            "channel": "schedule",
            "triggered_at": self.run_row.fire_at,
            "triggered_at_str": "",
        }
        ctx = background_context(origin, skill=skill, configs=configs)
        ctx["chat_mode"] = False  # chain policy: nobody can answer a confirmation here
        return ctx

    async def _record(
        self,
        i: int,
        status: StepStatus,
        data: dict[str, Any] | None,
        env: object,
        error: str | None,
        *,
        started: float,
    ) -> None:
        now = time.time()
        await rs.set_step(
            self.sm,
            self.lease,
            i,
            status=status,
            input=redact(data) if data is not None else None,
            output=self.svc.box.seal(rs.cap_output(env)),
            error=error,
            started_at=started,
            finished_at=now,
            duration_ms=round((now - started) * 1000, 1),
        )

    async def _close_after(self, i: int, status: ChainRunStatus, error: str | None) -> str:
        await rs.skip_rest(self.sm, self.lease, i)
        return await self._close(status, error, None)

    async def _close(self, status: ChainRunStatus, error: str | None, final: object) -> str:
        result: dict[str, Any] = {"output": rs.cap_output(final)} if final is not None else {}
        if status == ChainRunStatus.STOPPED_EMPTY and self.spec.quiet_when_empty:
            # nothing to say: no delivery at all (the run's record says why)
            result["delivery"] = "quiet"
            if self.final_scope is not None:
                self.final_scope.close()
        elif self.spec.deliver:
            sent = await deliver_outcome(
                self.svc,
                self.lease,
                self.run_row,
                self.spec,
                status,
                final,
                error,
                scope=self.final_scope,
            )
            self._keep(sent)
            result.update(self.sent, delivery=sent.get("delivery"))
            if sent.get("artifact_problems"):
                result["artifact_problems"] = sent["artifact_problems"]
        elif self.final_scope is not None:
            self.final_scope.close()
        await rs.finish(self.sm, self.lease, status, error=error, result=self.svc.box.seal(result))
        log.info("chain run %s finished: %s", self.lease.run_id, status)
        await policies.after_run(self.svc, self.schedule.id, status)
        try:  # a run held behind this one (overlap ``queue_one``, catch-up replays) goes now
            await policies.release_held(self.svc, self.schedule.id)
        except Exception as exc:  # the reconciliation pass releases it later
            log.warning(
                "chain run %s: releasing the next held run failed: %s", self.lease.run_id, exc
            )
        return status


__all__ = ["ScheduleSpec", "chain_job", "handed_back", "run_chain", "stop_attempts"]
