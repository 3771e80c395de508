"""A result as the text a person reads in a chat (SPEC §6.5, C3).

The text is ``message`` / ``result`` / ``text`` / ``output``; when none of them holds
anything, a short readable rendering of the other content (``key: value`` lines, lists as
counts and first items). ``display_md`` goes after the text: as Markdown on rich channels
(web sessions) and on channels whose adapter converts Markdown to what the platform renders
(``markdown``: Telegram HTML, Feishu cards, WeCom and DingTalk markdown messages, see
``delivery.richtext``), as plain text elsewhere. A partial result says so on its
first line. Everything is cut to the channel's limit with a note, and the work done is
bounded by what is shown, never by the size of the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from delivery.richtext import to_plain
from jobs.envelope import is_partial
from jobs.texts import TRACE_HINTS, meaningful_line, strip_admin_hints, text

TEXT_KEYS = ("message", "result", "text", "output")
#: Envelope bookkeeping and media fields: never part of the readable rendering.
NOT_CONTENT = frozenset(
    "ok success error_type offloaded _hint display_only completed warning action_note "
    "display_md filename local_path media images videos files audios urls download_url "
    "abs_url exit_code stdout_tail stderr_tail skill artifact_problems postprocess_error "
    "offload_error fetches mediaUrl mediaUrls".split()
)
TEXT_CAP = 4000  # a chat message, not a data dump: the full result stays with the job
RICH_TEXT_CAP = 20_000  # web sessions show Markdown and scroll
MAX_LINES = 30
NESTED_LINES = 8
VALUE_MAX = 200
ITEM_MAX = 80
SAMPLE_ITEMS = 3
FAILURE_REASON_MAX = 240


def main_text(result: dict[str, Any]) -> str | None:
    """The first non-empty ``message`` / ``result`` / ``text`` / ``output`` as text; a
    structured ``result`` is rendered. None when none of them holds anything."""
    for key in TEXT_KEYS:
        value = result.get(key)
        if isinstance(value, str):
            if value.strip():
                return value.strip()
        elif isinstance(value, bool):
            return "true" if value else "false"
        elif isinstance(value, int | float):
            return str(value)  # a skill that returned a bare number
        elif isinstance(value, dict | list) and value:
            rendered = readable(value if isinstance(value, dict) else {key: value})
            if rendered:
                return rendered
    return None


def render(
    result: dict[str, Any],
    *,
    skill: str = "",
    lang: str = "en",
    rich: bool = False,
    markdown: bool = False,
    limit: int | None = None,
    fallback: bool = True,
) -> str:
    """The delivered text of a successful result. With ``fallback``, an empty result
    becomes "<skill> finished."; otherwise it is ``""`` (e.g. a file that needs no text).
    ``markdown``: the channel's adapter converts Markdown, so ``display_md`` stays as it is."""
    cap = limit if limit is not None else (RICH_TEXT_CAP if rich else TEXT_CAP)
    body = main_text(result)
    md = result.get("display_md")
    md = md.strip() if isinstance(md, str) else ""
    if body is None and not md:
        body = readable(result, lang=lang) or None
    parts = [body] if body else []
    room = cap - len(body or "")
    if md and md != body and room > 0:
        # only what can be shown is converted: the work is bounded by the channel limit
        parts.append(md[: cap * 2] if rich or markdown else markdown_to_text(md[: room * 2]))
    if is_partial(result):
        warning = result.get("warning")
        reason = warning.strip() if isinstance(warning, str) and warning.strip() else ""
        parts.insert(0, text("partial", lang, reason=reason or text("partial_default", lang)))
    # directives are delivery metadata, never literal text (seed 004); bounded work
    out = strip_directives("\n\n".join(parts)[: cap * 2], rich=rich)
    if not out and fallback:
        return text("finished", lang, name=skill or text("the_task", lang))
    return cut(out, cap, lang)


def cut(value: str, limit: int, lang: str = "en") -> str:
    """``value`` within ``limit`` characters, with a note saying it was cut."""
    if len(value) <= limit:
        return value
    note = "\n" + text("truncated", lang)
    return value[: max(limit - len(note), 0)].rstrip() + note


# --------------------------------------------------------------------------- JSON → lines


