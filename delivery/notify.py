"""``notify``: one-way notifications through Apprise to an operator alias or a bare Apprise URL.

Apprise sends block, so every send runs in a thread with a timeout. Each service URL gets its
own ``Apprise`` instance, so the result says which targets got the message and which did not.
URLs are never logged or returned with their credentials.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from jobs.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
_URL_RE = re.compile(r"^[a-z][a-z0-9+.\-]*://", re.I)


def mask_url(url: str) -> str:
    """The URL with its credentials replaced (safe to log and return).

    Apprise knows which parts of each service's URL are secret; a URL it cannot parse is
    reduced to its scheme and host.
    """
    try:
        import apprise

        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
        if plugin:
            # drop the long list of default parameters Apprise adds
            return urlsplit(str(plugin.url(privacy=True)))._replace(query="").geturl()
    except Exception:  # an unparsable URL: fall through to the coarse mask
        pass
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return "<invalid url>"
    return f"{parts.scheme}://{host}/****" if parts.scheme else "<invalid url>"


def resolve_target(settings: Settings, target: Any) -> tuple[list[str], str | None]:
    """``(urls, error)``: an alias's URLs, a bare URL, or a list of either."""
    if isinstance(target, list | tuple):
        urls: list[str] = []
        for t in target:
            found, err = resolve_target(settings, t)
            if err:
                return [], err
            urls.extend(found)
        return urls, None if urls else "no notify target given"
    if not isinstance(target, str) or not target.strip():
        return [], "no notify target given"
    target = target.strip()
    try:
        aliases = settings.notify_target_map
    except ValueError as exc:
        return [], f"notify targets are misconfigured: {exc}"
    if target in aliases:
        if not aliases[target]:
            return [], f"notify target {target!r} has no URLs configured"
        return list(aliases[target]), None
    if _URL_RE.match(target):
        return [target], None
    known = ", ".join(sorted(aliases)) or "none configured"
    return [], f"unknown notify target {target!r} (aliases: {known}; or give an Apprise URL)"


def _check_attachments(attach: Any) -> tuple[list[str], str | None]:
    if attach in (None, "", []):
        return [], None
    items = [attach] if isinstance(attach, str) else attach
    if not isinstance(items, list | tuple):
        return [], "attach must be a path or a list of paths"
    paths: list[str] = []
    for a in items:
        if not isinstance(a, str) or not a:
            return [], f"attachment {a!r} is not a path"
        p = Path(a).expanduser()
        if not p.is_absolute():
            return [], f"attachment must be an absolute path: {a}"
        if not p.is_file():
            return [], f"attachment not found: {a}"
        paths.append(str(p))
    return paths, None


def _send_blocking(url: str, body: str, title: str, paths: list[str]) -> tuple[bool, str]:
    import apprise

    ap = apprise.Apprise()
    if not ap.add(url):
        return False, "not a valid Apprise URL (unknown scheme or missing parts)"
    attach = apprise.AppriseAttachment(paths) if paths else None
    if attach is not None and len(attach) != len(paths):
        return False, "an attachment could not be read"
    ok = ap.notify(body=body, title=title, attach=attach)
    return bool(ok), "" if ok else "the service did not accept the notification"


async def _send_one(
    url: str, body: str, title: str, paths: list[str], send_timeout: float
) -> tuple[bool, str]:
    try:
        async with asyncio.timeout(send_timeout):
            return await asyncio.to_thread(_send_blocking, url, body, title, paths)
    except TimeoutError:
        return False, f"timed out after {send_timeout:g} s"
    except Exception as exc:  # Apprise plugins raise anything; one target must not sink others
        return False, f"{type(exc).__name__}: {exc}"


async def notify(
    settings: Settings,
    message: str,
    *,
    target: Any,
    title: str | None = None,
    attach: Any = None,
    send_timeout: float = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Send ``message`` to every URL of ``target`` (an alias or a bare Apprise URL).

    Returns ``{"ok", "sent": [masked url…], "failed": [{"target", "error"}…], "message"}``
    with ``ok = bool(sent) and not failed``.
    """
    label = target if isinstance(target, str) and not _URL_RE.match(target) else None
    urls, err = resolve_target(settings, target)
    if err:
        return _result([], [{"target": str(label or mask_url(str(target))), "error": err}])
    body = message if isinstance(message, str) else ("" if message is None else str(message))
    paths, err = _check_attachments(attach)
    if not err and not body.strip() and not paths:
        err = "empty message"
    if err:
        return _result([], [{"target": mask_url(u), "error": err} for u in urls])
    outcomes = await asyncio.gather(
        *(_send_one(u, body, title or "", paths, send_timeout) for u in urls)
    )
    sent: list[str] = []
    failed: list[dict[str, str]] = []
    for url, (ok, why) in zip(urls, outcomes, strict=True):
        masked = mask_url(url)
        if ok:
            sent.append(masked)
        else:
            log.warning("notify %s failed: %s", masked, why)
            failed.append({"target": masked, "error": why})
    return _result(sent, failed)


def _result(sent: list[str], failed: list[dict[str, str]]) -> dict[str, Any]:
    if sent and not failed:
        msg = f"sent to {len(sent)} target(s)"
    elif sent:
        msg = f"sent to {len(sent)} of {len(sent) + len(failed)} targets"
    else:
        msg = "not sent: " + "; ".join(f["error"] for f in failed[:3])
    return {"ok": bool(sent) and not failed, "sent": sent, "failed": failed, "message": msg}
