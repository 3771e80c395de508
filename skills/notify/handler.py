"""notify: one-way Apprise notification to an alias or a bare Apprise URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "the text to send"},
        "title": {"type": "string"},
        "target": {
            "description": "operator alias (e.g. ops) or an Apprise URL, or a list of them",
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        },
        "attach": {
            "description": "file path(s) inside the workspace (relative ones are taken from it)",
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        },
    },
    "required": ["target"],
}


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    from delivery.notify import notify
    from jobs.settings import Settings

    data = input_data or {}
    message = data.get("message") or data.get("text") or ""
    workspace = ctx.get("workspace_dir")
    result = await notify(
        Settings(),
        message,
        target=data.get("target"),
        title=data.get("title"),
        attach=data.get("attach") or data.get("attachments"),
        workspace=Path(workspace) if workspace else None,
        # the job store (the delivery ledger): given to the bundled skills only
        sessionmaker=ctx.get("_platform_sessions"),
    )
    if not result["ok"]:
        result["error"] = result["message"]
    return result
