"""``notify``: one-way notifications through Apprise to an operator alias or a bare Apprise URL.

Apprise sends block, so every send runs in a thread with a timeout. Each service URL gets its
own ``Apprise`` instance, so the result says which targets got the message and which did not.
URLs are never logged or returned with their credentials.

What may be sent where: attachments must resolve inside the caller's workspace (no workspace,
no attachments); a bare URL is accepted only when its scheme and host are listed in
``SKILLJOBS_NOTIFY_ALLOW_URLS`` (aliases are the operator's own); and every URL whose service
connects to a host named in the URL (json, form, xml, ntfy, gotify, self-hosted chat
webhooks…) passes the fetcher's outbound policy first: public https only, no private or
internal address, unless the host is in ``SKILLJOBS_FETCH_ALLOW_HOSTS``. Each refusal is a
failed target naming the rule.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from delivery.artifacts import ArtifactRefused, resolve_inside
from delivery.channels.base import Courier
from delivery.errors import DeliveryOutcomeUnknown, DeliveryPermanentError
from delivery.ledger import Parcel, deliver_once, ledger_key
from delivery.net.pinned import Resolver, system_resolver
from delivery.net.urlsafety import RefusedURL, check_ip, check_url
from jobs import sendscope
from jobs.db import Sessions
from jobs.sendscope import SendScope

if TYPE_CHECKING:
    from jobs.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
_URL_RE = re.compile(r"^[a-z][a-z0-9+.\-]*://", re.I)
# Services that name a host in their URL but do not speak HTTP to it.
NON_HTTP_SCHEMES = frozenset({"mailto", "mailtos", "mqtt", "mqtts", "syslog", "rsyslog", "growl"})


def mask_url(url: str) -> str:
    """The URL with its credentials replaced (safe to log and return).

    Apprise knows which parts of each service's URL are secret; a URL it cannot parse is
    reduced to its scheme and host.
    """
    try:
        import apprise

        plugin: Any = apprise.Apprise.instantiate(url, suppress_exceptions=True)
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


def resolve_target(settings: Settings, target: object) -> tuple[list[str], str | None]:
    """``(urls, error)``: an alias's URLs, a bare URL, or a list of either."""
    found, err = _resolve(settings, target)
    return [u for u, _ in found], err


def _resolve(settings: Settings, target: object) -> tuple[list[tuple[str, bool]], str | None]:
    """``([(url, bare)…], error)``: ``bare`` marks a URL given directly, not by alias."""
    if isinstance(target, list | tuple):
        urls: list[tuple[str, bool]] = []
        for t in target:
            found, err = _resolve(settings, t)
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
        return [(u, False) for a in aliases[target] for u in split_urls(a)], None
    if _URL_RE.match(target):
        return [(u, True) for u in split_urls(target)], None
    known = ", ".join(sorted(aliases)) or "none configured"
    return [], f"unknown notify target {shown(target)!r} (aliases: {known}; or give an Apprise URL)"


def shown(target: str) -> str:
    """A target as it may be shown: any URL in it masked (credentials never echoed)."""
    if "://" not in target:
        return target
    return ", ".join(mask_url(u) for u in split_urls(target))


def split_urls(text: str) -> list[str]:
    """The URLs Apprise itself would find in ``text`` (it splits on commas, spaces and
    more): each one is vetted on its own, so a second URL cannot ride along unvetted."""
    from apprise.utils.parse import parse_urls

    found = [u for u in parse_urls(text) if isinstance(u, str) and u.strip()]  # type: ignore[no-untyped-call]
    return found or [text]


def bare_url_allowed(url: str, allow: list[str]) -> bool:
    """A bare URL's scheme and host (and port, when the entry names one) are allow-listed."""
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return False
    for entry in allow:
        try:
            e = urlsplit(entry if "://" in entry else f"{entry}://")
            e_host, e_port = (e.hostname or "").lower(), e.port
        except ValueError:
            continue
        if e.scheme.lower() == scheme and e_host == host and e_port in (None, port):
            return True
    return False


async def outbound_refusal(
    url: str, allow_hosts: list[str], resolver: Resolver = system_resolver
) -> str | None:
    """Why the outbound policy refuses the host this Apprise URL would connect to (None when
    it may go, or when the service's endpoint is fixed by Apprise rather than the URL)."""
    try:
        import apprise

        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
    except Exception:
        plugin = None
    if not plugin:
        return None  # not a valid Apprise URL: the send itself reports that
    host = getattr(plugin, "host", None)
    templated = any("{host}" in t for t in getattr(plugin, "templates", ()) or ())
    scheme = urlsplit(url).scheme.lower()
    if not templated or not isinstance(host, str) or not host or scheme in NON_HTTP_SCHEMES:
        return None
    http = "https" if getattr(plugin, "secure", False) else "http"
    port = getattr(plugin, "port", None)
    shown = f"[{host}]" if ":" in host else host
    try:
        target = check_url(f"{http}://{shown}{f':{port}' if port else ''}/", allow_hosts)
        if target.allow_listed or target.ip is not None:
            return None
        try:
            answers = await resolver(target.host, target.port)
        except OSError as exc:
            return f"cannot resolve {target.host}: {exc}"
        for ip in answers:
            check_ip(ip)
    except RefusedURL as exc:
        return f"refused by the outbound policy: {exc.reason}"
    return None


