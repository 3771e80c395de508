"""The Bot API's HTML style as Telegram parses it (``parse_mode=HTML``): the tags it knows,
properly nested and closed, ``href`` on links, the four named entities and numeric ones;
anything else is the 400 "can't parse entities" it answers. The result is the text the chat
shows and its entities (offsets and lengths in UTF-16 code units)."""

from __future__ import annotations

import html
import re
from typing import Any

TAGS = {
    "b": "bold",
    "strong": "bold",
    "i": "italic",
    "em": "italic",
    "u": "underline",
    "ins": "underline",
    "s": "strikethrough",
    "strike": "strikethrough",
    "del": "strikethrough",
    "tg-spoiler": "spoiler",
    "span": "spoiler",
    "a": "text_link",
    "code": "code",
    "pre": "pre",
    "blockquote": "blockquote",
    "tg-emoji": "custom_emoji",
}
ENTITIES = {"lt", "gt", "amp", "quot"}
_TOKEN = re.compile(
    r"<(/?)([A-Za-z][\w-]*)((?:\s+[\w-]+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s>]+))?)*)\s*>"
    r"|&(#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);|[<>]"
)
_ATTR = re.compile(r"([\w-]+)(?:\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s>]+))?")


def _u16(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def parse(value: str, unsupported: frozenset[str] | set[str] = frozenset()) -> Any:
    """``(shown text, entities)``, or the reason Telegram gives for refusing ``value``."""
    out: list[str] = []
    shown = 0
    stack: list[tuple[str, int, dict[str, str]]] = []
    entities: list[dict[str, Any]] = []
    pos = 0
    for m in _TOKEN.finditer(value):
        text = value[pos : m.start()]
        out.append(text)
        shown += _u16(text)
        pos = m.end()
        offset = len(value[: m.start()].encode())
        if m.group(0) in "<>":
            return f'Unsupported start tag "{value[m.start() : m.start() + 10]}" at byte offset {offset}'
        if m.group(4) is not None:
            name = m.group(4)
            if not name.startswith("#") and name not in ENTITIES:
                return f'Unsupported HTML entity "&{name};" at byte offset {offset}'
            char = html.unescape(m.group(0))
            out.append(char)
            shown += _u16(char)
            continue
        closing, tag = m.group(1) == "/", m.group(2).lower()
        if tag not in TAGS or tag in unsupported:
            return f'Unsupported start tag "{tag}" at byte offset {offset}'
        if closing:
            if not stack or stack[-1][0] != tag:
                want = f"</{stack[-1][0]}>" if stack else "nothing"
                return f'Unmatched end tag at byte offset {offset}, expected "{want}", found "</{tag}>"'
            _, start, attrs = stack.pop()
            entity: dict[str, Any] = {"type": TAGS[tag], "offset": start, "length": shown - start}
            if tag == "a":
                entity["url"] = attrs.get("href", "")
            if tag == "code" and stack and stack[-1][0] == "pre" and "class" in attrs:
                entity["language"] = attrs["class"].removeprefix("language-")
            entities.append(entity)
            continue
        attrs = {k.lower(): html.unescape(v.strip("\"'")) for k, v in _ATTR.findall(m.group(3))}
        if tag == "a" and not attrs.get("href"):
            return f'Can\'t find "href" attribute of the tag "a" at byte offset {offset}'
        stack.append((tag, shown, attrs))
    if stack:
        return f'Can\'t find end tag corresponding to start tag "{stack[-1][0]}"'
    out.append(value[pos:])
    return "".join(out), entities


__all__ = ["TAGS", "parse"]
