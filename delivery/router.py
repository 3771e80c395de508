"""Media routing: a finished job's files and text to the person who asked, each item once.

Recipients come from the job's stored origin, never from whoever is talking now: web,
web_admin and ``orgdeleg:`` sessions get a message on their chat session (stored + pushed
live); third-party channels get it in the group conversation the request came from (the
dispatch context's ``conversation_id``, answering its ``message_id``), else at the job's
``actor_key``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delivery.channels.base import (
    Channel,
    DeliveryPermanentError,
    DeliveryTransientError,
    with_retries,
)
from delivery.channels.limits import parse_target
from delivery.channels.registry import channels_for
from delivery.channels.web import WEB_CHANNELS, WebChannel, attachment_dict
from delivery.channels.web_store import Outgoing
from delivery.ledger import (
    LeaseLost,
    LedgerEntry,
    deliver_once,
    ledger_key,
    owner_id,
)
from delivery.outbox import Outbox, outbox_of
from delivery.plan import SEALED_RESULT, Item, delivered_folder, field_of, plan, write_files
from delivery.render import TEXT_CAP, directives, failure_text
from delivery.richtext import PlainText
from jobs import telemetry
from jobs.context import group_conversation, job_segment, results_dir
from jobs.db import Fence, Sessions
from jobs.models import JobRow
from jobs.services import Services
from jobs.settings import Settings
from jobs.texts import language_of

log = logging.getLogger(__name__)

__all__ = ["TEXT_CAP", "Item", "Origin", "deliver_result", "failure_text", "origin_of", "plan"]


@dataclass(frozen=True)
class Origin:
    channel: str  # adapter name: web / telegram / feishu / wecom / dingtalk
    contact: str  # ``chat:<id>`` for a group conversation (delivery.channels.limits)
    error: str | None = None
    reply_to: str | None = None  # the message that asked, answered where the API can

    @property
    def recipient(self) -> str:
        return f"{self.channel}:{self.contact}"


def origin_of(job: JobRow) -> Origin:
    """Where a job's result goes, from the job row alone."""
    channel = (job.channel or "").strip().lower()
    if channel in WEB_CHANNELS or (job.external_id or "").startswith("orgdeleg:"):
        if not job.session_id:
            return Origin("web", "", "the job has no chat session to deliver to")
        return Origin("web", job.session_id)
    if not channel:
        return Origin("unknown", job.actor_key or "", "the job has no origin channel")
    ctx = job.context if isinstance(job.context, dict) else {}
    group = group_conversation({**ctx, "actor_key": job.actor_key})
    if group:
        reply = str(ctx.get("message_id") or "").strip() or None
        # a forum topic / thread: the result goes back into it (delivery.channels.limits)
        thread = str(ctx.get("message_thread_id") or ctx.get("thread_id") or "").strip()
        thread = thread.replace("/", "").replace("#", "")
        contact = f"chat:{group}/{thread}" if thread else f"chat:{group}"
        return Origin(channel, contact, reply_to=reply)
    if not job.actor_key:
        return Origin(channel, "", f"no {channel} recipient: the job has no actor_key")
    return Origin(channel, job.actor_key)


def workspace_of(settings: Settings, job: JobRow) -> Path:
    """The job's workspace, the same directory its skill ran in (``jobs.context``)."""
    return _workspace(str(settings.resolved_workspace_root), job.role_id, job_segment(job))


_workspace = functools.lru_cache(maxsize=4096)(results_dir)


