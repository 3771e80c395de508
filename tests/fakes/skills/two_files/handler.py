"""two_files: a PNG and a CSV in the workspace, both returned as files."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


async def execute(input_data: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    ws = Path(ctx["workspace_dir"])
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "chart.png").write_bytes(PNG_1X1)
    (ws / "data.csv").write_text("day,sales\nmon,10\n")
    return {
        "message": "Weekly numbers",
        "files": [{"local_path": str(ws / "chart.png")}, {"local_path": str(ws / "data.csv")}],
    }
