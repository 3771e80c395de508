"""sales_report: a slow report that writes a PNG bar chart, a CSV and a Markdown summary
into the session workspace (demo data, deterministic per region and date)."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import random
import re
import struct
import zlib
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

Color = tuple[int, int, int]
# 3x5 digits for axis labels.
_DIGITS = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
}


class Canvas:
    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(background) * width) for _ in range(height)]

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        span = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            self.rows[y][x0 * 3 : x1 * 3] = span

    def text(self, x: int, y: int, digits: str, color: Color, scale: int = 2) -> None:
        for i, ch in enumerate(digits):
            bits = _DIGITS.get(ch)
            if bits is None:
                continue
            for n, bit in enumerate(bits):
                if bit == "1":
                    px = x + (i * 4 + n % 3) * scale
                    py = y + (n // 3) * scale
                    self.rect(px, py, px + scale, py + scale, color)

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)  # filter 0 per scanline
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def bar_chart(
    values: Sequence[float], labels: Sequence[str], width: int = 720, height: int = 400
) -> bytes:
    """Bars of ``values`` with a digit label under each bar; returns PNG bytes."""
    c = Canvas(width, height)
    left, right, top, bottom = 50, 20, 20, 40
    plot_h = height - top - bottom
    peak = max(values) if values and max(values) > 0 else 1.0
    for k in range(5):  # grid lines
        y = top + plot_h * k // 4
        c.rect(left, y, width - right, y + 1, (225, 225, 225))
    c.rect(left, top, left + 2, height - bottom, (60, 60, 60))
    c.rect(left, height - bottom, width - right, height - bottom + 2, (60, 60, 60))
    n = max(len(values), 1)
    slot = (width - left - right) / n
    for i, v in enumerate(values):
        h = int(plot_h * (v / peak))
        x0 = int(left + i * slot + slot * 0.15)
        x1 = int(left + (i + 1) * slot - slot * 0.15)
        c.rect(x0, height - bottom - h, x1, height - bottom, (52, 120, 198))
        if i < len(labels):
            c.text(x0, height - bottom + 8, labels[i], (60, 60, 60))
    return c.png()


# --------------------------------------------------------------------------- the report


def _fail(error: str, error_type: str = "recoverable", **extra: Any) -> dict[str, Any]:
    env: dict[str, Any] = {"ok": False, "error": error, **extra}
    if error_type:
        env["error_type"] = error_type
    return env


def daily_figures(region: str, days: int, today: date) -> list[dict[str, Any]]:
    """Demo data source: stable numbers for a region and a date range."""
    rows = []
    for back in range(days, 0, -1):
        day = today - timedelta(days=back)
        seed = int(hashlib.sha256(f"{region}|{day.isoformat()}".encode()).hexdigest()[:12], 16)
        rng = random.Random(seed)
        orders = rng.randint(40, 220)
        revenue = round(orders * rng.uniform(18.0, 65.0), 2)
        rows.append({"date": day.isoformat(), "orders": orders, "revenue": revenue})
    return rows


def _markdown(region: str, rows: list[dict[str, Any]], orders: int, revenue: float) -> str:
    best = max(rows, key=lambda r: r["revenue"])
    lines = [
        f"# Sales report — {region}",
        "",
        f"{rows[0]['date']} to {rows[-1]['date']} ({len(rows)} days)",
        "",
        "| date | orders | revenue |",
        "|---|---:|---:|",
        *(f"| {r['date']} | {r['orders']} | {r['revenue']:,.2f} |" for r in rows),
        f"| **total** | **{orders}** | **{revenue:,.2f}** |",
        "",
        f"Best day: {best['date']} with revenue {best['revenue']:,.2f}.",
    ]
    return "\n".join(lines) + "\n"


def _write_files(
    out: Path, stem: str, rows: list[dict[str, Any]], summary: str
) -> dict[str, dict[str, str]]:
    out.mkdir(parents=True, exist_ok=True)
    png = bar_chart([r["revenue"] for r in rows], [r["date"][-2:] for r in rows])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["date", "orders", "revenue"])
    writer.writeheader()
    writer.writerows(rows)
    written = {}
    for suffix, data, media in (
        (".png", png, "image"),
        (".csv", buf.getvalue(), "file"),
        (".md", summary, "file"),
    ):
        path = out / f"{stem}{suffix}"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
        written[suffix] = {"filename": path.name, "local_path": str(path), "media": media}
    return written


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    workspace = runtime_context.get("workspace_dir")
    if not workspace:
        return _fail("no session workspace to write the report into", "config", non_retriable=True)
    region = str(input_data.get("region") or "all").strip() or "all"
    try:
        days = int(input_data.get("days", 7))
        seconds = float(input_data.get("seconds", 3))
    except (TypeError, ValueError):
        return _fail("days must be a whole number and seconds a number", need_param="days")
    if not 1 <= days <= 31:
        return _fail(f"days must be between 1 and 31, got {days}", need_param="days")
    if not 0 <= seconds <= 600:
        return _fail(f"seconds must be between 0 and 600, got {seconds}", need_param="seconds")

    now = datetime.now(UTC)
    rows = daily_figures(region, days, now.date())
    abort = runtime_context.get("abort_signal")
    for _ in rows:  # the slow part: one step per day, stoppable between steps
        if abort is not None and abort.is_set():
            return _fail("the report was stopped before it finished", "", stopped=True)
        await asyncio.sleep(seconds / days)

    orders = sum(r["orders"] for r in rows)
    revenue = round(sum(r["revenue"] for r in rows), 2)
    slug = re.sub(r"[^a-z0-9]+", "_", region.lower()).strip("_") or "region"
    stem = f"sales_{slug}_{now:%Y%m%d_%H%M%S}"
    summary = _markdown(region, rows, orders, revenue)
    # Encoding the PNG and writing files is blocking work: keep it off the event loop.
    written = await asyncio.to_thread(_write_files, Path(workspace), stem, rows, summary)

    return {
        "ok": True,
        "message": (
            f"Sales report for {region}, {days} days: {orders:,} orders, revenue {revenue:,.2f}"
        ),
        "filename": written[".png"]["filename"],
        "local_path": written[".png"]["local_path"],
        "media": "image",
        "files": list(written.values()),
        "totals": {"orders": orders, "revenue": revenue},
        "display_md": summary,
    }
