"""csv_stats: row/column counts and numeric summaries of a CSV, printed as JSON."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any


def _number(value: str) -> float | None:
    text = value.strip().replace(",", "")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def summarize(content: str, column: str | None, delimiter: str | None) -> dict[str, Any]:
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(content.split("\n", 1)[0], ",;\t|").delimiter
        except csv.Error:
            delimiter = ","
    reader = csv.DictReader(io.StringIO(content), delimiter=delimiter)
    columns = list(reader.fieldnames or [])
    if not columns:
        return {"ok": False, "error": "the CSV has no header row", "error_type": "recoverable"}
    if column and column not in columns:
        return {
            "ok": False,
            "error": f"column {column!r} is not in the CSV (columns: {', '.join(columns)})",
            "error_type": "recoverable",
            "need_param": "column",
        }
    wanted = [column] if column else columns
    values: dict[str, list[float]] = {c: [] for c in wanted}
    non_numeric: set[str] = set()
    rows = 0
    for row in reader:
        rows += 1
        for c in wanted:
            cell = row.get(c) or ""
            n = _number(cell)
            if n is None:
                if cell.strip():
                    non_numeric.add(c)
            else:
                values[c].append(n)
    numeric = {}
    for c in wanted:
        nums = values[c]
        if nums and c not in non_numeric:
            total = sum(nums)
            numeric[c] = {
                "count": len(nums),
                "min": min(nums),
                "max": max(nums),
                "mean": round(total / len(nums), 4),
                "sum": round(total, 6),
            }
    return {
        "ok": True,
        "rows": rows,
        "columns": columns,
        "numeric": numeric,
        "message": f"{rows} rows, {len(columns)} columns, {len(numeric)} numeric",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--file", help="CSV file path")
    parser.add_argument("--text", help="CSV content given inline")
    parser.add_argument("--column", help="only summarize this column")
    parser.add_argument("--delimiter", help="field separator")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        print(f"csv_stats: ignoring unknown arguments {unknown}", file=sys.stderr)
    if args.text:
        content = args.text
    elif args.file:
        path = Path(args.file)
        try:
            content = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            result = {
                "ok": False,
                "error": f"cannot read {path.name}: {exc.__class__.__name__}",
                "error_type": "recoverable",
                "need_param": "file",
            }
            print(json.dumps(result, ensure_ascii=False))
            return 0
    else:
        result = {
            "ok": False,
            "error": "pass the CSV as `file` (a path) or `text` (the content)",
            "error_type": "recoverable",
            "need_param": "file",
        }
        print(json.dumps(result, ensure_ascii=False))
        return 0
    print(json.dumps(summarize(content, args.column, args.delimiter), ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
