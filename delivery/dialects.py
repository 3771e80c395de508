"""How each chat platform writes Markdown constructs (used by ``delivery.richtext``).

A :class:`Dialect` turns one construct at a time (emphasis, a link, a heading, a code block,
a table…) into the platform's own syntax and escapes the text around it; ``size`` measures a
message the way the platform counts its limit. The base class writes plain text.
"""

from __future__ import annotations

import html
import re
import unicodedata

from markdown_it.common.normalize_url import normalizeLinkText

_LINK_SCHEMES = ("http://", "https://", "mailto:", "tg://")


def _cells(text: str) -> int:
    """Display width in a monospace font (CJK and other wide characters take two cells)."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def aligned(rows: list[list[str]], aligns: list[str], *, header: bool = True) -> list[str]:
    """Table rows as lines of padded columns; a rule under the header."""
    width = max((len(r) for r in rows), default=0)
    rows = [r + [""] * (width - len(r)) for r in rows]
    widths = [max((_cells(r[i]) for r in rows), default=0) for i in range(width)]

    def pad(cell: str, i: int) -> str:
        space = " " * (widths[i] - _cells(cell))
        return space + cell if i < len(aligns) and aligns[i] == "right" else cell + space

    lines = [" | ".join(pad(c, i) for i, c in enumerate(r)).rstrip() for r in rows]
    if header and len(lines) > 1:
        lines.insert(1, "-+-".join("-" * w for w in widths))
    return lines


class Dialect:
    """How one platform writes each Markdown construct. The base writes plain text."""

    softbreak = "\n"
    bullet = "•"

    def esc(self, text: str) -> str:
        return text

    def strong(self, inner: str) -> str:
        return inner

    def em(self, inner: str) -> str:
        return inner

    def strike(self, inner: str) -> str:
        return inner

    def code(self, text: str) -> str:
        return self.esc(text)

    def link(self, href: str, inner: str, plain: str) -> str:
        """A link the platform cannot show as one: its text and the address (as written,
        not percent-encoded)."""
        shown = normalizeLinkText(href)
        if not href or plain in (href, shown):
            return inner or self.esc(shown)
        return f"{inner} ({self.esc(shown)})"

    def image(self, src: str, alt: str) -> str:
        return self.link(src, self.esc(alt), alt) if alt else self.esc(normalizeLinkText(src))

    def heading(self, level: int, inner: str) -> str:
        return self.strong(inner)

    def quote(self, inner: str) -> str:
        return "\n".join(f"> {line}" if line else ">" for line in inner.split("\n"))

    def code_block(self, info: str, text: str) -> str:
        return self.esc(text.rstrip("\n"))

    def table(self, rows: list[list[str]], aligns: list[str]) -> str:
        return self.esc("\n".join(aligned(rows, aligns)))

    def hr(self) -> str:
        return "──────────"

    def size(self, text: str) -> int:
        return len(text)


class TelegramHTML(Dialect):
    """The Bot API's HTML style (``parse_mode=HTML``)."""

    def esc(self, text: str) -> str:
        # (no-break spaces keep plain lines' indentation through the Markdown parse;
        # Telegram keeps ordinary spaces as they are)
        return html.escape(text, quote=False).replace("\u00a0", " ")

    def strong(self, inner: str) -> str:
        return f"<b>{inner}</b>" if inner else ""

    def em(self, inner: str) -> str:
        return f"<i>{inner}</i>" if inner else ""

    def strike(self, inner: str) -> str:
        return f"<s>{inner}</s>" if inner else ""

    def code(self, text: str) -> str:
        return f"<code>{self.esc(text)}</code>"

    def link(self, href: str, inner: str, plain: str) -> str:
        if href.startswith(_LINK_SCHEMES) and inner:
            return f'<a href="{html.escape(href, quote=True)}">{inner}</a>'
        return super().link(href, inner, plain)

    def quote(self, inner: str) -> str:
        return f"<blockquote>{inner}</blockquote>"

    def code_block(self, info: str, text: str) -> str:
        lang = re.sub(r"[^\w+#.-]", "", info.split()[0]) if info.split() else ""
        body = self.esc(text.rstrip("\n"))
        return (
            f'<pre><code class="language-{lang}">{body}</code></pre>'
            if lang
            else f"<pre>{body}</pre>"
        )

    def table(self, rows: list[list[str]], aligns: list[str]) -> str:
        return f"<pre>{self.esc(chr(10).join(aligned(rows, aligns)))}</pre>"

    def size(self, text: str) -> int:
        return telegram_visible_len(text)


