"""summarize_pipeline: extractive summary + statistics from the word_count skill."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|\n{2,}")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Very common English words carry no meaning for picking sentences.
_STOP = frozenset(
    "a an and are as at be but by for from has have in is it its of on or that the this "
    "to was were will with".split()
)


def summarize(text: str, limit: int) -> tuple[str, int]:
    """The ``limit`` sentences with the highest average word frequency, in text order."""
    sentences = [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]
    freq = Counter(w for w in (x.lower() for x in _WORD.findall(text)) if w not in _STOP)

    def score(sentence: str) -> float:
        words = [w.lower() for w in _WORD.findall(sentence)]
        return sum(freq[w] for w in words) / (len(words) or 1)

    ranked = sorted(range(len(sentences)), key=lambda i: score(sentences[i]), reverse=True)
    keep = sorted(ranked[:limit])
    return " ".join(sentences[i] for i in keep), len(sentences)


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    text = input_data.get("text")
    if not isinstance(text, str) or not text.strip():
        return {
            "ok": False,
            "error": "text is missing or empty: pass the text to summarize in `text`",
            "error_type": "recoverable",
            "need_param": "text",
        }
    try:
        limit = max(1, min(int(input_data.get("sentences", 2)), 10))
    except (TypeError, ValueError):
        limit = 2
    call_skill = runtime_context.get("call_skill")
    if call_skill is None:
        return {
            "ok": False,
            "error": "call_skill is not available: this skill must run in-process",
            "error_type": "config",
            "non_retriable": True,
        }
    stats = await call_skill("word_count", {"text": text, "top": 5})
    if not isinstance(stats, dict) or stats.get("ok") is False:
        reason = stats.get("error") if isinstance(stats, dict) else repr(stats)
        return {
            "ok": False,
            "error": f"word_count failed: {reason}",
            "output": stats,
        }
    summary, total = summarize(text, limit)
    kept = min(limit, total)
    return {
        "ok": True,
        "summary": summary,
        "stats": {k: stats.get(k) for k in ("words", "characters", "lines", "top_words")},
        "message": (
            f"Summary ({kept} of {total} sentences, {stats.get('words')} words in all): {summary}"
        ),
    }
