"""Delivering a chain's outcome to the schedule's ``deliver`` recipient, through the same
pipeline as a job's result.

The final step's output is post-processed like a job's (``filename`` → ``local_path``,
remote URLs materialized under the outbound policy, artifacts registered, confined to the
chain's workspace and backfilled only from what that step wrote), then routed per channel
(media by kind, captions, directives) item by item through the ledger, with custody and
the shared rate limits (a parked item waits in the outbox, not in the chain's worker).
``deliver: {each_step: true}`` also sends each earlier step's files as that step ends.

``{to}`` names one or more recipients the way ``send_message`` takes them, ``{session_id}``
a web chat session; ``{target}`` is a ``notify`` alias (Apprise, the text and the files,
ledgered once). Ledger keys are made of the run id (``<run>:<step>`` for a step's files),
the recipient and the item, so a resumed or re-run chain never sends anything twice. The
run's result records its ``artifacts``, ``fetches`` and ``deliveries``; ``delivery`` is
the first failed one (else the first).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chains.runstore import FAILED, STOPPED_EMPTY, Lease, LeaseLost, renew
from delivery import ledger
from delivery.channels.base import Courier
from delivery.channels.web import WEB_CHANNELS, ensure_session
from delivery.errors import DeliveryPermanentError
from delivery.notify import notify
from delivery.pipeline import postprocess
from delivery.render import render
from delivery.router import deliver_result
from delivery.send_message import parse_recipients
from jobs.context import workspace_dir
from jobs.db import Fence
from jobs.models import JobStatus
from jobs.runscope import begin as begin_scope
from jobs.texts import language_of, localized_reason
from jobs.texts import text as say

if TYPE_CHECKING:
    from chains.schedules import ScheduleSpec
    from jobs.models import ChainRun
    from jobs.runscope import RunScope
    from jobs.services import Services

log = logging.getLogger("skilljobs.chains")

TEXT_CAP = 3500
_TEXT_FIELDS = ("message", "result", "text", "display_md", "summary")


def outcome_text(name: str, status: str, final: object, error: str | None, lang: str = "en") -> str:
    """The short, user-facing text for a chain outcome (never a stack trace), in ``lang``."""

    if error:
        error = localized_reason(error.splitlines()[0] if status == FAILED else error, lang)
    if status == STOPPED_EMPTY:
        reason = error or say("chain_empty_reason", lang)
        return say("chain_empty", lang, name=name, reason=reason)
    if status == FAILED:
        reason = (error or say("chain_failed_reason", lang)).splitlines()[0][:500]
        return say("chain_failed", lang, name=name, reason=reason)
    if isinstance(final, dict):
        for key in _TEXT_FIELDS:
            value = final.get(key)
            if isinstance(value, str) and value.strip():
                return value[:TEXT_CAP]
        # a readable rendering of the content, never a JSON dump (C3)
        return render(final, skill=name, lang=lang, limit=TEXT_CAP)
    else:
        text = final if isinstance(final, str) else json.dumps(final, ensure_ascii=False)
    return f"{name}: {text}"[:TEXT_CAP]


@dataclass(frozen=True)
class ChainOrigin:
    """A chain run's delivery to one recipient, as delivery reads a job
    (:class:`jobs.models.JobRow`): ``id`` keys the ledger (``<run>`` or ``<run>:<step>``)."""

    id: str
    skill: str
    channel: str
    chain_run_id: str
    actor_key: str = ""
    session_id: str = ""
    role_id: str = ""
    org_id: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    lease_owner: str | None = None
    lease_token: int = 0
    status: str = JobStatus.RUNNING
    input: dict[str, Any] = field(default_factory=dict)
    external_id: str = ""
    attempts: int = 1
    traceparent: str | None = None


@dataclass
class Route:
    """Where a chain's outcome goes: origins (channel, contact) or a notify target."""

    origins: list[tuple[str, str]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    notify: str | None = None


def route_of(deliver: dict[str, Any]) -> Route:

    if deliver.get("session_id"):
        return Route([("web", str(deliver["session_id"]))])
    if deliver.get("target"):
        return Route(notify=str(deliver["target"]))
    found, bad = parse_recipients(deliver.get("to"), deliver.get("channel"))
    failed = [
        {"recipient": b.get("target", ""), "kind": "text", "status": "failed", "error": b["error"]}
        for b in bad
    ]
    return Route(found, failed)


def workspace_of_spec(services: Services, spec: ScheduleSpec) -> Path | None:
    """The workspace the schedule's steps run in (``<root>/<role>/<session or shared>``)."""
    identity = spec.identity
    return workspace_dir(
        services.settings.resolved_workspace_root,
        str(identity.get("role_id") or ""),
        str(identity.get("session_id") or ""),
    )


def _origin(
    ledger_id: str, run: ChainRun, spec: ScheduleSpec, lease: Lease, channel: str, contact: str
) -> ChainOrigin:

    web = channel in WEB_CHANNELS
    identity = spec.identity
    return ChainOrigin(
        id=ledger_id,
        skill=spec.name,
        channel=channel,
        chain_run_id=run.id,
        actor_key="" if web else contact,
        session_id=contact if web else "",
        role_id=str(identity.get("role_id") or ""),
        org_id=str(identity.get("org_id") or ""),
        context={k: v for k, v in identity.items() if k in ("locale", "message_id")},
        lease_owner=lease.owner,
        lease_token=lease.token,
    )


def _fence(services: Services, lease: Lease) -> Any:
    async def fence() -> bool:
        try:
            await renew(services.sessionmaker, lease, services.settings.worker_lease_sec)
        except LeaseLost:
            return False
        return True

    return fence


def summary(deliveries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The one delivery record a run shows first: the first that did not arrive, else the
    first."""
    for d in deliveries:
        if d.get("status") not in ("sent",):
            return d
    return deliveries[0] if deliveries else None


async def deliver_outcome(
    services: Services,
    lease: Lease,
    run: ChainRun,
    spec: ScheduleSpec,
    status: str,
    final: object,
    error: str | None,
    *,
    scope: RunScope | None = None,
) -> dict[str, Any]:
    """Post-process and send the outcome once per item and recipient. Returns what the
    run records: ``{"delivery", "deliveries", "artifacts", "fetches"}`` (+ problems)."""
    deliver = dict(spec.deliver or {})
    lang = language_of(services.settings, spec.identity)
    ok = status not in (FAILED, STOPPED_EMPTY)
    if ok:
        env = (
            final
            if isinstance(final, dict)
            else {"ok": True, "message": outcome_text(spec.name, status, final, error, lang)}
        )
    else:
        env = {"ok": True, "message": outcome_text(spec.name, status, final, error, lang)}
    return await _deliver(services, lease, run, spec, run.id, env, deliver, scope=scope, post=ok)


async def deliver_step_files(
    services: Services,
    lease: Lease,
    run: ChainRun,
    spec: ScheduleSpec,
    index: int,
    skill: str,
    output: object,
    *,
    scope: RunScope | None = None,
) -> dict[str, Any]:
    """``deliver: {each_step: true}``: an earlier step's files (not its text) as it ends,
    captioned with the step; nothing when it made none."""
    if not isinstance(output, dict):
        return {"deliveries": [], "artifacts": []}
    caption = f"{spec.name}: step {index + 1} ({skill})"
    return await _deliver(
        services,
        lease,
        run,
        spec,
        f"{run.id}:{index}",
        output,
        dict(spec.deliver or {}),
        scope=scope,
        post=True,
        caption=caption,
    )


async def _deliver(
    services: Services,
    lease: Lease,
    run: ChainRun,
    spec: ScheduleSpec,
    ledger_id: str,
    env: dict[str, Any],
    deliver: dict[str, Any],
    *,
    scope: RunScope | None,
    post: bool,
    caption: str | None = None,
) -> dict[str, Any]:

    fence = _fence(services, lease)
    ws = workspace_of_spec(services, spec)
    route = route_of(deliver)
    first = _origin(ledger_id, run, spec, lease, *(route.origins or [("web", "")])[0])
    artifacts: list[Any] = []
    record: dict[str, Any] = {"artifacts": [], "fetches": []}
    if post and ws is not None:
        if scope is None:  # resumed past the step: nothing is backfilled, declared files are
            scope = begin_scope(ws, ledger_id)
        done = await postprocess(
            services,
            first,
            env,
            fence=fence,
            deliver=False,
            scope=scope,
            workspace=ws,
            store=False,
        )
        env, artifacts = done.result, done.artifacts
        record["artifacts"] = [a.to_dict() for a in artifacts]
        record["fetches"] = done.fetches
        if done.problems:
            record["artifact_problems"] = done.problems
    elif scope is not None:
        scope.close()
    if caption is not None:  # a step's files alone, captioned with the step
        if not artifacts:
            return {**record, "deliveries": []}
        env = {"ok": True, "message": caption}
    deliveries: list[Mapping[str, Any]] = list(route.failed)
    try:
        if route.notify is not None:
            deliveries.append(
                await _notify(
                    services,
                    run,
                    ledger_id,
                    route.notify,
                    deliver,
                    env,
                    artifacts,
                    ws,
                    lease,
                    fence,
                )
            )
        for channel, contact in route.origins:
            job = _origin(ledger_id, run, spec, lease, channel, contact)
            if job.session_id:
                await _ensure_web_session(services, job)
            deliveries += await deliver_result(
                services, job, env, artifacts, fence=fence, workspace=ws
            )
    except ledger.LeaseLost as exc:
        raise LeaseLost(str(exc)) from exc
    return {**record, "delivery": summary(deliveries), "deliveries": deliveries}


async def _ensure_web_session(services: Services, job: ChainOrigin) -> None:
    """A chain may deliver to a web session that no dispatch has created yet: it is
    created for the schedule's identity (an existing one keeps its values), so the outcome
    is stored there instead of failing on an unknown session."""
    await ensure_session(
        services.sessionmaker,
        job.session_id,
        role_id=job.role_id,
        org_id=job.org_id,
        channel="web",
    )


async def _notify(
    services: Services,
    run: ChainRun,
    ledger_id: str,
    target: str,
    deliver: dict[str, Any],
    env: dict[str, Any],
    artifacts: list[Any],
    workspace: Path | None,
    lease: Lease,
    fence: Fence,
) -> dict[str, Any]:
    """A notify target gets the text and the files in one Apprise message, ledgered once."""

    recipient = f"notify:{target}"
    text = render(env, skill=str(run.schedule_id), limit=TEXT_CAP) if env else ""
    message = env.get("message") if isinstance(env.get("message"), str) else None
    text = message or text
    attach = [a.local_path for a in artifacts]

    async def send() -> None:
        result = await notify(
            services.settings,
            text,
            target=target,
            title=deliver.get("title"),
            attach=attach or None,
            workspace=workspace,
        )
        if not result.get("sent"):  # success is judged by ``sent``
            raise DeliveryPermanentError(str(result.get("message") or "no recipient accepted it"))

    owner = ledger.owner_id(lease.owner, lease.token)
    courier = Courier(recipient, owner, "notify", chain_run_id=run.id, fence=fence)
    key = ledger.ledger_key(ledger_id, recipient, "outcome")
    parcel = ledger.Parcel(key, "text", "outcome", content={"text": text})
    out = await ledger.deliver_once(services.sessionmaker, send, courier, parcel)
    return {k: out.get(k) for k in ("recipient", "kind", "status", "error")}