def _check_attachments(attach: object, workspace: Path | None) -> tuple[list[str], str | None]:
    """Attachments as real paths inside ``workspace`` (relative ones are taken from it)."""
    if attach in (None, "", []):
        return [], None
    items = [attach] if isinstance(attach, str) else attach
    if not isinstance(items, list | tuple):
        return [], "attach must be a path or a list of paths"
    if workspace is None:
        return [], "attachments refused: the caller has no workspace to send files from"
    paths: list[str] = []
    for a in items:
        if not isinstance(a, str) or not a:
            return [], f"attachment {a!r} is not a path"
        try:
            real = resolve_inside(a, Path(workspace))
        except ArtifactRefused as exc:
            reason = exc.reason
            if reason.startswith("missing file"):
                return [], f"attachment not found: {a}"
            return [], f"attachment refused: {reason}"
        if str(real) not in paths:
            paths.append(str(real))
    return paths, None


def _send_blocking(url: str, body: str, title: str, paths: list[str]) -> tuple[bool, str]:
    import apprise

    ap = apprise.Apprise()
    if not ap.add(url):
        return False, "not a valid Apprise URL (unknown scheme or missing parts)"
    if len(ap) != 1:  # vetted as one URL: never send to more than that one
        return False, "not a single Apprise URL"
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


async def _send_ledgered(
    sessionmaker: Sessions,
    scope: SendScope,
    item: str,
    url: str,
    body: str,
    title: str,
    paths: list[str],
    send_timeout: float,
) -> tuple[bool, str]:

    recipient = f"notify:{mask_url(url)}"

    async def send() -> None:
        ok, why = await _send_one(url, body, title, paths, send_timeout)
        if ok:
            return None
        if why.startswith("timed out"):
            raise DeliveryOutcomeUnknown(why)
        raise DeliveryPermanentError(why)

    courier = Courier(recipient, scope.owner, "notify", job_id=scope.job_id)
    parcel = Parcel(ledger_key(scope.job_id, recipient, item), item=item, content={"text": body})
    out = await deliver_once(sessionmaker, send, courier, parcel)
    return out["status"] == "sent", str(out.get("error") or out["status"])


async def notify(
    settings: Settings,
    message: str,
    *,
    target: object,
    workspace: Path | None,
    title: str | None = None,
    attach: object = None,
    send_timeout: float = DEFAULT_TIMEOUT,
    resolver: Resolver = system_resolver,
    sessionmaker: Sessions | None = None,
) -> dict[str, Any]:
    """Send ``message`` to every URL of ``target`` (an alias or an allow-listed bare URL),
    with ``attach`` taken only from inside ``workspace`` (``None``: no attachments).

    ``target`` is split the way Apprise splits it (commas, spaces, …) and every URL is
    vetted; when any one is refused, nothing is sent.

    Returns ``{"ok", "sent": [masked url…], "failed": [{"target", "error"}…], "message"}``
    with ``ok = bool(sent) and not failed``.
    """
    urls, err = _resolve(settings, target)
    if err:
        return _result([], [{"target": shown(str(target)), "error": err}])
    body = message if isinstance(message, str) else ("" if message is None else str(message))
    paths, err = _check_attachments(attach, workspace)
    if not err and not body.strip() and not paths:
        err = "empty message"
    if err:
        return _result([], [{"target": mask_url(u), "error": err} for u, _ in urls])
    allowed, failed = await _vet(settings, urls, resolver)
    if failed:  # one refused URL refuses the call: nothing is sent to the others either
        refused = {f["target"] for f in failed}
        failed += [
            {"target": mask_url(u), "error": "not sent: another target of this call was refused"}
            for u in allowed
            if mask_url(u) not in refused
        ]
        return _result([], failed)
    # a skill's notification inside a job's run is ledgered (jobs.sendscope): a re-run of
    # the job does not notify again
    digest = hashlib.sha256("\x1f".join([body, title or "", *paths]).encode()).hexdigest()[:32]
    scoped = sendscope.next_call(f"notify:{digest}") if sessionmaker is not None else None

    async def send(u: str) -> tuple[bool, str]:
        if scoped is None or sessionmaker is None:
            return await _send_one(u, body, title or "", paths, send_timeout)
        scope, seq = scoped
        return await _send_ledgered(
            sessionmaker,
            scope,
            f"notify:{seq}:{digest}",
            u,
            body,
            title or "",
            paths,
            send_timeout,
        )

    outcomes = await asyncio.gather(*(send(u) for u in allowed))
    sent: list[str] = []
    for url, (ok, why) in zip(allowed, outcomes, strict=True):
        masked = mask_url(url)
        if ok:
            sent.append(masked)
        else:
            log.warning("notify %s failed: %s", masked, why)
            failed.append({"target": masked, "error": why})
    return _result(sent, failed)


async def _vet(
    settings: Settings, urls: list[tuple[str, bool]], resolver: Resolver
) -> tuple[list[str], list[dict[str, str]]]:
    """The URLs that may be used, and a failed target (with the rule) for each other one."""
    allow = settings.notify_allow_list
    allowed: list[str] = []
    failed: list[dict[str, str]] = []
    for url, bare in urls:
        if bare and not bare_url_allowed(url, allow):
            why = "bare Apprise URL refused: its scheme and host are not in notify_allow_urls"
        else:
            why = await outbound_refusal(url, settings.allow_hosts, resolver) or ""
        if why:
            log.warning("notify %s refused: %s", mask_url(url), why)
            failed.append({"target": mask_url(url), "error": why})
        else:
            allowed.append(url)
    return allowed, failed


def _result(sent: list[str], failed: list[dict[str, str]]) -> dict[str, Any]:
    if sent and not failed:
        msg = f"sent to {len(sent)} target(s)"
    elif sent:
        msg = f"sent to {len(sent)} of {len(sent) + len(failed)} targets"
    else:
        msg = "not sent: " + "; ".join(f["error"] for f in failed[:3])
    return {"ok": bool(sent) and not failed, "sent": sent, "failed": failed, "message": msg}
