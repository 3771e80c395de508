"""The dispatcher: every skill call from the chat layer comes through here.

``async: true`` skills called from a non-web channel (or from an ``orgdeleg:`` session)
are answered at once with a receipt and run by a worker; everything else runs now, through
the same executor, and returns its normalized result (SPEC §4, §11 "Dispatch answers").
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobs import storable, telemetry, texts
from jobs.catalog.configs import ConfigStore
from jobs.catalog.validation import input_problem
from jobs.context import (
    background_context,
    channel_of,
    fixed_segment,
    flatten_configs,
    job_workspace,
)
from jobs.db import once_more_if_disconnected
from jobs.envelope import failure, offload_sync
from jobs.execution.executor import Executor
from jobs.execution.inputs import shape_problem
from jobs.execution.syncfiles import confine_answer
from jobs.models import QUEUED, SCHEDULED, new_id
from jobs.queue import delayed, idempotency, intake, limits, store
from jobs.queue.broker import job_event
from jobs.services import Services
from jobs.skill import Skill, SkillRegistry, SkillType
from jobs.storable import TEXT_REPLACED, valid_text
from jobs.textcheck import context_problem, text_problem

log = logging.getLogger("skilljobs.dispatch")

WEB_CHANNELS = frozenset({"web", "web_admin"})
ORGDELEG_PREFIX = "orgdeleg:"
STALE_TRIES = 5  # builds of a job whose configuration changed under it before a 503
RECEIPT_MESSAGE = texts.text("receipt")  # the English form; receipts use the caller's language


@dataclass
class DispatchResult:
    """What the chat layer gets: an HTTP-shaped answer (status code + JSON body)."""

    status_code: int
    body: dict[str, Any]

    @property
    def is_async(self) -> bool:
        return self.status_code == 202


def is_background(skill: Skill, channel: str, external_id: str) -> bool:
    """SPEC §4: async iff the skill says so AND (non-web channel OR orgdeleg session)."""
    return skill.is_async and (
        channel not in WEB_CHANNELS or external_id.startswith(ORGDELEG_PREFIX)
    )


def external_id_of(external_id: str | None, context: Mapping[str, Any]) -> str:
    """The session id a dispatch names: the argument, else the context's ``external_id``."""
    return str(external_id if external_id is not None else context.get("external_id") or "")


def runs_now(
    registry: SkillRegistry,
    skill: str,
    context: Mapping[str, Any],
    external_id: str | None,
    *,
    deferred: bool = False,
) -> bool:
    """The one sync-or-background rule: ``skill`` (or ``<skill>__<sub>``) is a loadable
    handler the dispatcher runs on the sync line. Refusals, background jobs and calls
    ``deferred`` to later (``run_at`` / ``delay_s``) are False."""
    hit = registry.resolve(skill)
    if deferred or hit is None or hit[0].error or hit[0].skill_type is not SkillType.HANDLER:
        return False
    return not is_background(hit[0], channel_of(context), external_id_of(external_id, context))


def delivers_to_session(channel: str, external_id: str) -> bool:
    """Web, web_admin and orgdeleg results go to the chat session; others to actor_key."""
    return channel in WEB_CHANNELS or external_id.startswith(ORGDELEG_PREFIX)


def refusal(
    status_code: int, error: str, error_type: str = "recoverable", **extra: Any
) -> DispatchResult:
    return DispatchResult(status_code, failure(error, error_type=error_type, **extra))


def _typed(
    skill: str, ctx: dict[str, Any], external_id: object, idempotency_key: object
) -> DispatchResult | None:
    """Context ids typed and every identity field storable text on both databases: else
    400 (NUL, invalid Unicode) or 422 (wrong type, too long), naming the field."""
    if (problem := context_problem(ctx)) is not None:
        text = str(problem)
        status = 400 if "NUL" in text or "Unicode" in text else 422
        return refusal(status, text, skill=skill, field=problem.field)
    for given, where in ((external_id, "external_id"), (idempotency_key, "idempotency_key")):
        if isinstance(given, str) and (bad := text_problem(given)) is not None:
            return refusal(400, f"{where} {bad}", field=where)
    return None


def _noted(answer: DispatchResult, replaced: list[str]) -> DispatchResult:
    """The answer naming where the input's invalid text was replaced by U+FFFD."""
    if replaced and isinstance(answer.body, dict):
        answer.body = {**answer.body, TEXT_REPLACED: [f"input.{p}" for p in replaced]}
    return answer


