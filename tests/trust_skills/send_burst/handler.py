"""send_burst: several send_message calls to one chat, judged by ``sent``."""

from __future__ import annotations

from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    count = int(input_data.get("count", 3))
    prefix = str(input_data.get("prefix", "message"))
    answers = []
    for n in range(1, count + 1):
        call: dict[str, Any] = {"message": f"{prefix} {n}", "to": input_data["to"]}
        if "wait" in input_data:
            call["wait"] = input_data["wait"]
        answers.append(await ctx["call_skill"]("send_message", call))
    confirmed = sum(1 for a in answers if input_data["to"] in (a.get("sent") or []))
    return {"message": f"{prefix}: {confirmed} of {count} confirmed sent", "answers": answers}