class FeishuMarkdown(Dialect):
    """The ``markdown`` element of a Feishu card (JSON 2.0)."""

    bullet = "-"

    def esc(self, text: str) -> str:
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    def strong(self, inner: str) -> str:
        return f"**{inner}**" if inner else ""

    def em(self, inner: str) -> str:
        return f"*{inner}*" if inner else ""

    def strike(self, inner: str) -> str:
        return f"~~{inner}~~" if inner else ""

    def code(self, text: str) -> str:
        return f"`` {text} ``" if "`" in text else f"`{text}`"

    def link(self, href: str, inner: str, plain: str) -> str:
        if href.startswith(("http://", "https://")) and inner:
            return f"[{inner}]({href.replace(')', '%29')})"
        return super().link(href, inner, plain)

    def heading(self, level: int, inner: str) -> str:
        # the element's big headings dwarf the text: h1/h2 as h4, the rest bold
        return f"#### {inner}" if level <= 2 else self.strong(inner)

    def code_block(self, info: str, text: str) -> str:
        lang = info.split()[0] if info.split() else ""
        return f"```{lang}\n{text.rstrip(chr(10))}\n```"

    def table(self, rows: list[list[str]], aligns: list[str]) -> str:
        width = max((len(r) for r in rows), default=0)
        marks = {"left": ":--", "right": "--:", "center": ":-:"}
        rule = [marks.get(aligns[i] if i < len(aligns) else "", "---") for i in range(width)]

        def line(cells: list[str]) -> str:
            cells = cells + [""] * (width - len(cells))
            return "| " + " | ".join(self.esc(c).replace("|", "\\|") for c in cells) + " |"

        return "\n".join([line(rows[0]), "| " + " | ".join(rule) + " |", *map(line, rows[1:])])

    def hr(self) -> str:
        return "---"


class WeComMarkdown(Dialect):
    """WeCom's ``markdown`` message: headings, bold, links, inline code, quotes."""

    bullet = "-"

    def strong(self, inner: str) -> str:
        return f"**{inner}**" if inner else ""

    def code(self, text: str) -> str:
        return f"`{text}`"

    def link(self, href: str, inner: str, plain: str) -> str:
        if href.startswith(("http://", "https://")) and inner:
            return f"[{inner}]({href})"
        return super().link(href, inner, plain)

    def heading(self, level: int, inner: str) -> str:
        return f"{'#' * min(level, 6)} {inner}"

    def code_block(self, info: str, text: str) -> str:
        # no code blocks here: each line as inline code (a "# comment" is no heading)
        lines = text.rstrip("\n").split("\n")
        return self.softbreak.join(self.code(ln) if ln.strip() else "" for ln in lines)

    def size(self, text: str) -> int:
        return len(text.encode())


class DingTalkMarkdown(WeComMarkdown):
    """DingTalk's ``sampleMarkdown``: also italics and lists; a line break is a hard break."""

    softbreak = "  \n"

    def em(self, inner: str) -> str:
        return f"*{inner}*" if inner else ""

    def table(self, rows: list[list[str]], aligns: list[str]) -> str:
        return "  \n".join(aligned(rows, aligns))

    def size(self, text: str) -> int:
        return len(text.encode())


TELEGRAM = TelegramHTML()
FEISHU = FeishuMarkdown()
WECOM = WeComMarkdown()
DINGTALK = DingTalkMarkdown()
PLAIN = Dialect()

_TAG = re.compile(r"<[^>]*>")


def telegram_visible_len(value: str) -> int:
    """What Telegram counts of an HTML text: its characters after entity parsing (UTF-16)."""
    shown = html.unescape(_TAG.sub("", value))
    return len(shown.encode("utf-16-le")) // 2


def html_to_plain(value: str) -> str:
    """The text a Telegram HTML message shows, without its formatting."""
    return html.unescape(_TAG.sub("", value))


__all__ = [
    "DINGTALK",
    "FEISHU",
    "PLAIN",
    "TELEGRAM",
    "WECOM",
    "Dialect",
    "aligned",
    "html_to_plain",
    "telegram_visible_len",
]
