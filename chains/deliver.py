"""Delivering a chain's outcome to the schedule's ``deliver`` recipient, once.

``{to}`` goes through ``send_message``, ``{target}`` through ``notify``, ``{session_id}``
to that web chat session. Files go along only from inside the chain's workspace. Each send
is recorded in the delivery ledger under a key made from the run id and recipient, so a
resumed or re-run chain never sends it twice.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chains.runstore import FAILED, STOPPED_EMPTY, Lease, LeaseLost, renew
from jobs.texts import language_of

if TYPE_CHECKING:
    from chains.schedules import ScheduleSpec
    from jobs.models import ChainRun
    from jobs.services import Services

log = logging.getLogger("skilljobs.chains")

TEXT_CAP = 3500
_TEXT_FIELDS = ("message", "result", "text", "display_md", "summary")


def outcome_text(name: str, status: str, final: Any, error: str | None, lang: str = "en") -> str:
    """The short, user-facing text for a chain outcome (never a stack trace), in ``lang``."""
    from delivery.render import render
    from jobs.texts import text as say

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


def _file(value: Any, workspace: Path | None) -> str | None:
    """An existing file named by ``value``: absolute, or relative to the chain's workspace
    (a step returning ``{"filename": "report.csv"}`` means the file it wrote there). The
    senders confine it to the workspace again."""
    if not isinstance(value, str) or not value.strip() or "://" in value:
        return None
    p = Path(value)
    if not p.is_absolute():
        if workspace is None:
            return None
        p = workspace / p
    return str(p) if p.is_file() else None


def _attachments(final: Any, workspace: Path | None = None) -> list[str]:
    if not isinstance(final, dict):
        return []
    out = []
    for key in ("local_path", "filename", "file_path", "path"):
        if (path := _file(final.get(key), workspace)) is not None:
            out.append(path)
    for key in ("images", "videos", "files", "audios", "attachments"):
        items = final.get(key)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                item = item.get("local_path") or item.get("filename")
            if (path := _file(item, workspace)) is not None:
                out.append(path)
    return list(dict.fromkeys(out))


def _recipient(deliver: dict[str, Any]) -> tuple[str, str]:
    """(``kind`` of route, recipient label for the ledger)."""
    if deliver.get("session_id"):
        return "session", f"web:{deliver['session_id']}"
    if deliver.get("target"):
        return "notify", f"notify:{deliver['target']}"
    to = deliver.get("to")
    label = to if isinstance(to, str) else json.dumps(to, ensure_ascii=False, sort_keys=True)
    return "send_message", str(label)


async def deliver_outcome(
    services: Services,
    lease: Lease,
    run: ChainRun,
    spec: ScheduleSpec,
    status: str,
    final: Any,
    error: str | None,
) -> dict[str, Any]:
    """Send the outcome once; returns the delivery record ``{recipient, kind, status, error}``."""
    from delivery import ledger

    deliver = dict(spec.deliver or {})
    route, recipient = _recipient(deliver)
    lang = language_of(services.settings, spec.identity)
    text = outcome_text(spec.name, status, final, error, lang)
    sm = services.sessionmaker

    async def fence() -> bool:
        try:
            await renew(sm, lease, services.settings.worker_lease_sec)
        except LeaseLost:
            return False
        return True

    from jobs.context import workspace_dir

    identity = spec.identity
    ws = workspace_dir(
        services.settings.resolved_workspace_root,
        str(identity.get("role_id") or ""),
        str(identity.get("session_id") or ""),
    )
    attach = _attachments(final, ws) if status not in (FAILED, STOPPED_EMPTY) else []

    async def send() -> None:
        await _send(services, route, deliver, text, attach, ws)

    try:
        return await ledger.deliver_once(
            sm,
            send,
            key=ledger.ledger_key(run.id, recipient, "outcome"),
            recipient=recipient,
            owner=ledger.owner_id(lease.owner, lease.token),
            kind="text",
            item="outcome",
            channel=route,
            chain_run_id=run.id,
            fence=fence,
        )
    except ledger.LeaseLost as exc:
        raise LeaseLost(str(exc)) from exc


async def _send(
    services: Services,
    route: str,
    deliver: dict[str, Any],
    text: str,
    attach: list[str],
    workspace: Path | None,
) -> None:
    from delivery.errors import DeliveryPermanentError

    if route == "session":
        from delivery.artifacts import ArtifactRefused, resolve_inside
        from delivery.channels.web import post_message

        if attach and workspace is None:
            raise DeliveryPermanentError("attachments refused: the chain has no workspace")
        try:
            inside = [str(resolve_inside(p, workspace)) for p in attach] if workspace else []
        except ArtifactRefused as exc:
            raise DeliveryPermanentError(f"attachment refused: {exc.reason}") from exc
        atts = [{"local_path": p, "filename": Path(p).name} for p in inside]
        await post_message(
            services.sessionmaker,
            services.redis,
            services.settings,
            str(deliver["session_id"]),
            text,
            atts,
        )
        return
    if route == "notify":
        from delivery.notify import notify

        result = await notify(
            services.settings,
            text,
            target=deliver["target"],
            title=deliver.get("title"),
            attach=attach or None,
            workspace=workspace,
        )
    else:
        from delivery.channels.registry import channels_for
        from delivery.send_message import send_message

        channels = channels_for(services)
        result = await send_message(
            channels,
            to=deliver["to"],
            text=text,
            attachments=attach or None,
            channel=deliver.get("channel"),
            workspace=workspace,
        )
    if not result.get("sent"):  # success is judged by ``sent``
        raise DeliveryPermanentError(str(result.get("message") or "no recipient accepted it"))
