"""send_then_flake: send a message, then fail transiently on the first two runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    sent = await ctx["call_skill"](
        "send_message", {"message": input_data["message"], "to": input_data["to"]}
    )
    runs = Path(ctx["workspace_dir"]) / "runs.txt"
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    if n <= 2:
        raise ConnectionError(f"upstream reset (run {n})")
    return {"message": "done", "runs": n, "send_message": sent}
