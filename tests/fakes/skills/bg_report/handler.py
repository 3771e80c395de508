"""bg_report: write a small CSV into the workspace and return it as an artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    rows = input_data.get("rows") or [["day", "sales"], ["mon", "10"]]
    path = Path(ctx["workspace_dir"]) / "report.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return {"message": input_data.get("message", "Your report"), "filename": "report.csv"}
