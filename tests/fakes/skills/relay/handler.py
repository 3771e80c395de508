"""relay: forward a message through the built-in delivery skills."""

from __future__ import annotations

import asyncio
from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    call = ctx["call_skill"]
    text = input_data["message"]
    sent, notified = await asyncio.gather(
        call("send_message", {"message": text, "to": input_data["to"]}),
        call("notify", {"message": text, "target": input_data["target"], "title": "relay"}),
    )
    return {"message": "relayed", "send_message": sent, "notify": notified}
