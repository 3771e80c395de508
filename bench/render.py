"""Rendering a large result for delivery: the text a person receives in a chat.

Run: ``.venv/bin/python -m bench.render``. Budget: a 1 MB JSON result in ≤ 20 ms (the
whole plan of a delivery: text choice, readable rendering, display_md, partial note, cut).
The ``… → telegram`` / ``… → feishu`` cases add what the adapter does with that text: the
Markdown converted to Telegram HTML / a Feishu card and cut into messages
(``delivery.richtext``).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from delivery import richtext
from delivery.dialects import Dialect
from delivery.render import render

TARGET_CHARS = 1_000_000
RUNS = 50
BUDGET_MS = 20.0


def rows_result() -> dict[str, Any]:
    """A table without a message: rendered as key: value lines with list samples."""
    row = {"id": 0, "sku": "SKU-000000", "name": "Widget deluxe", "qty": 3, "price": 19.99}
    per = len(json.dumps(row)) + 2
    rows = [dict(row, id=i, sku=f"SKU-{i:06d}") for i in range(TARGET_CHARS // per)]
    return {"ok": True, "total": len(rows), "rows": rows, "period": {"from": "a", "to": "b"}}


def wide_result() -> dict[str, Any]:
    """Thousands of top-level keys (a flattened export)."""
    n = TARGET_CHARS // 40
    return {"ok": True, **{f"metric_{i:06d}": f"value {i:020d}" for i in range(n)}}


def text_result() -> dict[str, Any]:
    """One huge message plus a long display_md (cut to the channel limit)."""
    return {
        "message": "lorem ipsum dolor sit amet " * (TARGET_CHARS // 54),
        "display_md": "| a | b |\n|---|---|\n" + "| **1** | 2 |\n" * (TARGET_CHARS // 28),
        "success": True,
        "warning": "stopped early",
    }


def report_result() -> dict[str, Any]:
    """A short message and a 1 MB ``display_md`` table with emphasis and links per row."""
    rows = "".join(
        f"| case {i} | **{i}.1** | [{i}](https://example.com/{i}) |\n"
        for i in range(TARGET_CHARS // 48)
    )
    return {
        "message": "Benchmarks aggregated.",
        "display_md": "## Results\n\n| case | p50 | p99 |\n|---|---:|---:|\n" + rows,
    }


CONVERT: dict[str, tuple[Dialect, int]] = {
    "telegram": (richtext.TELEGRAM, 4096),
    "feishu": (richtext.FEISHU, 25_000),
}


def measure(name: str, result: dict[str, Any], rich: bool, to: str = "") -> dict[str, Any]:
    chars = len(json.dumps(result, ensure_ascii=False))
    times = []
    text = ""
    for _ in range(RUNS):
        richtext.parse.cache_clear()  # every delivery parses its own text
        t0 = time.perf_counter()
        text = render(result, skill="bench", rich=rich, markdown=bool(to))
        if to and richtext.has_markup(text):
            richtext.pieces(text, *CONVERT[to])
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "case": f"{name}{' (web)' if rich else ''}{f' → {to}' if to else ''}",
        "chars": chars,
        "median_ms": statistics.median(times),
        "max_ms": max(times),
        "text_chars": len(text),
    }


def main() -> int:
    worst = 0.0
    for name, build in (("rows", rows_result), ("wide", wide_result), ("text", text_result)):
        result = build()
        for rich in (False, True):
            r = measure(name, result, rich)
            worst = max(worst, r["max_ms"])
            print(
                f"{r['case']:>11}: {r['chars']:>9,} chars  median {r['median_ms']:6.3f} ms  "
                f"max {r['max_ms']:6.3f} ms  delivered {r['text_chars']:,} chars"
            )
    for to in CONVERT:
        r = measure("report", report_result(), False, to)
        worst = max(worst, r["max_ms"])
        print(
            f"{r['case']:>11}: {r['chars']:>9,} chars  median {r['median_ms']:6.3f} ms  "
            f"max {r['max_ms']:6.3f} ms  delivered {r['text_chars']:,} chars"
        )
    verdict = "within" if worst <= BUDGET_MS else "OVER"
    print(f"worst {worst:.3f} ms: {verdict} the {BUDGET_MS:g} ms budget")
    return 0 if worst <= BUDGET_MS else 1


if __name__ == "__main__":
    raise SystemExit(main())