async def deliver_result(
    services: Services,
    job: JobRow,
    result: dict[str, Any],
    artifacts: list[Any],
    *,
    fence: Fence,
    channels: dict[str, Channel] | None = None,
    backoff: float = 1.0,
    workspace: Path | None = None,
    notice: str | None = None,
) -> list[dict[str, Any]]:
    """Send the job's result to its origin; returns ``[{"recipient","kind","status","error"}]``.
    ``workspace``: where its files must lie (default: the job's own workspace); ``notice``:
    the result is a notice of that kind (``delivery.notices``), its own ledger item.

    ``fence`` is checked before every send: when it says False this attempt lost its lease and
    delivery stops without sending.
    """
    settings = services.settings
    chans = channels if channels is not None else channels_for(services)
    origin = origin_of(job)
    adapter = chans.get(origin.channel)
    if isinstance(adapter, WebChannel):
        adapter = adapter.for_job(job.id)
    common: dict[str, Any] = {
        "recipient": origin.recipient,
        "owner": owner_id(job.lease_owner, job.lease_token),
        "channel": origin.channel,
        "job_id": job.id,
        "chain_run_id": job.chain_run_id,
        "fence": fence,
        "backoff": backoff,
        "dead_after": float(settings.worker_lease_sec) * 2,
        # A re-run after a worker died mid-delivery waits for that worker to be known dead.
        "wait": float(settings.worker_lease_sec) * 2 + 5,
    }
    sm = services.sessionmaker
    problem = origin.error or (
        None if adapter is not None else f"channel {origin.channel!r} is not configured"
    )
    if problem is not None or adapter is None:
        reason = problem or "no adapter"

        async def refuse() -> None:
            raise DeliveryPermanentError(reason)

        # Only the channel is missing: the result is kept (sealed) with the failed row, so
        # a resend once the channel is configured sends what would have gone out.
        content = None
        if origin.error is None and notice is None:
            lang = language_of(settings, job.context if isinstance(job.context, dict) else None)
            held = {
                "result": result,
                "artifacts": [
                    {k: field_of(a, k) for k in ("local_path", "media", "source_url")}
                    for a in artifacts
                ],
                "skill": job.skill,
                "lang": lang,
                "reply_to": origin.reply_to,
                "workspace": str(workspace or workspace_of(settings, job)),
            }
            content = {SEALED_RESULT: services.box.encrypt(held)}

        try:
            return [
                _public(
                    await deliver_once(
                        sm,
                        refuse,
                        key=ledger_key(job.id, origin.recipient, "origin"),
                        kind="text",
                        item="origin",
                        content=content,
                        **common,
                    )
                )
            ]
        except LeaseLost:
            return []

    workspace = workspace or workspace_of(settings, job)
    if artifacts:  # files are attached only from inside the real workspace
        workspace = workspace.resolve()
    out: list[dict[str, Any]] = []
    outbox = outbox_of(services)
    lang = language_of(settings, job.context if isinstance(job.context, dict) else None)
    if notice is not None:
        message = str(result.get("message") or "")
        items = [Item("text", f"notice:{notice}", text=PlainText(message))]
    else:
        items = plan(
            result,
            artifacts,
            adapter,
            skill=job.skill,
            lang=lang,
            workspace=workspace,
            folder=delivered_folder(workspace, job.id),
        )
    await write_files(items, job.id)
    reply = _apply_directives(result, job, adapter, items) or origin.reply_to
    # in a thread reached by replying, every item is a reply (else only the first)
    every = adapter.thread_by_reply and parse_target(origin.contact).thread is not None
    try:
        if isinstance(adapter, WebChannel):
            web = _deliver_web(adapter, origin, items, workspace, common, job.id)
            attrs = {"skilljobs.channel": origin.channel}
            items, out = await telemetry.traced("skilljobs.deliver", web, attrs=attrs)
        for i, item in enumerate(items):
            out.extend(
                await _send_item(
                    sm,
                    adapter,
                    origin,
                    item,
                    workspace,
                    common,
                    job.id,
                    reply_to=reply if i == 0 or every else None,
                    outbox=outbox,
                )
            )
    except LeaseLost:
        pass
    return out


def _apply_directives(
    result: dict[str, Any], job: JobRow, adapter: Channel, items: list[Item]
) -> str | None:
    """The result's ``[[…]]`` tags (seed 004): ``[[audio_as_voice]]`` sends audio as a voice
    note where the channel has one (Telegram: OGG/Opus; another format goes as audio, with
    the reason in the receipt's note); ``[[reply_to_current]]`` / ``[[reply_to:<id>]]``
    answer the originating message (the dispatch context's ``message_id``) or that one.
    Returns the message id the first item replies to."""
    wanted = directives(result)
    if wanted.voice and "voice" in getattr(adapter, "RULES", {}):
        for item in items:
            if item.kind == "audio" and item.path is not None:
                item.kind, item.key = "voice", f"voice:{item.path}"
    if isinstance(adapter, WebChannel):
        return None
    ctx = job.context if isinstance(job.context, dict) else {}
    current = ctx.get("message_id")
    reply = wanted.reply_to or (current if wanted.reply_current else None)
    return str(reply) if reply not in (None, "") else None


def _attachable(path: str, kind: str, workspace: Path) -> dict[str, Any] | None:
    p = Path(path)
    if not p.is_relative_to(workspace) or not p.is_file():
        return None
    return attachment_dict(path, kind)


