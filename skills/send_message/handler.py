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
    redis = None
    if settings.redis_url:
        import redis.asyncio as aioredis

        redis = aioredis.from_url(settings.redis_url)
    sessionmaker = ctx.get("db_factory")
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
            )
    finally:
        if redis is not None:
            await redis.aclose()
        if engine is not None:
            await engine.dispose()
    if not result["ok"]:
        result["error"] = result["message"]
    return result
