"""Markdown as each chat platform renders it (SPEC §6.5, C3).

Results are written in Markdown (``display_md``, and the ``message`` of most skills). Web
sessions show it as it is; the third-party channels each render a dialect of their own:

* Telegram: the Bot API's HTML (``parse_mode=HTML``): ``b i s code pre a blockquote``, all
  other text escaped; headings bold, lists with bullets, tables as aligned ``<pre>``.
* Feishu: an interactive card (JSON 2.0) whose ``markdown`` elements take headings, lists,
  quotes, code blocks and tables; ``<`` and ``>`` escaped (the element also reads tags such
  as ``<at>``, which a result must not be able to write).
* WeCom: the ``markdown`` message (headings, bold, links, inline code, quotes); the rest as
  plain lines.
* DingTalk: the ``sampleMarkdown`` robot message (headings, bold, italic, links, lists,
  quotes); line breaks as Markdown hard breaks.

The Markdown is parsed once (markdown-it-py, CommonMark + tables + strikethrough, raw HTML
off) and each top-level block rendered on its own, so a long text is cut into messages
between blocks, measured in the platform's own unit *after* conversion. A block larger than
one message (a long table or code listing) is cut by lines into several blocks of the same
kind; any other oversize block goes as plain text. A text with no Markdown in it is sent as
plain text (:func:`has_markup`), as it always was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.tree import SyntaxTreeNode

from delivery.channels.limits import split_text
from delivery.dialects import (
    DINGTALK,
    FEISHU,
    PLAIN,
    TELEGRAM,
    WECOM,
    Dialect,
    html_to_plain,
    telegram_visible_len,
)

Size = Callable[[str], int]

#: node types that make a text "Markdown" rather than plain lines
_MARKUP_BLOCKS = frozenset(
    "heading bullet_list ordered_list blockquote fence code_block table hr".split()
)
_MARKUP_INLINE = frozenset("strong em s code_inline link image".split())


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])


@lru_cache(maxsize=16)
def parse(md: str) -> SyntaxTreeNode:
    """The syntax tree of ``md`` (read only; kept for the few texts in flight, since an
    adapter asks :func:`has_markup` and then converts the same text)."""
    return SyntaxTreeNode(_parser().parse(md))


class Piece(str):
    """One message of converted text; ``plain`` is the same text without markup (what is
    sent when the platform refuses the markup)."""

    plain: str

    def __new__(cls, value: str, plain: str) -> Piece:
        obj = super().__new__(cls, value)
        obj.plain = plain
        return obj


class PlainText(str):
    """Text that is not Markdown (a script's printed output, a failure notice): adapters
    send it as plain text, whatever characters it holds."""

    __slots__ = ()


def has_markup(md: str) -> bool:
    """Whether ``md`` uses any Markdown (a heading, list, quote, code, table, rule, emphasis,
    link or image); plain lines of text and :class:`PlainText` are not converted."""
    if isinstance(md, PlainText) or not md.strip() or _MAYBE_MARKUP.search(md) is None:
        return False  # no character or line start that Markdown reads: no parse needed
    return _uses_markup(parse(md))


#: what any Markdown construct needs: an emphasis/code/link/table/quote/heading character,
#: a list marker, an indented code line or a rule line (a text without one is plain)
_MAYBE_MARKUP = re.compile(
    r"[*_`#|>\[~]|^ *(?:[-+]|\d{1,9}[.)])(?: |$)|^(?: {4}|\t)|^ *[-=]{3,} *$", re.M
)


def _uses_markup(node: SyntaxTreeNode) -> bool:
    if node.type in _MARKUP_BLOCKS or node.type in _MARKUP_INLINE:
        return True
    return any(_uses_markup(c) for c in node.children)


# --------------------------------------------------------------------------- rendering


@dataclass
class Block:
    """One top-level block, rendered; ``lines`` and ``info`` let a long code block or table
    be cut into several of its kind."""

    text: str
    plain: str
    kind: str = ""
    info: str = ""
    lines: list[str] | None = None
    aligns: list[str] | None = None


class _Renderer:
    def __init__(self, dialect: Dialect) -> None:
        self.d = dialect

    def inline(self, node: SyntaxTreeNode) -> str:
        return "".join(self._inline(c) for c in node.children)

    def _inline(self, n: SyntaxTreeNode) -> str:
        d = self.d
        t = n.type
        if t == "text":
            return d.esc(n.content)
        if t == "softbreak":
            return d.softbreak
        if t == "hardbreak":
            return "\n" if d.softbreak == "\n" else d.softbreak
        if t == "strong":
            return d.strong(self.inline(n))
        if t == "em":
            return d.em(self.inline(n))
        if t == "s":
            return d.strike(self.inline(n))
        if t == "code_inline":
            return d.code(n.content)
        if t == "link":
            return d.link(str(n.attrs.get("href", "")), self.inline(n), plain_of(n))
        if t == "image":
            return d.image(str(n.attrs.get("src", "")), plain_of(n))
        return self.inline(n) if n.children else d.esc(n.content)

    def block(self, n: SyntaxTreeNode, depth: int = 0) -> str:
        d = self.d
        t = n.type
        if t == "paragraph":
            return "".join(self.inline(c) for c in n.children)
        if t == "heading":
            return d.heading(int(n.tag[1:]), self.inline(n.children[0]))
        if t in ("bullet_list", "ordered_list"):
            return self._list(n, depth)
        if t == "blockquote":
            return d.quote(self.blocks_text(n.children, depth))
        if t in ("fence", "code_block"):
            return d.code_block(n.info if t == "fence" else "", n.content)
        if t == "table":
            rows, aligns = table_rows(n)
            return d.table(rows, aligns)
        if t == "hr":
            return d.hr()
        return d.esc(n.content) if n.content else self.blocks_text(n.children, depth)

    def blocks_text(self, nodes: list[SyntaxTreeNode], depth: int = 0) -> str:
        return "\n\n".join(s for s in (self.block(c, depth) for c in nodes) if s)

    def _list(self, n: SyntaxTreeNode, depth: int) -> str:
        start = int(str(n.attrs.get("start", 1)))
        indent = "  " * depth
        out: list[str] = []
        for i, item in enumerate(n.children):
            mark = f"{start + i}." if n.type == "ordered_list" else self.d.bullet
            hang = indent + " " * (len(mark) + 1)
            lines: list[str] = []
            for child in item.children:
                if child.type in ("bullet_list", "ordered_list"):
                    lines.append(self._list(child, depth + 1))  # indented by its depth
                    continue
                for line in self.block(child, depth + 1).split("\n"):
                    lines.append((hang if lines else f"{indent}{mark} ") + line)
            out.append("\n".join(lines) if lines else f"{indent}{mark}")
        return "\n".join(out)


_BREAKS = ("softbreak", "hardbreak")


def plain_of(node: SyntaxTreeNode) -> str:
    """The text of an inline node and its children (read from the flat inline tokens: the
    tree's properties are slow on a long table)."""
    token = node.token if node.type == "inline" else None
    if token is not None and token.children is not None:
        return "".join(
            t.content if t.type in ("text", "code_inline", "image") else "\n" * (t.type in _BREAKS)
            for t in token.children
        )
    if node.type in ("text", "code_inline"):
        return node.content
    if node.type in _BREAKS:
        return "\n"
    return "".join(plain_of(c) for c in node.children)


def table_rows(node: SyntaxTreeNode) -> tuple[list[list[str]], list[str]]:
    rows: list[list[str]] = []
    aligns: list[str] = []
    for section in node.children:
        for tr in section.children:
            cells = []
            for cell in tr.children:
                if not rows:
                    style = str(cell.attrs.get("style", ""))
                    aligns.append(style.removeprefix("text-align:"))
                cells.append(" ".join(plain_of(cell).split()))
            rows.append(cells)
    return rows, aligns


def blocks(md: str, dialect: Dialect) -> list[Block]:
    """The top-level blocks of ``md``, each rendered in ``dialect`` (and as plain text)."""
    r, p = _Renderer(dialect), _Renderer(PLAIN)
    out: list[Block] = []
    for node in parse(md).children:
        if node.type == "table":  # its cells are read once
            rows, aligns = table_rows(node)
            text = dialect.table(rows, aligns)
            block = Block(text, PLAIN.table(rows, aligns), "table", aligns=aligns)
            block.lines = ["\t".join(row) for row in rows]
            out.append(block)
            continue
        text = r.block(node)
        if not text.strip():
            continue
        block = Block(text, p.block(node), node.type)
        if node.type in ("fence", "code_block"):
            block.info = node.info if node.type == "fence" else ""
            block.lines = node.content.rstrip("\n").split("\n")
        out.append(block)
    return out


def _cut_block(block: Block, dialect: Dialect, limit: int, size: Size) -> list[Piece]:
    """An oversize block as several: code and tables by lines (a table repeats its header),
    anything else as plain text."""
    if block.lines is None or len(block.lines) < 2:
        return _plain_pieces(block.plain, dialect, limit, size)
    table = block.kind == "table"
    head = block.lines[:1] if table else []
    rest = block.lines[1:] if table else block.lines

    def render(lines: list[str]) -> str:
        if table:
            return dialect.table([ln.split("\t") for ln in head + lines], block.aligns or [])
        return dialect.code_block(block.info, "\n".join(lines))

    out: list[Piece] = []
    while rest:
        k = _fitting(rest, render, limit, size)
        if k == 0:  # one line longer than a message: it goes as plain text
            out.extend(_plain_pieces("\n".join(head + rest[:1]), dialect, limit, size))
            k = 1
        else:
            out.append(Piece(render(rest[:k]), "\n".join(head + rest[:k])))
        rest = rest[k:]
    return out


def _fitting(lines: list[str], render: Callable[[list[str]], str], limit: int, size: Size) -> int:
    """How many of the first ``lines`` fit one message once rendered (a binary search; the
    rendering is never smaller than the lines, which bounds it)."""
    hi, raw = 0, 0
    while hi < len(lines) and raw <= limit:
        raw += len(lines[hi]) + 1
        hi += 1
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(render(lines[:mid])) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _plain_pieces(text: str, dialect: Dialect, limit: int, size: Size) -> list[Piece]:
    # escaping works per character, so the escaped size adds up as split_text needs
    return [
        Piece(dialect.esc(s), s)
        for s in split_text(text, limit, lambda part: size(dialect.esc(part)))
    ]


def pieces(md: str, dialect: Dialect, limit: int, size: Size | None = None) -> list[Piece]:
    """``md`` in ``dialect``, as messages of at most ``limit`` (measured by ``size``, by
    default the dialect's own), cut between blocks."""
    measure = size or dialect.size
    out: list[Piece] = []
    cur: list[Block] = []

    def flush() -> None:
        if cur:
            out.append(Piece("\n\n".join(b.text for b in cur), "\n\n".join(b.plain for b in cur)))
            cur.clear()

    total = 0
    sep = measure("\n\n")
    for block in blocks(md, dialect):
        n = measure(block.text)  # the sizes add up: a piece is measured once per block
        if cur and total + sep + n <= limit:
            cur.append(block)
            total += sep + n
            continue
        flush()
        if n <= limit:
            cur.append(block)
            total = n
        else:
            out.extend(_cut_block(block, dialect, limit, measure))
    flush()
    return [p for p in out if p.strip()]


def to_plain(md: str) -> str:
    """Markdown as plain text (headings, emphasis and link syntax dropped, tables aligned)."""
    return "\n\n".join(b.text for b in blocks(md, PLAIN))


def feishu_card(content: str, summary: str = "") -> dict[str, Any]:
    """A Feishu card (JSON 2.0) showing ``content`` (card Markdown); ``summary`` is what the
    chat list shows for it (instead of "[card]")."""
    card: dict[str, Any] = {
        "schema": "2.0",
        "body": {"elements": [{"tag": "markdown", "content": content}]},
    }
    if summary:
        card["config"] = {"summary": {"content": summary}}
    return card


def title_of(md: str, limit: int = 64) -> str:
    """A short title for a Markdown text (its first line, as plain text)."""
    first = next((ln.strip() for ln in to_plain(md).splitlines() if ln.strip()), "")
    return first if len(first) <= limit else first[: limit - 1] + "…"


__all__ = [
    "DINGTALK",
    "FEISHU",
    "PLAIN",
    "TELEGRAM",
    "WECOM",
    "Dialect",
    "Piece",
    "PlainText",
    "feishu_card",
    "has_markup",
    "html_to_plain",
    "pieces",
    "telegram_visible_len",
    "title_of",
    "to_plain",
]
