"""A result as the text a person reads in a chat (SPEC §6.5, C3, C25).

The text is ``message`` / ``result`` / ``text`` / ``output``; when none of them holds
anything, a readable rendering of the other content (``key: value`` lines, arrays of
records as a compact table, ``delivery.shown``). ``display_md`` goes after the text: as
Markdown on rich channels (web sessions) and on channels whose adapter converts Markdown to
what the platform renders (``markdown``: Telegram HTML, Feishu cards, WeCom and DingTalk
markdown messages, see ``delivery.richtext``), as plain text elsewhere. Text fields are plain
text unless the result says it is Markdown (``"format": "markdown"``): plain text is never
read as Markdown (an ``=====`` underline stays a line of ``=``, ``1.`` lines keep their
numbers). A partial result says so on its first line.

:func:`render_result` also says whether the text is Markdown and whether it left anything
out (the router then sends the full result as a file); :func:`render` is the text alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from delivery.richtext import to_plain
from delivery.shown import (
    BOOKKEEPING,
    MEDIA_FIELDS,
    TEXT_KEYS,
    aligned_columns,
    escape_markdown,
    plain_block,
    shown,
)
from jobs.envelope import is_partial
from jobs.texts import (
    TRACE_HINTS,
    localized_reason,
    meaningful_line,
    strip_admin_hints,
    text,
)

#: Envelope bookkeeping and media fields: never part of the readable rendering.
NOT_CONTENT = BOOKKEEPING | MEDIA_FIELDS
TEXT_CAP = 4000  # a message of the plainest channel; longer texts are split (router)
RICH_TEXT_CAP = 20_000  # web sessions show Markdown and scroll
TEXT_MAX = 2_000_000  # past this a text is not read further (it goes whole as a document)
FAILURE_REASON_MAX = 600

_MARKDOWN_FORMATS = {"markdown", "md", "text/markdown", "commonmark", "gfm"}


def marked_markdown(result: dict[str, Any]) -> bool:
    """Whether the skill says its text fields are Markdown (``format`` / ``content_type`` /
    ``markdown: true``)."""
    if result.get("markdown") is True:
        return True
    for key in ("format", "content_type", "text_format", "parse_mode"):
        value = result.get(key)
        if isinstance(value, str) and value.strip().lower() in _MARKDOWN_FORMATS:
            return True
    return False


@dataclass
class Rendered:
    """The delivered text of a successful result: ``markdown`` when the text is Markdown
    for the adapter to convert (else plain text, sent as it is), ``lossy`` when it does
    not hold the whole result."""

    text: str
    markdown: bool = False
    lossy: bool = False
    #: a structured rendering's plain lines and tables, ``(text, is Markdown)``
    parts: list[tuple[str, bool]] | None = None


def main_text(result: dict[str, Any]) -> str | None:
    """The first non-empty ``message`` / ``result`` / ``text`` / ``output`` as text; a
    structured ``result`` is rendered. None when none of them holds anything."""
    found = _main(result, "en", frozenset())
    return found.text if found is not None else None


def _main(result: dict[str, Any], lang: str, skip: frozenset[str]) -> Rendered | None:
    marked = marked_markdown(result)
    for key in TEXT_KEYS:
        value = result.get(key)
        if isinstance(value, str):
            if value.strip():
                body = value.strip("\n").rstrip()  # a first line's indentation aligns it
                body = body if "\n" in body else body.strip()
                return Rendered(body[:TEXT_MAX], markdown=marked, lossy=len(body) > TEXT_MAX)
        elif isinstance(value, bool):
            return Rendered("true" if value else "false")
        elif isinstance(value, int | float):
            return Rendered(str(value))  # a skill that returned a bare number
        elif isinstance(value, dict | list) and value:
            got = shown(value if isinstance(value, dict) else {key: value}, lang=lang, skip=skip)
            if got.text:
                return Rendered(got.text, markdown=got.markdown, lossy=got.lossy, parts=got.parts)
    return None


def render_result(
    result: dict[str, Any],
    *,
    skill: str = "",
    lang: str = "en",
    rich: bool = False,
    markdown: bool = False,
    fallback: bool = True,
    skip: frozenset[str] = frozenset(),
    monospace: bool = False,
) -> Rendered:
    """The whole text of a successful result (never cut: the router splits it into
    messages or sends it as a document). ``markdown``: the channel's adapter converts
    Markdown; ``monospace``: it has a code block for text with aligned columns; ``skip``:
    fields already sent as media."""
    body = _main(result, lang, skip)
    lossy = False
    if body is not None:
        # The author's text is what they meant the person to read; structured data under
        # another text key beside it (``message`` + ``result: [...]``) is not in it: the
        # file carries it. (Other fields beside an authored text are for the caller.)
        text_key = next(k for k in TEXT_KEYS if k in result and result[k] not in ("", None))
        lossy = body.lossy or any(
            isinstance(result.get(k), dict | list) and result[k]
            for k in TEXT_KEYS
            if k != text_key and k not in skip
        )
    md = result.get("display_md")
    md = md.strip() if isinstance(md, str) else ""
    if body is None and not md:
        got = shown(result, lang=lang, skip=skip)
        body = Rendered(got.text, got.markdown, got.lossy, got.parts) if got.text else None
        lossy = got.lossy
    parts: list[Rendered] = []
    if body is not None and body.parts:
        parts = [Rendered(t, markdown=m) for t, m in body.parts]
    elif body is not None and body.text:
        parts = [body]
    if md and (body is None or md != body.text):
        parts.append(Rendered(md[:TEXT_MAX], markdown=True))
    if is_partial(result):
        warning = result.get("warning")
        reason = warning.strip() if isinstance(warning, str) and warning.strip() else ""
        note = text("partial", lang, reason=reason or text("partial_default", lang))
        parts.insert(0, Rendered(note))
    as_markdown = any(p.markdown for p in parts)
    if markdown and as_markdown:  # the adapter converts: plain parts escaped to show as is
        out = "\n\n".join(_as_markdown(p, monospace) for p in parts)
    elif rich:  # the web shows Markdown as it is; printed columns as a code block
        out = "\n\n".join(
            plain_block(p.text)
            if not p.markdown and monospace and aligned_columns(p.text)
            else p.text
            for p in parts
        )
        as_markdown = as_markdown or out != "\n\n".join(p.text for p in parts)
    else:
        as_markdown = False
        out = "\n\n".join(p.text if not p.markdown else markdown_to_text(p.text) for p in parts)
        if markdown and len(parts) == 1 and monospace and aligned_columns(out):
            out, as_markdown = plain_block(out), True
    # directives are delivery metadata, never literal text (seed 004)
    out = strip_directives(out, rich=rich)
    if not out and fallback:
        return Rendered(text("finished", lang, name=skill or text("the_task", lang)))
    return Rendered(out, markdown=as_markdown, lossy=lossy)


def _as_markdown(part: Rendered, monospace: bool) -> str:
    if part.markdown:
        return part.text
    if monospace and aligned_columns(part.text):
        return plain_block(part.text)
    return escape_markdown(part.text)


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
    """The delivered text of a successful result, cut to ``limit`` (default: a message of
    the plainest channel) with a note. With ``fallback``, an empty result becomes
    "<skill> finished."; otherwise it is ``""`` (e.g. a file that needs no text).
    ``markdown``: the channel's adapter converts Markdown, so ``display_md`` stays as it is."""
    cap = limit if limit is not None else (RICH_TEXT_CAP if rich else TEXT_CAP)
    got = render_result(
        result, skill=skill, lang=lang, rich=rich, markdown=markdown, fallback=fallback
    )
    return cut(got.text, cap, lang)


def cut(value: str, limit: int, lang: str = "en") -> str:
    """``value`` within ``limit`` characters, with a note saying it was cut."""
    if len(value) <= limit:
        return value
    note = "\n" + text("truncated", lang)
    return value[: max(limit - len(note), 0)].rstrip() + note


def readable(data: dict[str, Any], *, lang: str = "en") -> str:
    """Short ``key: value`` lines for the content fields of ``data``."""
    return shown(data, lang=lang).text


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


def _text(value: object) -> str:
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
            # the block a failing script's output gave (C26); another field: its line
            if key != "user_message" or any(h in reason for h in TRACE_HINTS):
                reason = meaningful_line(reason) if "\n" in reason else reason
            break
    if any(h in reason for h in TRACE_HINTS):
        reason = ""
    reason = strip_admin_hints(localized_reason(reason, lang))
    if len(reason) > FAILURE_REASON_MAX:
        reason = reason[: FAILURE_REASON_MAX - 1].rstrip() + "…"
    if reason:
        return text("failed_reason", lang, name=name, reason=reason.rstrip("。."))
    return text("failed", lang, name=name)