def _too_big(values: dict[str, Any], skill: str) -> DispatchResult | None:
    """413 when the job's input or context, as it would be stored, is over the storable
    limit (``jobs.storable.JSON_CAP``): a job runs on exactly what was sent or not at all."""
    for field in ("input", "context"):
        size = storable.oversize(values.get(field))
        if size is not None:
            return refusal(
                413,
                f"{field} too large for a background job: {size:,} characters as stored, the "
                f"limit is {storable.JSON_CAP:,}. Send large data as a file (an attachment or "
                "a URL the skill downloads) instead of inline.",
                skill=skill,
                field=field,
                size=size,
                limit=storable.JSON_CAP,
            )
    return None


def _option_problem(idempotency_key: str | None, priority: int | None) -> str | None:
    if idempotency_key is not None and (bad := idempotency.key_problem(idempotency_key)):
        return bad
    if priority is not None and (bad := limits.priority_problem(priority)):
        return bad
    return None


def _span_attrs(skill: Skill, background: bool) -> dict[str, str | bool]:
    return {"skilljobs.skill": skill.name, "skilljobs.background": background}


def _answered(res: DispatchResult) -> dict[str, str | int]:
    return {
        "skilljobs.job.id": str(res.body.get("job_id") or ""),
        "skilljobs.status_code": res.status_code,
    }


