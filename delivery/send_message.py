"""``send_message``: two-way delivery to specific recipients on the chat channels.

``to`` accepts ``"feishu:ou_x"``, ``"ou_x"`` with ``channel="feishu"``,
``{"channel": "feishu", "contact": "ou_x"}``, or a list of those. For ``web``/``web_admin``
the contact is the chat ``session_id``. A group conversation is ``"feishu:chat:oc_x"`` (or
``{"channel", "chat"}``); ``…#<message id>`` (or ``"reply_to"``) answers that message where
the platform has replies. Fire-and-forget: nothing waits for replies.

Who may be reached: attachments only from inside the caller's workspace (no workspace, no
attachments). A skill's send to a web session needs that session to belong to the skill's
role and org. ``send_message`` called directly from the chat line (by the model, not by a
business skill) reaches only the caller's own origin — the same channel and person, or the
same web session — unless ``SKILLJOBS_SEND_ALLOW`` gives the role more recipient patterns.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from delivery.artifacts import ArtifactRefused, resolve_inside
from delivery.channels.base import (
    Channel,
    Courier,
    DeliveryPermanentError,
    DeliveryTransientError,
    Receipt,
    with_retries,
)
from delivery.channels.limits import parse_target
from delivery.ledger import Parcel, deliver_once, ledger_key
from delivery.render import strip_directives
from jobs import sendscope
from jobs.db import Sessions
from jobs.execution.callskill import WALL_DEADLINE
from jobs.media import media_kind
from jobs.models import ChatSession, Delivery, DeliveryStatus
from jobs.sendscope import SendScope

_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
KNOWN_CHANNELS = ("feishu", "wecom", "dingtalk", "telegram", "web", "web_admin")
WEB = frozenset({"web", "web_admin"})


@dataclass(frozen=True)
class Sender:
    """Who is sending: the calling skill's identity. ``direct`` is a send the chat line
    dispatched itself; ``allow`` the extra recipient patterns of its role."""

    role_id: str = ""
    org_id: str = ""
    channel: str = ""
    actor_key: str = ""
    session_id: str = ""
    direct: bool = False
    allow: tuple[str, ...] = ()
    #: the group conversation the caller is talking in (``jobs.context.group_conversation``)
    conversation_id: str = ""

    def own(self, channel: str, contact: str) -> bool:
        """Whether ``channel:contact`` is the caller's own chat: their web session, their
        own id on their channel, or the group they are talking in — whatever message a
        ``#<message id>`` anchor answers there."""
        place = parse_target(contact)
        if channel in WEB:
            return bool(self.session_id) and place.id == self.session_id
        if channel != self.channel.strip().lower() or not place.id:
            return False
        if self.conversation_id and place.id == self.conversation_id:
            return True  # ``chat:<id>`` or the platform's own form of the group id
        # a Telegram private chat's id is the user's id: ``chat:<user id>`` is the same chat
        person = not place.chat or channel == "telegram"
        return person and place.id == self.actor_key != ""

    def reason_refused(self, channel: str, contact: str) -> str | None:
        """Why a direct send may not reach ``channel:contact`` (None: it may)."""
        if not self.direct or self.own(channel, contact):
            return None
        label = f"{channel}:{contact}"
        if any(fnmatch.fnmatchcase(label, p) for p in self.allow):
            return None
        return (
            "refused: from the chat line, send_message reaches only your own chat "
            "(the role's send_allow does not list this recipient)"
        )


