"""chain_filter: keep rows by status and minimum total."""

from __future__ import annotations

from typing import Any


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    rows = input_data.get("rows")
    if not isinstance(rows, list):
        return {"ok": False, "error_type": "recoverable", "error": "rows must be a list of objects"}
    status = input_data.get("status")
    try:
        min_total = float(input_data.get("min_total") or 0)
    except (TypeError, ValueError):
        return {"ok": False, "error_type": "recoverable", "error": "min_total must be a number"}
    kept = [
        r
        for r in rows
        if isinstance(r, dict)
        and (status is None or r.get("status") == status)
        and float(r.get("total") or 0) >= min_total
    ]
    return {"data": {"rows": kept}}