class Dispatcher:
    """Decides async vs sync, records and enqueues background jobs, runs the rest."""

    def __init__(self, services: Services, executor: Executor | None = None) -> None:
        self.services = services
        self._executor = executor

    @property
    def executor(self) -> Executor:
        return self._executor if self._executor is not None else self.services.executor

    async def dispatch(
        self,
        skill: str,
        input: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
        external_id: str | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        run_at: float | str | None = None,
        delay_s: float | str | None = None,
    ) -> DispatchResult:
        """``idempotency_key``: the same key within 24 h gives the same background job
        (and receipt); with another skill or input it is a 409. ``priority``: 0 (first) to
        9 (last) in the queue, default 3 (chain runs: 6). ``run_at`` (ISO 8601 or epoch
        seconds) or ``delay_s`` (seconds, or ``"10m"``): the job waits ``scheduled`` until
        then and runs in the background whatever the skill's ``async`` says."""
        if not isinstance(input or {}, dict) or not isinstance(context or {}, dict):
            return refusal(400, "input and context must be JSON objects")
        for value, where in ((input, "input"), (context, "context")):
            if (bad := shape_problem(value, where)) is not None:
                return refusal(400, f"{where} refused: {bad}", skill=skill)
        context = dict(context or {})
        if (refused := _typed(skill, context, external_id, idempotency_key)) is not None:
            return refused
        # a lone surrogate in the input (a string cut inside an emoji) becomes U+FFFD; the
        # receipt says where (C24)
        input, replaced = valid_text(input or {})
        if (bad := _option_problem(idempotency_key, priority)) is not None:
            return refusal(400, bad)
        due_at, bad = delayed.due_time(run_at, delay_s, time.time())
        if bad is not None:
            return refusal(400, bad)
        input_data = dict(input or {})
        ctx = dict(context or {})
        ext = external_id_of(external_id, ctx)

        hit = self.services.registry.resolve(skill)
        if hit is None:
            return refusal(
                404,
                f"unknown skill {skill!r}: no skill folder with that name is loaded",
                skill=skill,
            )
        found, sub = hit
        if sub is not None:  # <skill>__<sub>: the skill + its subcommand
            skill = found.name
            input_data["_subcommand"] = sub
        if found.error:
            return refusal(
                409,
                f"skill {skill!r} failed to load: {found.error}",
                "config",
                skill=skill,
                non_retriable=True,
            )
        if found.skill_type is not SkillType.HANDLER:
            return refusal(
                400,
                f"skill {skill!r} is a {found.skill_type.value} document, not an executable "
                "skill: it cannot be dispatched" + (f"; {found.hint}" if found.hint else ""),
                "config",  # the operator fixes the skill folder; no other input helps
                skill=skill,
                non_retriable=True,
            )
        problem = input_problem(found, input_data)
        if problem:
            return refusal(
                422,
                f"input for {skill!r} is invalid: {problem}",
                skill=skill,
                need_param=problem.fields or True,
            )

        segment = fixed_segment(ctx)
        channel = segment["channel"]
        if due_at is not None or is_background(found, channel, ext):
            if not delivers_to_session(channel, ext) and not segment["actor_key"]:
                return refusal(
                    422,
                    f"{skill!r} runs in the background and sends its result to the caller, but "
                    f"this {channel or 'unknown'} caller has no actor_key (anonymous visitor or "
                    "admin proxy): there is nowhere to deliver it. Ask the user to sign in, "
                    "or run it from a web session.",
                    skill=skill,
                )
            if delivers_to_session(channel, ext) and not ctx.get("session_id"):
                return refusal(
                    422,
                    f"{skill!r} runs in the background and delivers to the chat "
                    "session, but the context has no session_id",
                    skill=skill,
                )
            queued = self._enqueue(
                found, input_data, ctx, ext, idempotency_key, priority, segment, due_at
            )
            answer = await telemetry.traced(
                "skilljobs.dispatch", queued, attrs=_span_attrs(found, True), outcome=_answered
            )
        else:
            sync = self._run_now(found, input_data, ctx, ext)
            answer = await telemetry.traced(
                "skilljobs.dispatch", sync, attrs=_span_attrs(found, False), outcome=_answered
            )
        return _noted(answer, replaced)

    # --- sync line ----------------------------------------------------------------------

    async def _run_now(
        self, skill: Skill, input_data: dict[str, Any], ctx: dict[str, Any], ext: str = ""
    ) -> DispatchResult:

        runtime = dict(ctx)
        runtime.update(fixed_segment(ctx))
        if ext.startswith(ORGDELEG_PREFIX):
            # a delegated request on the sync line too: force_raw_prompt must not apply
            runtime["external_id"] = ext
        runtime.setdefault("chat_mode", True)
        # the run's own workspace, as a background job's: the session's, else (third-party
        # channels) one per recipient — two people never share one (C1)
        workspace = runtime.get("workspace_dir") or self._sync_workspace(runtime)
        if workspace:
            runtime["workspace_dir"] = workspace
        role_id = str(ctx.get("role_id") or "")
        if role_id:
            configs = await ConfigStore(self.services.sessionmaker, self.services.box).get(
                role_id, skill.name
            )
            for k, v in flatten_configs(skill.name, configs).items():
                runtime.setdefault(k, v)
        result = await self.executor.run(skill, input_data, runtime)
        # files the answer names: only inside the run's workspace or attachments (C5)
        result = confine_answer(
            result, runtime.get("workspace_dir"), runtime.get("attachments") or ()
        )
        # The sync answer of a large result is the offload receipt, as in the background (C4).
        settings = self.services.settings
        return DispatchResult(200, offload_sync(settings, result, runtime, skill.name))

    def _sync_workspace(self, runtime: dict[str, Any]) -> str | None:
        from types import SimpleNamespace

        who = SimpleNamespace(
            role_id=str(runtime.get("role_id") or ""),
            session_id=str(runtime.get("session_id") or ""),
            channel=str(runtime.get("channel") or ""),
            actor_key=str(runtime.get("actor_key") or ""),
            external_id=str(runtime.get("external_id") or ""),
        )
        root = self.services.settings.resolved_workspace_root
        ws = job_workspace(root, who)
        return str(ws) if ws is not None else None

    # --- background line ----------------------------------------------------------------

    async def _enqueue(
        self,
        skill: Skill,
        input_data: dict[str, Any],
        ctx: dict[str, Any],
        ext: str,
        idempotency_key: str | None = None,
        priority: int | None = None,
        segment: dict[str, Any] | None = None,
        due_at: float | None = None,
    ) -> DispatchResult:
        svc = self.services
        role_id = str(ctx.get("role_id") or "")
        job_id = new_id()
        # The key is claimed in the batch that records the job (one transaction); when it
        # exists already, it is looked up and, if it may be taken over, claimed on its own.
        key: tuple[str, str, float] | None = None
        shown = idempotency_key  # the caller's key, as named in answers
        if idempotency_key is not None:
            # the same key from another caller is another job (C23): stored scoped
            idempotency_key = idempotency.scoped(idempotency_key, ctx)
            digest = idempotency.request_hash(skill.name, input_data)
            key = (idempotency_key, digest, time.time())
        for _ in range(STALE_TRIES):
            # cached, or read together with the concurrent dispatches' configurations; the
            # batch records the job only while they are still at that generation
            configs, generation = (
                await once_more_if_disconnected(intake.prefetch_configs, svc, role_id, skill.name)
                if role_id
                else ({}, None)
            )
            new_job = self._new_job(
                skill, input_data, ctx, ext, job_id, priority, segment, configs, generation, due_at
            )
            if (too_big := _too_big(new_job.values, skill.name)) is not None:
                return too_big  # never stored as a summary: the skill runs on what was sent
            new_job.key = key
            try:
                # Group commit with the concurrent dispatches: returns once recorded AND
                # enqueued.
                await telemetry.traced("skilljobs.enqueue", intake.submit(svc, new_job))
            except intake.StaleConfig:
                continue  # the configuration changed meanwhile: build the job again
            except intake.KeyTaken:
                assert idempotency_key is not None and key is not None
                claimed = await idempotency.claim(
                    svc.sessionmaker, idempotency_key, key[1], job_id, taken=True
                )
                if claimed.conflict:
                    return refusal(
                        409,
                        f"idempotency_key {shown!r} was used for another request "
                        f"(job {claimed.job_id}) with a different skill or input",
                        job_id=claimed.job_id,
                    )
                if not claimed.new:
                    return self._receipt(claimed.job_id, ctx, due_at)
                key = None  # taken over for this job: record it without claiming again
                continue
            except intake.Unqueued as exc:
                # Recorded but not enqueued (removed again): never a receipt for work
                # that may not run, and no failed job for a refusal.
                log.warning("enqueue of job %s failed: %s", job_id, exc.cause)
                if idempotency_key is not None:  # a retry with the key must make a job
                    await idempotency.release(svc.sessionmaker, idempotency_key, job_id)
                return refusal(
                    503,
                    f"the job queue is unavailable ({exc.cause.__class__.__name__}); "
                    "try again in a moment",
                    error_type="transient",
                )
            except BaseException:  # not recorded (nothing was): the caller gets the error
                if idempotency_key is not None:
                    with contextlib.suppress(Exception):
                        await idempotency.release(svc.sessionmaker, idempotency_key, job_id)
                raise
            if new_job.session is not None:
                svc.known_sessions.add(
                    (new_job.values["session_id"], role_id, new_job.values["external_id"])
                )
            return self._receipt(job_id, ctx, due_at)
        return refusal(
            503,
            f"the configuration of {skill.name!r} kept changing while it was dispatched; "
            "try again in a moment",
            error_type="transient",
            skill=skill.name,
        )

    def _new_job(
        self,
        skill: Skill,
        input_data: dict[str, Any],
        ctx: dict[str, Any],
        ext: str,
        job_id: str,
        priority: int | None,
        segment: dict[str, Any] | None,
        configs: dict[str, Any],
        generation: int | None,
        due_at: float | None = None,
    ) -> intake.NewJob:
        """The row, origin session, live event and lane metadata of a new job."""

        svc = self.services
        role_id = str(ctx.get("role_id") or "")
        bg = background_context(ctx, skill=skill.name, configs=configs, segment=segment)
        if ext.startswith(ORGDELEG_PREFIX):  # delegated: force_raw_prompt does not apply
            bg["external_id"] = ext
        now = time.time()
        later = due_at is not None and due_at > now
        status = SCHEDULED if later else QUEUED
        values = {
            "id": job_id,
            "skill": skill.name,
            "status": status,
            "attempts": 0,
            "input": svc.box.seal(input_data),
            "context": svc.box.seal(bg),
            "fetches": [],
            "channel": bg.get("channel", ""),
            "session_id": str(bg.get("session_id") or ""),
            "external_id": ext,
            "actor_key": bg.get("actor_key", ""),
            "role_id": role_id,
            "org_id": str(bg.get("org_id") or ""),
            "priority": limits.PRIORITY_INTERACTIVE if priority is None else priority,
            "wall_sec": skill.effective_wall_sec(),
            "lease_token": 0,
            "cancel_requested": False,
            "arq_job_id": store.arq_id(job_id, 0),
            "created_at": now,
            "queued_at": now,
            "updated_at": now,
            "traceparent": telemetry.traceparent(),  # the workers' spans join this trace
            "run_at": due_at,
        }
        session_key = (values["session_id"], role_id, ext)
        new_session = (
            bool(values["session_id"])
            and delivers_to_session(values["channel"], ext)
            and session_key not in svc.known_sessions
        )
        origin_session = (
            {
                "session_id": values["session_id"],
                "role_id": role_id,
                "org_id": values["org_id"],
                "channel": values["channel"],
                "external_id": ext,
            }
            if new_session
            else None
        )
        return intake.NewJob(
            values=values,
            session=origin_session,
            event=job_event(svc, job_id, status, skill.name),
            meta=limits.meta(
                skill=skill.name,
                org=values["org_id"],
                actor=values["actor_key"],
                role=role_id,
                priority=values["priority"],
            ),
            generation=generation,
        )

    def _receipt(
        self, job_id: str, ctx: dict[str, Any], due_at: float | None = None
    ) -> DispatchResult:
        language = texts.language_of(self.services.settings, ctx)
        body: dict[str, Any] = {
            "ok": True,
            "async": True,
            "message": texts.text("receipt", language),
            "job_id": job_id,
        }
        if due_at is not None:  # the receipt says when
            when = delayed.iso(due_at)
            body.update(
                status=SCHEDULED if due_at > time.time() else QUEUED,
                run_at=when,
                run_at_epoch=due_at,
                message=texts.text("receipt_scheduled", language, when=when),
            )
        return DispatchResult(202, body)
