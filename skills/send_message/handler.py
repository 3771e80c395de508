"""send_message: deliver text and files to specific recipients on the chat channels.

The input schema is in schema.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    import httpx

    from delivery.channels.registry import build_channels
    from delivery.send_message import send_message
    from jobs.settings import Settings

    data = input_data or {}
    settings = Settings()
    workspace = ctx.get("workspace_dir")
    sender = _sender(ctx, settings)
    redis = None
    if settings.redis_url:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(settings.redis_url)
    # the job store (web sessions, the delivery ledger): given to the bundled skills only
    sessionmaker = ctx.get("_platform_sessions") or ctx.get("db_factory")
    engine = None
    if sessionmaker is None:
        from jobs.db import create_engine, create_sessionmaker

        engine = create_engine(settings.resolved_database_url)
        sessionmaker = create_sessionmaker(engine)
    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            channels = build_channels(settings, http, sessionmaker=sessionmaker, redis=redis)
            result = await send_message(
                channels,
                to=data.get("to"),
                text=data.get("message") or data.get("text"),
                attachments=data.get("attach") or data.get("attachments"),
                channel=data.get("channel"),
                workspace=Path(workspace) if workspace else None,
                sender=sender,
                sessionmaker=sessionmaker,
                wait=data.get("wait") is True,
            )
    finally:
        if redis is not None:
            await redis.aclose()
        if engine is not None:
            await engine.dispose()
    if not result["ok"]:
        result["error"] = result["message"]
    return result


def _sender(ctx: dict[str, Any], settings: Any) -> Any:
    """The caller's identity. Called by the platform itself (depth 0) on the chat line, the
    send is the model's own choice of recipient: only the caller's origin, unless the role's
    ``send_allow`` patterns say more. Business skills (through call_skill) and chains choose
    recipients from their data."""
    from delivery.send_message import Sender

    depth = getattr(ctx.get("call_skill"), "depth", 0)
    direct = depth == 0 and ctx.get("chat_mode") is not False
    role = str(ctx.get("role_id") or "")
    try:
        allow = tuple(settings.send_allow_map.get(role, ()))
    except ValueError:
        allow = ()  # a malformed setting allows nothing more
    from jobs.context import group_conversation

    return Sender(
        conversation_id=group_conversation(ctx),
        role_id=role,
        org_id=str(ctx.get("org_id") or ""),
        channel=str(ctx.get("channel") or ""),
        actor_key=str(ctx.get("actor_key") or ""),
        session_id=str(ctx.get("session_id") or ""),
        direct=direct,
        allow=allow,
    )
