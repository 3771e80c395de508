"""Offloading a large successful result: time to write the file and build the receipt.

Run: ``.venv/bin/python -m bench.offload``. Budget: a 5 MB result in ≤ 50 ms.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from jobs.envelope import normalize, offload

TARGET_CHARS = 5_000_000
RUNS = 15


def rows_result() -> dict[str, Any]:
    """A table-like result: many small rows plus a few scalar fields."""
    row = {
        "id": 0,
        "sku": "SKU-000000",
        "name": "Widget deluxe",
        "qty": 3,
        "price": 19.99,
        "region": "east",
        "note": "restocked on Monday, shelf B4",
    }
    per_row = len(json.dumps(row, separators=(",", ":"))) + 1
    rows = [dict(row, id=i, sku=f"SKU-{i:06d}") for i in range(TARGET_CHARS // per_row)]
    return {
        "ok": True,
        "message": "sales rows",
        "total": len(rows),
        "rows": rows,
        "display_md": "| id | sku |\n|---|---|\n" + "| 1 | SKU-1 |\n" * 2000,
    }


def text_result() -> dict[str, Any]:
    """One big text field (a transcript, a document)."""
    return {"ok": True, "text": "lorem ipsum dolor sit amet " * (TARGET_CHARS // 27)}


def nested_result() -> dict[str, Any]:
    """Deeper structure: groups of records with nested lists."""
    rec = {"user": {"id": 1, "name": "Ana", "tags": ["a", "b", "c"]}, "events": list(range(20))}
    per = len(json.dumps(rec, separators=(",", ":"))) + 1
    groups = {f"g{i}": [rec] * 100 for i in range(TARGET_CHARS // (per * 100))}
    return {"ok": True, "groups": groups, "summary": {"groups": len(groups)}}


def measure(name: str, result: dict[str, Any], workspace: Path) -> dict[str, Any]:
    env = normalize(result, "bench")
    times = []
    receipt: dict[str, Any] = {}
    for _ in range(RUNS):
        t0 = time.perf_counter()
        receipt = offload(env, workspace, "bench")
        times.append((time.perf_counter() - t0) * 1000)
        Path(receipt["path"]).unlink()
    return {
        "case": name,
        "chars": receipt["chars"],
        "median_ms": round(statistics.median(times), 1),
        "max_ms": round(max(times), 1),
        "receipt_chars": len(json.dumps(receipt, ensure_ascii=False)),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        for name, build in (
            ("rows", rows_result),
            ("text", text_result),
            ("nested", nested_result),
        ):
            r = measure(name, build(), ws)
            print(
                f"{r['case']:>7}: {r['chars']:>9,} chars  median {r['median_ms']:>5} ms  "
                f"max {r['max_ms']:>5} ms  receipt {r['receipt_chars']:,} chars"
            )


if __name__ == "__main__":
    main()
