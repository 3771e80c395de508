"""send_several: several send_message calls to one chat, one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    count = int(input_data.get("count", 5))
    prefix = str(input_data.get("prefix", "message"))
    answers = []
    for n in range(1, count + 1):
        call: dict[str, Any] = {"message": f"{prefix} {n}", "to": input_data["to"]}
        if input_data.get("file") and n == count:
            # in a folder: not part of the job's own result (backfill is top-level only)
            csv = Path(ctx["workspace_dir"]) / "out" / "rows.csv"
            csv.parent.mkdir(exist_ok=True)
            csv.write_text("a,b\n1,2\n")
            call = {"attach": [str(csv)], "to": input_data["to"]}
        answers.append(await ctx["call_skill"]("send_message", call))
    return {"message": f"{prefix}: {count} sends handed over", "answers": answers}
