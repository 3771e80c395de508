"""word_count: words, characters, lines, sentences and the most frequent words."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

# A word is a run of letters/digits (with inner ' or -), or a single CJK character.
_WORD = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]|[^\W_]+(?:['’\-][^\W_]+)*")
_SENTENCE_END = re.compile(r"[.!?。！？]+(?=\s|$)|[。！？]")


def count(text: str, top: int = 5) -> dict[str, Any]:
    words = [w.lower() for w in _WORD.findall(text)]
    lines = text.splitlines() or ([text] if text else [])
    sentences = len(_SENTENCE_END.findall(text)) or (1 if words else 0)
    common = Counter(words).most_common(top)
    return {
        "words": len(words),
        "characters": len(text),
        "characters_no_spaces": sum(1 for ch in text if not ch.isspace()),
        "lines": len(lines),
        "sentences": sentences,
        "top_words": [{"word": w, "count": n} for w, n in common],
    }


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    text = input_data.get("text")
    if not isinstance(text, str) or not text.strip():
        return {
            "ok": False,
            "error": "text is missing or empty: pass the text to count in `text`",
            "error_type": "recoverable",
            "need_param": "text",
        }
    try:
        top = max(0, min(int(input_data.get("top", 5)), 50))
    except (TypeError, ValueError):
        return {
            "ok": False,
            "error": f"top must be a whole number from 0 to 50, got {input_data.get('top')!r}",
            "error_type": "recoverable",
            "need_param": "top",
        }
    stats = count(text, top)
    stats["ok"] = True
    stats["message"] = ", ".join(
        _plural(stats[k], k[:-1]) for k in ("words", "characters", "lines")
    )
    return stats