async def _deliver_web(
    web: WebChannel,
    origin: Origin,
    items: list[Item],
    workspace: Path,
    common: dict[str, Any],
    job_id: str,
) -> tuple[list[Item], list[dict[str, Any]]]:
    """Web sessions: every item stored together with its ledger row in one transaction
    (exactly once, no window). Returns the items left for the generic path (files that
    cannot be attached) and the deliveries made."""
    rest: list[Item] = []
    batch: list[tuple[Item, Outgoing]] = []
    for item in items:
        attachments: list[dict[str, Any]] = []
        if item.path is not None:
            att = _attachable(item.path, item.kind, workspace)
            if att is None:
                rest.append(item)  # fails there, with its reason, and keeps the caption
                continue
            attachments = [att]
        entry = LedgerEntry(
            key=ledger_key(job_id, origin.recipient, item.key),
            recipient=origin.recipient,
            owner=common["owner"],
            kind=item.kind,
            item=item.path or item.key,
            job_id=job_id,
            chain_run_id=common["chain_run_id"],
        )
        batch.append((item, Outgoing(origin.contact, item.text or "", attachments, job_id, entry)))
    if not batch:
        return rest, []
    if not await common["fence"]():
        raise LeaseLost(origin.recipient)

    async def post() -> list[Any]:
        return await web.batcher.post_many([o for _, o in batch])

    try:
        results = await with_retries(post, backoff=common["backoff"])
    except DeliveryTransientError as exc:
        # nothing was committed: the next run delivers these
        return rest, [
            {"recipient": origin.recipient, "kind": i.kind, "status": "failed", "error": exc.reason}
            for i, _ in batch
        ]
    out = []
    for (item, _msg), res in zip(batch, results, strict=True):
        # (each ledger row got its message's id as its receipt when the message was stored)
        error = res.reason if isinstance(res, DeliveryPermanentError) else None
        out.append(
            {
                "recipient": origin.recipient,
                "kind": item.kind,
                "status": "failed" if error else "sent",
                "error": error,
            }
        )
    return rest, out


async def _send_item(
    sm: Sessions,
    adapter: Channel,
    origin: Origin,
    item: Item,
    workspace: Path,
    common: dict[str, Any],
    job_id: str,
    *,
    reply_to: str | None = None,
    outbox: Outbox | None = None,
) -> list[dict[str, Any]]:
    """One item through the ledger. With an outbox (in a worker), an item whose chat has
    no token now is parked there (``pending``) instead of waited for here."""
    # a reply travels in the contact (``<contact>#<message id>``, delivery.channels.limits)
    contact = f"{origin.contact}#{reply_to}" if reply_to and "#" not in origin.contact else None
    contact = contact or origin.contact
    gate = outbox.gate(adapter, origin.recipient, origin.contact) if outbox else None
    if item.path is None:
        text = item.text or ""

        async def send_text() -> str:
            return await adapter.send_text(contact, text)

        return [
            _public(
                await deliver_once(
                    sm,
                    send_text,
                    key=ledger_key(job_id, origin.recipient, item.key),
                    kind="text",
                    item=item.key,
                    content=_content({"text": text, "reply_to": reply_to}, text),
                    dedup=adapter.dedups_for(origin.contact),
                    gate=gate,
                    **common,
                )
            )
        ]
    path, caption = item.path, item.text

    async def send_media() -> str:
        if not Path(path).is_relative_to(workspace):
            raise DeliveryPermanentError(f"{Path(path).name} is outside the job's workspace")
        return await adapter.send_media(item.kind, contact, path, caption)

    res = _public(
        await deliver_once(
            sm,
            send_media,
            key=ledger_key(job_id, origin.recipient, item.key),
            kind=item.kind,
            item=path,
            content=_content({"path": path, "caption": caption, "reply_to": reply_to}, caption),
            dedup=adapter.dedups_for(origin.contact),
            gate=gate,
            **common,
        )
    )
    if caption and res["status"] == "failed":
        # the caption must not be lost with the file: send the text on its own
        fallback = Item("text", "text", text=caption)
        rest = await _send_item(
            sm, adapter, origin, fallback, workspace, common, job_id, outbox=outbox
        )
        return [res, *rest]
    return [res]


def _content(content: dict[str, Any], text: str | None) -> dict[str, Any]:
    """A delivery's stored content; ``plain`` when its text is not Markdown (a resend or
    the outbox sends it as plain text again)."""
    if isinstance(text, PlainText):
        content["plain"] = True
    return content


def _public(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in ("recipient", "kind", "status", "error")}
