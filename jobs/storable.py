"""Values fit for the database, made so at the one place each is written.

PostgreSQL's ``text`` and ``jsonb`` refuse NUL (``\\x00``), and neither backend can encode a
lone surrogate (what ``surrogateescape`` makes of non-UTF-8 bytes) as UTF-8; ``jsonb`` also
refuses NaN and infinities. A skill's output can hold any of these, and one refused value
must never leave a job unrecordable. So NUL and lone surrogates are *escaped* (written as
the text ``\\x00`` / ``\\udc80``, nothing is silently dropped), non-finite numbers become
``null``, anything that is not JSON becomes its ``str``, and oversize values are capped —
each change described in a short note for the record it belongs to.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

#: characters of one stored text field (errors, reasons, messages)
TEXT_CAP = 20_000
#: characters of one stored JSON value, serialized (results, inputs, outputs, fetch records)
JSON_CAP = 2_000_000
#: characters kept in the preview of a capped JSON value
PREVIEW = 2_000

_BAD = re.compile("[\x00\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    return "\\x00" if ch == "\x00" else f"\\u{ord(ch):04x}"


class Notes:
    """What was changed to make a value storable (deduplicated, in order)."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, note: str) -> None:
        if note not in self.items:
            self.items.append(note)

    def __bool__(self) -> bool:
        return bool(self.items)

    def text(self) -> str:
        return "; ".join(self.items)


def _clean_str(value: str, notes: Notes) -> str:
    if _BAD.search(value) is None:
        return value
    if "\x00" in value:
        notes.add("NUL characters escaped as \\x00")
    if any("\ud800" <= c <= "\udfff" for c in value):
        notes.add("invalid UTF-8 (lone surrogates) escaped as \\uXXXX")
    return _BAD.sub(_escape, value)


