"""chain_fetch_orders: deterministic demo orders for a day."""

from __future__ import annotations

import hashlib
import time
from typing import Any

STATUSES = ("paid", "paid", "paid", "refunded", "cancelled")


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    day = str(input_data.get("day") or "today")
    if day in ("today", "yesterday"):
        # relative to when the run was triggered (a chain's fire time), in UTC
        at = float(runtime_context.get("triggered_at") or time.time()) - (
            86400 if day == "yesterday" else 0
        )
        day = time.strftime("%Y-%m-%d", time.gmtime(at))
    seed = int(hashlib.sha256(day.encode()).hexdigest(), 16)
    count = input_data.get("count")
    if count is None:
        count = seed % 15
    if not isinstance(count, int) or not 0 <= count <= 500:
        return {"ok": False, "error_type": "recoverable", "error": "count must be 0-500"}
    rows = []
    for i in range(count):
        h = int(hashlib.sha256(f"{day}:{i}".encode()).hexdigest(), 16)
        rows.append(
            {
                "id": f"{day}-{i:03d}",
                "customer": f"c{h % 97:02d}",
                "total": round((h % 50_000) / 100, 2),
                "status": STATUSES[h % len(STATUSES)],
            }
        )
    return {"data": {"day": day, "rows": rows}}
