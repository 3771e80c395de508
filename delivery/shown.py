"""Structured results as a person reads them, and whether that reading is the whole result
(SPEC C25).

A JSON result is shown as ``key: value`` lines, an array of records as a compact Markdown
table (the adapters draw it as the platform shows tables: Telegram ``<pre>`` columns, a
Feishu card table, a Markdown table on the web). When what is shown cuts a value, leaves out
a field or a row, the reading is *lossy*: the router then sends the full result as a file
(:func:`result_file`) and says so in the text. Plain text (a script's stdout) stays plain:
:func:`plain_block` fences text with aligned columns for channels with a monospace block,
:func:`escape_markdown` writes plain lines as Markdown that shows them as they are.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

from jobs.texts import text

VALUE_MAX = 200
CELL_MAX = 40
TABLE_ROWS = 20
TABLE_COLUMNS = 8
MAX_LINES = 30
NESTED_LINES = 12
LIST_INLINE = 10
SAMPLE_ITEMS = 3
ITEM_MAX = 80

#: Envelope bookkeeping: never part of the rendering nor of the result file.
BOOKKEEPING = frozenset(
    "ok success error_type offloaded _hint display_only completed warning action_note "
    "exit_code stdout_tail stderr_tail artifact_problems postprocess_error offload_error "
    "fetches markdown format content_type".split()
)
#: Media fields: they travel as files, not as text.
MEDIA_FIELDS = frozenset(
    "display_md filename local_path media images videos files audios urls download_url "
    "abs_url mediaUrl mediaUrls".split()
)
#: Fields whose remote file is downloaded and sent as media (``delivery.materialize``).
URL_FIELDS = frozenset(
    "image_url image_urls video_url video_urls audio_url audio_urls file_url file_urls "
    "output_url result_url oss_url cdn_url url link href src image video audio file".split()
)
TEXT_KEYS = ("message", "result", "text", "output")


Scalar = str | int | float | bool | None


@dataclass
class Shown:
    """A readable rendering: ``markdown`` when it holds a table (Markdown that the channel
    converts), ``lossy`` when it cut or left out anything."""

    text: str = ""
    markdown: bool = False
    lossy: bool = False
    #: ``(text, is Markdown)`` in order: plain lines and tables
    parts: list[tuple[str, bool]] = field(default_factory=list)


def is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def flat_records(value: object) -> bool:
    """A non-empty list of dicts whose values are all scalars (a CSV's rows)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(r, dict) and r and all(is_scalar(v) for v in r.values()) for r in value)
    )


def records(value: object) -> bool:
    """A non-empty list of dicts (shown as a table of their scalar fields)."""
    return isinstance(value, list) and bool(value) and all(isinstance(r, dict) for r in value)


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "—"
    return str(value)