def _clean(value: object, notes: Notes, depth: int = 0) -> Any:
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return _clean_str(value, notes)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        notes.add("non-finite numbers stored as null")
        return None
    if depth > 200:
        notes.add("nesting deeper than 200 levels stored as text")
        return _clean_str(repr(value)[:PREVIEW], notes)
    if isinstance(value, dict):
        return {
            _clean_str(k if isinstance(k, str) else str(k), notes): _clean(v, notes, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_clean(v, notes, depth + 1) for v in value]
    if isinstance(value, bytes | bytearray):
        notes.add("bytes stored as text")
        return _clean_str(bytes(value).decode("utf-8", "replace"), notes)
    notes.add(f"{type(value).__name__} values stored as text")
    return _clean_str(str(value), notes)


#: the result field naming where invalid text was replaced by U+FFFD (C24)
TEXT_REPLACED = "text_replaced"
_INVALID = re.compile("[\ud800-\udfff]")


def valid_text(value: object, where: str = "", depth: int = 0) -> tuple[Any, list[str]]:
    """``value`` with lone surrogates (a string cut inside an emoji, undecodable bytes)
    replaced by U+FFFD, and where that was done (at most 20 places named)."""
    if isinstance(value, str):
        if _INVALID.search(value) is None:
            return value, []
        return _INVALID.sub("\ufffd", value), [where or "value"]
    if depth > 200 or not isinstance(value, dict | list):
        return value, []
    places: list[str] = []
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and _INVALID.search(k):
                k = _INVALID.sub("\ufffd", k)
                places.append(f"{where}.{k}" if where else k)
            fixed, found = valid_text(v, f"{where}.{k}" if where else str(k), depth + 1)
            out[k] = fixed
            places += found
        return (out if places else value), places[:20]
    items = []
    for i, v in enumerate(value):
        fixed, found = valid_text(v, f"{where}[{i}]", depth + 1)
        items.append(fixed)
        places += found
    return (items if places else value), places[:20]


def text(value: str | None, notes: Notes | None = None, *, cap: int = TEXT_CAP) -> str | None:
    """``value`` fit for a text column: escaped and capped to ``cap`` characters."""
    if value is None:
        return None
    own = notes if notes is not None else Notes()
    out = _clean_str(value if isinstance(value, str) else str(value), own)
    if len(out) > cap:
        own.add(f"text of {len(out)} characters cut to {cap}")
        out = out[: max(cap - 1, 0)] + "…"
    return out


_SCALAR = (str, int, bool, type(None))  # JSON scalars other than floats (checked finite)


def _json_typed(value: object, depth: int = 0) -> bool:
    """Only dicts with ``str`` keys, lists and JSON scalars (finite numbers), at most 200
    levels deep."""
    if isinstance(value, dict):
        if depth > 200:
            return False
        for k, v in value.items():
            if type(k) is not str:
                return False
            t = type(v)
            if t is float:
                if not math.isfinite(v):
                    return False
            elif t not in _SCALAR and not _json_typed(v, depth + 1):
                return False
        return True
    if isinstance(value, list):
        if depth > 200:
            return False
        for v in value:
            t = type(v)
            if t is float:
                if not math.isfinite(v):
                    return False
            elif t not in _SCALAR and not _json_typed(v, depth + 1):
                return False
        return True
    if type(value) is float:
        return math.isfinite(value)
    return type(value) in _SCALAR


def _as_is(value: object, cap: int) -> bool:
    """Nothing to change: JSON-typed, finite, no NUL or lone surrogate, within ``cap``
    (one serialization checked instead of each string: most values are like this).

    The serialization is orjson's (compact UTF-8, several times faster than ``json``): it
    refuses lone surrogates and integers past 64 bits, and those values take the careful
    path of :func:`json_value`, which decides with ``json`` as before; so does a value whose
    UTF-8 bytes exceed ``cap`` (its characters may not)."""
    if not _json_typed(value):
        return False
    try:
        text = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    # NUL is serialized as \u0000 (a false alarm on a literal "\u0000" only costs the walk).
    return len(text) <= cap and b"\\u0000" not in text


def json_value(value: object, notes: Notes | None = None, *, cap: int = JSON_CAP) -> Any:
    """``value`` fit for a JSON column: escaped, JSON-typed, and when its serialization is
    longer than ``cap`` replaced by a marked summary (``_truncated``). A value that needs
    no change is returned as it is."""
    if _as_is(value, cap):
        return value
    own = notes if notes is not None else Notes()
    out = _clean(value, own)
    if out is None or isinstance(out, bool | int | float):
        return out
    size = len(json.dumps(out, ensure_ascii=False))
    if size <= cap:
        return out
    own.add(f"value of {size} characters replaced by a summary")
    preview = json.dumps(out, ensure_ascii=False)[:PREVIEW]
    summary: dict[str, Any] = {"_truncated": True, "chars": size, "preview": preview}
    if isinstance(out, dict):
        summary["keys"] = list(out)[:50]
        for k in ("ok", "error", "error_type", "message"):
            v = out.get(k)
            if isinstance(v, bool):
                summary[k] = v
            elif isinstance(v, str):
                summary[k] = v[:PREVIEW]
    return summary


def oversize(value: object, *, cap: int = JSON_CAP) -> int | None:
    """The stored size of ``value`` (serialized characters) when :func:`json_value` would
    replace it by a summary, else None. Values that must be kept whole (a job's input) are
    refused with this instead of being summarized."""
    if _as_is(value, cap):
        return None
    out = _clean(value, Notes())
    if out is None or isinstance(out, bool | int | float):
        return None
    size = len(json.dumps(out, ensure_ascii=False))
    return size if size > cap else None


def result(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A job or chain result fit for storage; what was changed is noted in the result
    itself (``storage_note``), so the person reading the job sees it."""
    if value is None:
        return None
    notes = Notes()
    out = json_value(value, notes)
    if notes:
        if not isinstance(out, dict):
            out = {"value": out}
        out = {**out, "storage_note": notes.text()}
    return out if isinstance(out, dict) else {"value": out}


__all__ = ["JSON_CAP", "TEXT_CAP", "Notes", "json_value", "oversize", "result", "text"]
