"""``send_message``: two-way delivery to specific recipients on the chat channels.

``to`` accepts ``"feishu:ou_x"``, ``"ou_x"`` with ``channel="feishu"``,
``{"channel": "feishu", "contact": "ou_x"}``, or a list of those. For ``web``/``web_admin``
the contact is the chat ``session_id``. Fire-and-forget: nothing waits for replies.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from delivery.channels.base import (
    Channel,
    DeliveryPermanentError,
    DeliveryTransientError,
    with_retries,
)
from jobs.media import media_kind

_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
KNOWN_CHANNELS = ("feishu", "wecom", "dingtalk", "telegram", "web", "web_admin")


def parse_recipients(
    to: Any, channel: str | None = None
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


def _attachment_paths(attachments: Any, workspace: Path | None) -> tuple[list[str], str | None]:
    if attachments in (None, "", []):
        return [], None
    items = [attachments] if isinstance(attachments, str | dict) else list(attachments)
    out: list[str] = []
    for a in items:
        raw = a.get("local_path") or a.get("path") if isinstance(a, dict) else a
        if not isinstance(raw, str) or not raw:
            return [], f"attachment {a!r} has no local path"
        p = Path(raw).expanduser()
        if not p.is_absolute():
            if workspace is None:
                return [], f"attachment must be an absolute path: {raw}"
            p = workspace / p
        p = p.resolve()
        if workspace is not None and not p.is_relative_to(workspace.resolve()):
            return [], f"attachment is outside the workspace: {raw}"
        if not p.is_file():
            return [], f"attachment not found: {raw}"
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

        async def send_text() -> Any:
            return await adapter.send_text(contact, text)

        await with_retries(send_text, backoff=backoff)
        caption = None
    for path in paths:

        async def send_file(path: str = path, cap: str | None = caption) -> Any:
            return await adapter.send_media(media_kind(path), contact, path, cap)

        await with_retries(send_file, backoff=backoff)
        caption = None


async def send_message(
    channels: dict[str, Channel],
    *,
    to: Any,
    text: str | None = None,
    attachments: Any = None,
    channel: str | None = None,
    workspace: Path | None = None,
    backoff: float = 1.0,
) -> dict[str, Any]:
    """Send ``text`` and ``attachments`` to every recipient in ``to``.

    Returns ``{"ok", "sent": ["<channel>:<contact>"…], "failed": [{"target", "error"}…],
    "message"}`` with ``ok = bool(sent) and not failed``.
    """
    recipients, failed = parse_recipients(to, channel)
    body = text if isinstance(text, str) else ("" if text is None else str(text))
    paths, err = _attachment_paths(attachments, workspace)
    if err is None and not body.strip() and not paths:
        err = "nothing to send: give a message or attachments"
    if err is not None:
        failed += [{"target": f"{ch}:{c}", "error": err} for ch, c in recipients]
        return _result([], failed or [{"target": str(to), "error": err}])

    async def one(ch: str, contact: str) -> tuple[str, str | None]:
        target = f"{ch}:{contact}"
        adapter = channels.get(ch)
        if adapter is None:
            why = (
                f"channel {ch!r} is not configured"
                if ch in KNOWN_CHANNELS
                else f"unknown channel {ch!r} (one of: {', '.join(KNOWN_CHANNELS)})"
            )
            return target, why
        try:
            await send_to(adapter, contact, body, paths, backoff=backoff)
        except (DeliveryPermanentError, DeliveryTransientError) as exc:
            return target, exc.reason
        except Exception as exc:  # one broken adapter must not sink the other recipients
            return target, f"internal error: {type(exc).__name__}: {exc}"
        return target, None

    sent: list[str] = []
    for target, why in await asyncio.gather(*(one(ch, c) for ch, c in recipients)):
        if why is None:
            sent.append(target)
        else:
            failed.append({"target": target, "error": why})
    if not recipients and not failed:
        failed.append({"target": str(to), "error": "no recipient given"})
    return _result(sent, failed)


def _result(sent: list[str], failed: list[dict[str, str]]) -> dict[str, Any]:
    if sent and not failed:
        msg = f"sent to {len(sent)} recipient(s)"
    elif sent:
        msg = f"sent to {len(sent)} of {len(sent) + len(failed)} recipients"
    else:
        msg = "not sent: " + "; ".join(f"{f['target']}: {f['error']}" for f in failed[:3])
    return {"ok": bool(sent) and not failed, "sent": sent, "failed": failed, "message": msg}
