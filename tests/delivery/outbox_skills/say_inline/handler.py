"""say_inline: the given text as the job's one message."""

from __future__ import annotations

from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    return {"message": str(input_data["text"])}