class _Reader:
    def __init__(self, lang: str) -> None:
        self.lang = lang
        self.lossy = False

    def short(self, value: object, cap: int) -> str:
        if isinstance(value, str):
            s = " ".join(value.split()) if "\n" in value and len(value) > cap else value
            if len(s) <= cap and "\n" not in s:
                return s
            if len(s) <= cap:
                return " ".join(s.split())
            self.lossy = True
            return s[: cap - 1].rstrip() + "…"
        if is_scalar(value):
            return _scalar(value)
        if isinstance(value, list):
            if not value:
                return text("items", self.lang, n=0)
            if all(is_scalar(v) for v in value) and len(value) <= LIST_INLINE:
                joined = ", ".join(self.short(v, ITEM_MAX) for v in value)
                if len(joined) <= cap:
                    return joined
            self.lossy = True
            first = ", ".join(self.short(v, ITEM_MAX) for v in value[:SAMPLE_ITEMS])
            more = ", …" if len(value) > SAMPLE_ITEMS else ""
            return f"{text('items', self.lang, n=len(value))}: {first}{more}"
        if isinstance(value, dict):
            pairs = list(value.items())
            if all(is_scalar(v) for _, v in pairs) and len(pairs) <= SAMPLE_ITEMS * 2:
                inline = ", ".join(f"{k}={self.short(v, CELL_MAX)}" for k, v in pairs)
                if len(inline) + 2 <= cap:
                    return f"{{{inline}}}"
            self.lossy = True
            return text("fields", self.lang, n=len(pairs))
        return self.short(str(value), cap)

    def table(self, rows: list[dict[str, Any]]) -> str:
        """A Markdown table of the records' scalar fields (first rows and columns); a
        nested object of scalars shows as ``<key>.<field>`` columns."""
        total = len(rows)
        if total > TABLE_ROWS:
            self.lossy = True
        rows = [_flattened(r) for r in rows[:TABLE_ROWS]]
        columns: list[str] = []
        for row in rows[:TABLE_ROWS]:
            for k, v in row.items():
                if k not in columns and is_scalar(v):
                    columns.append(str(k))
        if any(not is_scalar(v) for row in rows for v in row.values()):
            self.lossy = True  # nested fields are not in the table
        if len(columns) > TABLE_COLUMNS:
            self.lossy = True
            columns = columns[:TABLE_COLUMNS]
        if not columns:
            self.lossy = True
            return ""

        def cell(value: object) -> str:
            s = self.short(value, CELL_MAX) if value is not None else ""
            return _CELL_SPECIAL.sub(r"\\\1", s)  # shown as written, never as emphasis

        out = ["| " + " | ".join(cell(c) for c in columns) + " |"]
        out.append("|" + "|".join("---" for _ in columns) + "|")
        for row in rows[:TABLE_ROWS]:
            out.append("| " + " | ".join(cell(row.get(c)) for c in columns) + " |")
        if total > TABLE_ROWS:
            out.append("")
            out.append(escape_markdown(text("more_lines", self.lang, n=total - TABLE_ROWS)))
        return "\n".join(out)


_CELL_SPECIAL = re.compile(r"([\\|*_`~\[\]<>])")


def _flattened(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(v, dict) and v and all(is_scalar(x) for x in v.values()):
            for k2, v2 in v.items():
                out[f"{k}.{k2}"] = v2
        else:
            out[str(k)] = v
    return out


def shown(data: dict[str, Any], *, lang: str = "en", skip: frozenset[str] = frozenset()) -> Shown:
    """The content fields of ``data`` as lines (and tables for arrays of records)."""
    r = _Reader(lang)
    out = Shown()
    keys = content_keys(data, skip)
    if len(keys) > MAX_LINES:
        r.lossy = True
    lines: list[str] = []

    def flush() -> None:
        if lines:
            out.parts.append(("\n".join(lines), False))
            lines.clear()

    for key in keys[:MAX_LINES]:
        value = data[key]
        if records(value):
            if not (key in TEXT_KEYS and len(keys) == 1):
                lines.append(f"{key} ({len(value)}):")
            flush()
            table = r.table(value)
            if table:
                out.parts.append((table, True))
        elif isinstance(value, dict) and value:
            lines.append(f"{key}:")
            inner = list(value.items())
            for k, v in inner[:NESTED_LINES]:
                lines.append(f"  {k}: {r.short(v, VALUE_MAX)}")
            if len(inner) > NESTED_LINES:
                r.lossy = True
                lines.append("  " + text("more_lines", lang, n=len(inner) - NESTED_LINES))
        elif value is None or value == "" or value == [] or value == {}:
            continue
        elif isinstance(value, str) and "\n" in value.strip() and len(value) <= VALUE_MAX * 10:
            lines.append(f"{key}:")
            lines.extend("  " + ln for ln in value.strip().splitlines())
        else:
            lines.append(f"{key}: {r.short(value, VALUE_MAX)}")
    if len(keys) > MAX_LINES:
        lines.append(text("more_lines", lang, n=len(keys) - MAX_LINES))
    flush()
    out.lossy = r.lossy
    out.markdown = any(md for _, md in out.parts)
    out.text = (
        "\n\n".join(t if md else escape_markdown(t) for t, md in out.parts)
        if out.markdown
        else "\n\n".join(t for t, _ in out.parts)
    )
    return out


def content_keys(data: dict[str, Any], skip: frozenset[str] = frozenset()) -> list[str]:
    return [
        k
        for k in data
        if k not in BOOKKEEPING
        and k not in MEDIA_FIELDS
        and k not in skip
        and not str(k).startswith("_")
    ]


# --------------------------------------------------------------------------- the full file


def result_payload(data: dict[str, Any]) -> Any:
    """What the result file holds: the content of the result (a bare array when the skill
    printed one), without the envelope's bookkeeping."""
    keys = [k for k in data if k not in BOOKKEEPING and not str(k).startswith("_")]
    if len(keys) == 1 and keys[0] in TEXT_KEYS and isinstance(data[keys[0]], list | dict):
        return data[keys[0]]
    return {k: data[k] for k in keys}


def result_file(skill: str, data: dict[str, Any]) -> tuple[str, bytes]:
    """``(<skill>-result.csv, rows)`` for a list of flat records, else
    ``(<skill>-result.json, the whole content)``."""
    payload = result_payload(data)
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", skill or "result").strip("._") or "result"
    if flat_records(payload):
        columns: list[str] = []
        for row in payload:
            for k in row:
                if str(k) not in columns:
                    columns.append(str(k))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in payload:
            writer.writerow({str(k): _csv(v) for k, v in row.items()})
        return f"{name}-result.csv", buf.getvalue().encode("utf-8")
    body = json.dumps(payload, ensure_ascii=False, indent=2, default=str)
    return f"{name}-result.json", body.encode("utf-8")


def _csv(value: object) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value


# --------------------------------------------------------------------------- plain text

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+\-.!|~=])")
_LEAD = re.compile(r"^[ \t]+")