def readable(data: dict[str, Any], *, lang: str = "en") -> str:
    """Short ``key: value`` lines for the content fields of ``data``."""
    lines: list[str] = []
    keys = [k for k in data if k not in NOT_CONTENT and not str(k).startswith("_")]
    for key in keys[:MAX_LINES]:
        value = data[key]
        if isinstance(value, dict) and value:
            lines.append(f"{key}:")
            inner = list(value.items())
            for k, v in inner[:NESTED_LINES]:
                lines.append(f"  {k}: {_short(v, lang, VALUE_MAX)}")
            if len(inner) > NESTED_LINES:
                lines.append("  " + text("more_lines", lang, n=len(inner) - NESTED_LINES))
        elif not _empty(value):
            lines.append(f"{key}: {_short(value, lang, VALUE_MAX)}")
    if len(keys) > MAX_LINES:
        lines.append(text("more_lines", lang, n=len(keys) - MAX_LINES))
    return "\n".join(lines)


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _short(value: Any, lang: str, cap: int) -> str:
    if isinstance(value, str):
        s = " ".join(value[: cap * 2].split())
        return s if len(s) <= cap and len(value) <= cap * 2 else s[: cap - 1] + "…"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "—"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        count = text("items", lang, n=len(value))
        if not value:
            return count
        first = ", ".join(_short(v, lang, ITEM_MAX) for v in value[:SAMPLE_ITEMS])
        more = ", …" if len(value) > SAMPLE_ITEMS else ""
        return f"{count}: {first}{more}"
    if isinstance(value, dict):
        pairs = list(value.items())
        inline = ", ".join(
            f"{k}={_short(v, lang, 40)}"
            for k, v in pairs[:SAMPLE_ITEMS]
            if not isinstance(v, dict | list)
        )
        if inline:
            more = ", …" if len(pairs) > SAMPLE_ITEMS else ""
            s = f"{{{inline}{more}}}"
            return s if len(s) <= cap else s[: cap - 1] + "…"
        return text("fields", lang, n=len(pairs))
    return _short(str(value), lang, cap)


# --------------------------------------------------------------------------- directives

_REPLY_TAGS = re.compile(
    r"[ \t]?\[\[\s*(?:audio_as_voice|reply_to_current|reply_to\s*:[^\]]*)\s*\]\]"
)
_EMBED = re.compile(
    r"\[(?:embed|view)\b[^\]]*/\]|\[(?:embed|view)\b[^\]]*\].*?\[/(?:embed|view)\]", re.S
)
_VIEW = re.compile(r"\[view\b[^\]]*/?\](?:.*?\[/view\])?", re.S)


_REPLY_TO = re.compile(r"\[\[\s*reply_to\s*:\s*([^\]\s]+)\s*\]\]")
_ANY_TAG = re.compile(r"[ \t]?\[\[\s*[A-Za-z_][\w-]*(?:\s*:[^\]\n]*)?\s*\]\]")


@dataclass(frozen=True)
class Directives:
    """What the outbound tags of a result ask of its delivery (seed 004): send audio as a
    voice note; reply to the message that started it (``reply_current``) or to
    ``reply_to``."""

    voice: bool = False
    reply_current: bool = False
    reply_to: str | None = None


_NO_DIRECTIVES = Directives()
_TAGGED_KEYS = (*TEXT_KEYS, "display_md")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def directives(result: dict[str, Any]) -> Directives:
    """The ``[[…]]`` tags in a result's text fields (and ``display_md``)."""
    tagged = [t[:100_000] for k in _TAGGED_KEYS if "[[" in (t := _text(result.get(k)))]
    if not tagged:
        return _NO_DIRECTIVES
    joined = "\n".join(tagged)
    found = _REPLY_TO.search(joined)
    return Directives(
        voice=re.search(r"\[\[\s*audio_as_voice\s*\]\]", joined) is not None,
        reply_current=re.search(r"\[\[\s*reply_to_current\s*\]\]", joined) is not None,
        reply_to=found.group(1) if found else None,
    )


def strip_directives(value: str, *, rich: bool) -> str:
    """``value`` without the outbound directives of the output protocol: ``[[audio_as_voice]]``
    and ``[[reply_to…]]`` tags always; ``[embed …]`` shortcodes except on rich channels
    (the web UI renders them); the retired ``[view …]`` everywhere."""
    if "[" not in value:
        return value
    out = _ANY_TAG.sub("", _REPLY_TAGS.sub("", value))  # no [[…]] tag reaches a person
    out = _VIEW.sub("", out) if rich else _EMBED.sub("", out)
    return re.sub(r"[ \t]+\n", "\n", out).strip() if out != value else value


# --------------------------------------------------------------------------- Markdown


def markdown_to_text(md: str) -> str:
    """Markdown for a channel that shows plain text (parsed, ``delivery.richtext``):
    headings, emphasis and link syntax dropped (links as ``text (url)``), lists with
    bullets, tables as aligned columns."""
    return to_plain(md)


# --------------------------------------------------------------------------- failures


def failure_text(skill: str, result: dict[str, Any], lang: str = "en") -> str:
    """A short failure notice for the user: the meaningful line of the reason, no stack
    traces, no "contact an admin" (in either language)."""
    name = skill or text("the_task", lang)
    if result.get("needs_config"):
        missing = ", ".join(str(k) for k in result["needs_config"][:5])
        return text("not_set_up", lang, name=name, missing=missing)
    reason = ""
    for key in ("user_message", "error", "msg"):
        value = result.get(key)
        if isinstance(value, str) and value.strip():
            reason = value.strip()
            break
    if any(h in reason for h in TRACE_HINTS):
        reason = ""
    reason = strip_admin_hints(meaningful_line(reason) if "\n" in reason else reason)
    if len(reason) > FAILURE_REASON_MAX:
        reason = reason[: FAILURE_REASON_MAX - 1].rstrip() + "…"
    if reason:
        return text("failed_reason", lang, name=name, reason=reason.rstrip("。."))
    return text("failed", lang, name=name)
