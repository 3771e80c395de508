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
            "description": "local file path(s)",
            "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
        },
    },
    "required": ["target"],
}


def _paths(attach: Any, workspace: str | None) -> Any:
    items = [attach] if isinstance(attach, str) else attach
    if not isinstance(items, list) or not workspace:
        return attach
    return [
        str(Path(workspace) / a)
        if isinstance(a, str) and a and not Path(a).expanduser().is_absolute()
        else a
        for a in items
    ]


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    from delivery.notify import notify
    from jobs.settings import Settings

    data = input_data or {}
    message = data.get("message") or data.get("text") or ""
    attach = _paths(data.get("attach") or data.get("attachments"), ctx.get("workspace_dir"))
    result = await notify(
        Settings(), message, target=data.get("target"), title=data.get("title"), attach=attach
    )
    if not result["ok"]:
        result["error"] = result["message"]
    return result
