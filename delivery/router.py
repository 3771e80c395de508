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
    Courier,
    Delivered,
    DeliveryPermanentError,
    Receipt,
    Send,
)
from delivery.channels.limits import parse_target
from delivery.channels.registry import channels_for
from delivery.channels.web import WEB_CHANNELS
from delivery.ledger import LeaseLost, Parcel, deliver_once, ledger_key, owner_id
from delivery.outbox import Outbox, outbox_of
from delivery.plan import SEALED_RESULT, Item, delivered_folder, field_of, plan, write_files
from delivery.render import TEXT_CAP, directives, failure_text
from delivery.richtext import PlainText
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
) -> list[Delivered]:
    """Send the job's result to its origin; returns ``[{"recipient","kind","status","error"}]``.
    ``workspace``: where its files must lie (default: the job's own workspace); ``notice``:
    the result is a notice of that kind (``delivery.notices``), its own ledger item.

    ``fence`` is checked before every send: when it says False this attempt lost its lease and
    delivery stops without sending.
    """
    settings = services.settings
    chans = channels if channels is not None else channels_for(services)
    origin = origin_of(job)
    found = chans.get(origin.channel)
    adapter = found.for_job(job.id) if found is not None else None
    courier = Courier(
        recipient=origin.recipient,
        owner=owner_id(job.lease_owner, job.lease_token),
        channel=origin.channel,
        job_id=job.id,
        chain_run_id=job.chain_run_id,
        fence=fence,
        backoff=backoff,
        dead_after=float(settings.worker_lease_sec) * 2,
        # A re-run after a worker died mid-delivery waits for that worker to be known dead.
        wait=float(settings.worker_lease_sec) * 2 + 5,
    )
    sm = services.sessionmaker
    problem = origin.error or (
        None if adapter is not None else f"channel {origin.channel!r} is not configured"
    )
    if problem is not None or adapter is None:
        reason = problem or "no adapter"

        async def refuse() -> Receipt:
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
        parcel = Parcel(
            ledger_key(job.id, origin.recipient, "origin"), "text", "origin", content=content
        )
        try:
            return [_public(await deliver_once(sm, refuse, courier, parcel))]
        except LeaseLost:
            return []

    workspace = workspace or workspace_of(settings, job)
    if artifacts:  # files are attached only from inside the real workspace
        workspace = workspace.resolve()
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
    sends = [
        Send(
            item.kind,
            item.key,
            origin.contact,
            ledger_key(job.id, origin.recipient, item.key),
            text=item.text,
            path=item.path,
            reply_to=reply if i == 0 or every else None,
            workspace=workspace,
        )
        for i, item in enumerate(items)
    ]
    one = functools.partial(_send_item, sm, adapter, courier, outbox=outbox_of(services))
    out: list[Delivered] = []
    try:
        async for done in adapter.send_batch(courier, sends, one):
            out.append(done)
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
    if wanted.voice and adapter.voice_notes:
        for item in items:
            if item.kind == "audio" and item.path is not None:
                item.kind, item.key = "voice", f"voice:{item.path}"
    if not adapter.replies:
        return None
    ctx = job.context if isinstance(job.context, dict) else {}
    current = ctx.get("message_id")
    reply = wanted.reply_to or (current if wanted.reply_current else None)
    return str(reply) if reply not in (None, "") else None


async def _send_item(
    sm: Sessions, adapter: Channel, courier: Courier, send: Send, *, outbox: Outbox | None = None
) -> list[Delivered]:
    """One item through the ledger. With an outbox (in a worker), an item whose chat has
    no token now is parked there (``pending``) instead of waited for here."""
    # a reply travels in the contact (``<contact>#<message id>``, delivery.channels.limits)
    reply_to = send.reply_to
    contact = f"{send.contact}#{reply_to}" if reply_to and "#" not in send.contact else None
    contact = contact or send.contact
    gate = outbox.gate(adapter, courier.recipient, send.contact) if outbox else None
    dedup = adapter.dedups_for(send.contact)
    if send.path is None:
        text = send.text or ""

        async def send_text() -> Receipt:
            return await adapter.send_text(contact, text)

        content = _content({"text": text, "reply_to": reply_to}, text)
        parcel = Parcel(send.key, "text", send.item, content, dedup, gate)
        return [_public(await deliver_once(sm, send_text, courier, parcel))]
    path, caption, workspace = send.path, send.text, send.workspace

    async def send_media() -> Receipt:
        if workspace is None or not Path(path).is_relative_to(workspace):
            raise DeliveryPermanentError(f"{Path(path).name} is outside the job's workspace")
        return await adapter.send_media(send.kind, contact, path, caption)

    content = _content({"path": path, "caption": caption, "reply_to": reply_to}, caption)
    parcel = Parcel(send.key, send.kind, path, content, dedup, gate)
    res = _public(await deliver_once(sm, send_media, courier, parcel))
    if caption and res["status"] == "failed":
        # the caption must not be lost with the file: send the text on its own
        key = ledger_key(courier.job_id or "", courier.recipient, "text")
        fallback = Send("text", "text", send.contact, key, text=caption, workspace=workspace)
        rest = await _send_item(sm, adapter, courier, fallback, outbox=outbox)
        return [res, *rest]
    return [res]


def _content(content: dict[str, Any], text: str | None) -> dict[str, Any]:
    """A delivery's stored content; ``plain`` when its text is not Markdown (a resend or
    the outbox sends it as plain text again)."""
    if isinstance(text, PlainText):
        content["plain"] = True
    return content


def _public(d: dict[str, Any]) -> Delivered:
    return {
        "recipient": d["recipient"],
        "kind": d["kind"],
        "status": d["status"],
        "error": d["error"],
    }