async def _web_refusals(
    sessionmaker: Sessions | None, sender: Sender, recipients: list[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """Web recipients whose session does not belong to the sender's role and org."""
    wanted = {c for ch, c in recipients if ch in WEB and c != sender.session_id}
    if not wanted:
        return {}
    if sessionmaker is None:
        return {(ch, c): "web delivery is not configured" for ch, c in recipients if c in wanted}
    async with sessionmaker() as s:
        rows = await s.execute(
            select(ChatSession.session_id, ChatSession.role_id, ChatSession.org_id).where(
                ChatSession.session_id.in_(wanted)
            )
        )
        owners = {sid: (role or "", org or "") for sid, role, org in rows}
    out: dict[tuple[str, str], str] = {}
    for ch, c in recipients:
        if ch not in WEB or c not in wanted:
            continue
        owner = owners.get(c)
        if owner is None:
            out[(ch, c)] = f"unknown session {c!r}"
        elif owner != (sender.role_id, sender.org_id):
            out[(ch, c)] = "refused: that chat session belongs to another role or organization"
    return out


def parse_recipients(
    to: object, channel: str | None = None
) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """``to`` in any of its four forms → ``([(channel, contact)…], [failed…])``, each
    recipient once."""
    items = list(to) if isinstance(to, list | tuple) else [to]
    found: list[tuple[str, str]] = []
    bad: list[dict[str, str]] = []
    default = (channel or "").strip().lower() or None
    for item in items:
        ch: str | None
        if isinstance(item, dict):
            ch = str(item.get("channel") or default or "").strip().lower() or None
            contact = str(item.get("contact") or item.get("to") or "").strip()
            if not contact and item.get("chat"):  # a group conversation (channels/limits.py)
                contact = f"chat:{str(item['chat']).strip()}"
            if contact and item.get("reply_to") and "#" not in contact:
                contact = f"{contact}#{str(item['reply_to']).strip()}"
            label = f"{ch}:{contact}" if ch else contact or repr(item)
        elif isinstance(item, str) and item.strip():
            text = item.strip()
            prefix, sep, rest = text.partition(":")
            if sep and prefix.lower() in KNOWN_CHANNELS:
                ch, contact = prefix.lower(), rest.strip()
            elif sep and default is None and _PREFIX.match(prefix):
                bad.append(
                    {
                        "target": text,
                        "error": f"unknown channel {prefix!r} (one of: "
                        f"{', '.join(KNOWN_CHANNELS)})",
                    }
                )
                continue
            else:
                ch, contact = default, text
            label = f"{ch}:{contact}" if ch else text
        else:
            bad.append({"target": repr(item), "error": "a recipient must be a string or an object"})
            continue
        if ch in WEB:  # a chat session has no replies: an anchor names nothing there
            contact = contact.partition("#")[0].strip()
        if not ch:
            bad.append(
                {
                    "target": label,
                    "error": f"recipient {label!r} names no channel: write "
                    "'feishu:ou_x' or pass channel=",
                }
            )
        elif not contact:
            bad.append({"target": label, "error": "empty contact"})
        elif (ch, contact) not in found:
            found.append((ch, contact))
    return found, bad


def _attachment_paths(attachments: object, workspace: Path | None) -> tuple[list[str], str | None]:
    """Attachments as real paths inside ``workspace`` (symlinks followed)."""
    if attachments in (None, "", []):
        return [], None
    if isinstance(attachments, str | dict):
        items: list[object] = [attachments]
    elif isinstance(attachments, Iterable):
        items = list(attachments)
    else:
        raise TypeError(f"'{type(attachments).__name__}' object is not iterable")
    if workspace is None:
        return [], "attachments refused: the caller has no workspace to send files from"
    out: list[str] = []
    for a in items:
        raw = a.get("local_path") or a.get("path") if isinstance(a, dict) else a
        if not isinstance(raw, str) or not raw:
            return [], f"attachment {a!r} has no local path"
        try:
            p = resolve_inside(raw, workspace)
        except ArtifactRefused as exc:
            if exc.reason.startswith("missing file"):
                return [], f"attachment not found: {raw}"
            return [], f"attachment is outside the workspace: {raw}"
        if str(p) not in out:
            out.append(str(p))
    return out, None


async def send_to(
    adapter: Channel, contact: str, text: str, paths: list[str], *, backoff: float = 1.0
) -> None:
    """Text and files to one contact: the text rides as the first file's caption where the
    channel supports captions, else it goes first on its own."""
    caption: str | None = text or None
    if text and (not paths or not adapter.supports_caption):

        async def send_text() -> Receipt:
            return await adapter.send_text(contact, text)

        await with_retries(send_text, backoff=backoff)
        caption = None
    for path in paths:

        async def send_file(path: str = path, cap: str | None = caption) -> Receipt:
            return await adapter.send_media(media_kind(path), contact, path, cap)

        await with_retries(send_file, backoff=backoff)
        caption = None


def _parts(
    adapter: Channel, text: str, paths: list[str]
) -> list[tuple[str, str | None, str | None]]:
    """What :func:`send_to` sends, in order: ``(kind, path or None, text or caption)``."""
    out: list[tuple[str, str | None, str | None]] = []
    caption: str | None = text or None
    if text and (not paths or not adapter.supports_caption):
        out.append(("text", None, text))
        caption = None
    for path in paths:
        out.append((media_kind(path), path, caption))
        caption = None
    return out


def content_digest(text: str, paths: list[str]) -> str:
    return hashlib.sha256("\x1f".join([text, *paths]).encode()).hexdigest()[:32]


async def send_ledgered(
    sessionmaker: Sessions,
    scope: SendScope,
    call: str,
    adapter: Channel,
    channel: str,
    contact: str,
    text: str,
    paths: list[str],
    *,
    backoff: float = 1.0,
) -> list[int]:
    """:func:`send_to` with each part recorded in the delivery ledger under the job, the
    call (``send_message:<sequence number>:<content hash>``) and the part's index: a re-run
    of the job that makes the same call sends nothing that was sent already.

    In a worker (the scope has its outbox), a part whose chat has no rate-limit token within
    what is left of the run's in-place budget (``jobs.sendscope.INLINE_BUDGET``) is parked
    in the outbox instead of waited for, and so is every part after it (they
    stay in order behind it): returns the delivery ids of the parts left queued there
    (empty when everything was sent)."""
    recipient = f"{channel}:{contact}"
    place, _, anchor = contact.partition("#")
    queue = f"{channel}:{place}"  # one outbox queue per chat; a reply's anchor is content
    queued: list[int] = []
    for i, (kind, path, body) in enumerate(_parts(adapter, text, paths)):
        item = f"{call}:{i}"

        async def send(
            kind: str = kind, path: str | None = path, body: str | None = body
        ) -> Receipt:
            if path is None:
                return await adapter.send_text(contact, body or "")
            return await adapter.send_media(kind, contact, path, body)

        content: dict[str, Any] = {"path": path, "caption": body} if path else {"text": body}
        if anchor:
            content["reply_to"] = anchor
        outbox = scope.outbox
        gate = (
            outbox.gate(adapter, queue, place, inline=scope.inline_left)
            if outbox is not None
            else None
        )
        courier = Courier(recipient, scope.owner, channel, job_id=scope.job_id, backoff=backoff)
        key = ledger_key(scope.job_id, recipient, item)
        parcel = Parcel(key, kind, item, content, adapter.dedups_for(contact), gate)
        out = await deliver_once(sessionmaker, send, courier, parcel)
        if gate is not None:  # what it waited in place comes off the run's budget
            scope.inline_left = max(0.0, scope.inline_left - gate.waited)
        if out["status"] == "sent":
            continue
        if out.get("id") is not None and (out.get("parked") or out["status"] == "sending"):
            # parked in the outbox now or by an earlier run of this job, or on its way
            # from there: in the ledger's custody, sent once, in order
            queued.append(int(out["id"]))
            continue
        why = out.get("error") or out["status"]
        if out["status"] == "unknown":
            raise DeliveryPermanentError(f"outcome unknown ({why}); not sent again")
        raise DeliveryPermanentError(str(why))
    return queued


async def _screen(
    sessionmaker: Sessions | None,
    sender: Sender,
    recipients: list[tuple[str, str]],
    failed: list[dict[str, str]],
) -> list[tuple[str, str]]:
    """The recipients ``sender`` may reach; each other one is a failed entry with why."""
    refused = await _web_refusals(sessionmaker, sender, recipients)
    for ch, c in recipients:
        why = sender.reason_refused(ch, c) or refused.get((ch, c))
        if why:
            failed.append({"target": f"{ch}:{c}", "error": why})
    return [r for r in recipients if f"{r[0]}:{r[1]}" not in {f["target"] for f in failed}]


async def send_message(
    channels: dict[str, Channel],
    *,
    to: object,
    text: str | None = None,
    attachments: object = None,
    channel: str | None = None,
    workspace: Path | None = None,
    backoff: float = 1.0,
    sender: Sender | None = None,
    sessionmaker: Sessions | None = None,
    wait: bool = False,
) -> dict[str, Any]:
    """Send ``text`` and ``attachments`` (only from inside ``workspace``) to every recipient
    in ``to``; a ``sender`` (a skill) is held to the recipient rules above.

    ``wait``: a recipient whose message the rate limiter parked in the outbox is waited for
    (within what is left of the run's wall clock) and then answered as ``sent`` (or
    ``failed``); one still parked when time is up stays under ``queued``.

    Returns ``{"ok", "sent": ["<channel>:<contact>"…], "failed": [{"target", "error"}…],
    "message"}`` with ``ok = bool(sent) and not failed``.
    """
    recipients, failed = parse_recipients(to, channel)
    if sender is not None:
        recipients = await _screen(sessionmaker, sender, recipients, failed)
    body = text if isinstance(text, str) else ("" if text is None else str(text))
    paths, err = _attachment_paths(attachments, workspace)
    if err is None and not body.strip() and not paths:
        err = "nothing to send: give a message or attachments"
    if err is not None:
        failed += [{"target": f"{ch}:{c}", "error": err} for ch, c in recipients]
        return _result([], failed or [{"target": str(to), "error": err}])

    # a skill's send inside a job's run is ledgered (jobs.sendscope); one number per call
    digest = content_digest(body, paths)
    scoped = sendscope.next_call(f"send_message:{digest}") if sessionmaker is not None else None

    async def one(ch: str, contact: str) -> tuple[str, str | None, list[int]]:
        target = f"{ch}:{contact}"
        queued: list[int] = []
        adapter = channels.get(ch)
        # outbound directives are delivery metadata, never text ([embed] stays for web)
        text = strip_directives(body, rich=ch in WEB)
        if adapter is None:
            why = (
                f"channel {ch!r} is not configured"
                if ch in KNOWN_CHANNELS
                else f"unknown channel {ch!r} (one of: {', '.join(KNOWN_CHANNELS)})"
            )
            return target, why, queued
        try:
            if scoped is not None and sessionmaker is not None:
                scope, seq = scoped
                call = f"send_message:{seq}:{digest}"
                queued = await send_ledgered(
                    sessionmaker, scope, call, adapter, ch, contact, text, paths, backoff=backoff
                )
            else:
                await send_to(adapter, contact, text, paths, backoff=backoff)
        except (DeliveryPermanentError, DeliveryTransientError) as exc:
            return target, exc.reason, queued
        except Exception as exc:  # one broken adapter must not sink the other recipients
            return target, f"internal error: {type(exc).__name__}: {exc}", queued
        return target, None, queued

    sent: list[str] = []
    waiting: list[dict[str, Any]] = []
    for target, why, ids in await asyncio.gather(*(one(ch, c) for ch, c in recipients)):
        if why is not None:
            failed.append({"target": target, "error": why})
        elif ids:
            waiting.append({"target": target, "delivery_ids": ids})
        else:
            sent.append(target)
    if not recipients and not failed:
        failed.append({"target": str(to), "error": "no recipient given"})
    if wait and waiting and sessionmaker is not None:
        waiting = await _wait_parked(sessionmaker, waiting, sent, failed)
    return _result(sent, failed, waiting)


WAIT_POLL_S = 0.1
IN_FLIGHT = (DeliveryStatus.PENDING, DeliveryStatus.SENDING)
WAIT_DEFAULT_S = 60.0  # outside a run (no wall clock): how long ``wait`` waits at most
WAIT_MARGIN_S = 1.0  # left of the run's wall clock for the skill to answer


async def _wait_parked(
    sessionmaker: Sessions,
    waiting: list[dict[str, Any]],
    sent: list[str],
    failed: list[dict[str, str]],
) -> list[dict[str, Any]]:
    """Wait until the parked deliveries of ``waiting`` are recorded (the outbox sends them),
    at most until the run's wall clock is nearly over; a recipient all of whose parts went
    out joins ``sent``, one with a failed part joins ``failed``. The still-parked rest."""
    from sqlalchemy import select

    deadline = WALL_DEADLINE.get()
    end = deadline - WAIT_MARGIN_S if deadline is not None else time.monotonic() + WAIT_DEFAULT_S
    ids = {i for w in waiting for i in w["delivery_ids"]}
    status: dict[int, tuple[str, str | None]] = {}
    while True:
        async with sessionmaker() as s:
            rows = (
                await s.execute(
                    select(Delivery.id, Delivery.status, Delivery.error).where(
                        Delivery.id.in_(list(ids))
                    )
                )
            ).all()
        status = {int(r[0]): (str(r[1]), r[2]) for r in rows}
        if all(status.get(i, ("", None))[0] not in IN_FLIGHT for i in ids):
            break
        if time.monotonic() + WAIT_POLL_S > end:
            break
        await asyncio.sleep(WAIT_POLL_S)
    still: list[dict[str, Any]] = []
    for w in waiting:
        states = [status.get(i, (DeliveryStatus.PENDING, None)) for i in w["delivery_ids"]]
        if all(st == DeliveryStatus.SENT for st, _ in states):
            sent.append(w["target"])
        elif any(st in IN_FLIGHT for st, _ in states):
            still.append(w)
        else:
            why = next((e or st for st, e in states if st != DeliveryStatus.SENT), "not sent")
            failed.append({"target": w["target"], "error": f"{why}"})
    return still


def _result(
    sent: list[str], failed: list[dict[str, str]], queued: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The answer: ``queued`` (only when some are) lists the recipients whose message waits
    in the outbox for its chat's rate limit, with the ids of its deliveries; they count as
    handed over (``ok``), not as ``sent``."""
    queued = queued or []
    done = len(sent) + len(queued)
    if sent and not failed and not queued:
        msg = f"sent to {len(sent)} recipient(s)"
    elif done and not failed:
        msg = f"sent to {len(sent)} recipient(s); " if sent else ""
        msg += f"queued for {len(queued)} recipient(s) by the rate limit (sent in order shortly)"
    elif done:
        msg = f"sent to {len(sent)} of {done + len(failed)} recipients"
        if queued:
            msg += f" ({len(queued)} queued for the rate limit)"
    else:
        msg = "not sent: " + "; ".join(f"{f['target']}: {f['error']}" for f in failed[:3])
    out: dict[str, Any] = {"ok": bool(done) and not failed, "sent": sent, "failed": failed}
    if queued:
        out["queued"] = queued
    out["message"] = msg
    return out