def escape_markdown(plain: str) -> str:
    """Plain text written as Markdown that shows it unchanged: punctuation escaped, leading
    indentation kept (no-break spaces), every line its own line."""
    out: list[str] = []
    for line in plain.split("\n"):
        lead = _LEAD.match(line)
        indent = ""
        if lead:
            indent = "\u00a0" * len(lead.group(0).expandtabs(4))
            line = line[lead.end() :]
        out.append(indent + _MD_SPECIAL.sub(r"\\\1", line.rstrip()))
    # a line break inside a paragraph is a hard break (two trailing spaces are fragile)
    return re.sub(r"(?<=\S)\n(?=\S|\u00a0)", "\\\n", "\n".join(out))


_GAP = re.compile(r"\S( {2,}|\t)\S")


def aligned_columns(plain: str) -> bool:
    """Whether ``plain`` has columns aligned with spaces (a report, a table printed by a
    script): at least three lines with inner runs of spaces, starting at a shared column."""
    lines = [ln for ln in plain.splitlines() if ln.strip()]
    if len(lines) < 3:
        return False
    edges: dict[tuple[str, int], int] = {}
    gapped = 0
    for ln in lines:
        gaps = [m.span(1) for m in _GAP.finditer(ln)]
        if gaps:
            gapped += 1
        # a left-aligned column starts where a gap ends, a right-aligned one ends where it
        # starts (the last column's end is the line's)
        found = {("start", end) for _, end in gaps} | {("end", start) for start, _ in gaps}
        if gaps:
            found.add(("end", len(ln.rstrip())))
        for pos in found:
            edges[pos] = edges.get(pos, 0) + 1
    if gapped < 3 or gapped * 2 < len(lines):
        return False
    return any(n >= 3 for n in edges.values())


def plain_block(plain: str) -> str:
    """``plain`` as a Markdown code block (a fence longer than any backtick run in it)."""
    longest = max((len(m) for m in re.findall(r"`+", plain)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{plain.rstrip()}\n{fence}"


__all__ = [
    "BOOKKEEPING",
    "MEDIA_FIELDS",
    "URL_FIELDS",
    "Shown",
    "aligned_columns",
    "content_keys",
    "escape_markdown",
    "flat_records",
    "plain_block",
    "records",
    "result_file",
    "result_payload",
    "shown",
]
