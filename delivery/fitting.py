"""A delivery's text made to fit the person's channel (SPEC C25): a long text goes as
consecutive messages within the channel's limit, and past :data:`MESSAGES_MAX` of them as its
head with a note plus the whole text as a document; absolute host paths are shown as names
(the workspace's files by their name, any other path as ``…/<name>``)."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from delivery.channels.base import Channel
from delivery.richtext import PlainText
from delivery.shown import escape_markdown, plain_block
from jobs.texts import text as text_of

#: past this many messages a long text goes as a document (its head stays in the chat)
MESSAGES_MAX = 4


def messages(adapter: Channel, text: str, markdown: bool) -> int:
    """How many messages ``text`` takes on ``adapter``."""
    if not adapter.splits_text:  # one message, up to what the page shows
        return 1 if len(text) <= adapter.TEXT_LIMIT else MESSAGES_MAX + 1
    return len(adapter.text_pieces(text if markdown else PlainText(text)))


def fit(
    text: str, markdown: bool, adapter: Channel, skill: str, lang: str
) -> tuple[str, tuple[str, bytes] | None]:
    """``text`` if it fits :data:`MESSAGES_MAX` messages; else its head (cut at a line)
    with a note, and the document holding the whole of it."""
    bound = adapter.TEXT_LIMIT * MESSAGES_MAX
    # (a character counts at least 1 in every channel's unit: past the bound it cannot fit)
    if len(text) <= 3000 or (
        len(text) <= bound and messages(adapter, text, markdown) <= MESSAGES_MAX
    ):
        return text, None
    fenced = FENCED.fullmatch(text)
    inner = fenced.group(2) if fenced else text
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "_", skill or "result").strip("._") or "result"
    name += "-output.md" if markdown and not fenced else "-output.txt"
    note = text_of("rest_in_file", lang, name=name)
    if markdown:
        note = escape_markdown(note)
    budget = min(len(inner), bound)
    while budget > 200:
        budget = int(budget * 0.75)
        head = inner[:budget]
        head = head[: head.rfind("\n")] if "\n" in head else head
        shown = plain_block(head) if fenced else head
        candidate = f"{shown.rstrip()}\n\n{note}"
        if messages(adapter, candidate, markdown) <= MESSAGES_MAX - 1:
            return candidate, (name, inner.encode("utf-8"))
    return note, (name, inner.encode("utf-8"))


FENCED = re.compile(r"(`{3,})\n(.*)\n\1", re.S)

#: an absolute path: ``/a/b`` and longer, not part of a URL or a relative path
_ABS_PATH = re.compile(r"(?<![\w:/.~\\-])/(?:[\w.@+~%=-]+/)+[\w.@+~%=-]+")
#: the first folders of host paths (an API route such as ``/api/v1/jobs`` is not one)
HOST_ROOTS = frozenset(
    "home root srv tmp var opt usr etc mnt data Users private workspace workspaces app "
    "proc dev run media nix snap lib lib64 bin sbin Volumes scratch".split()
)


def scrub_paths(text: str, workspace: Path | None) -> str:
    """Absolute paths in ``text``: inside the job's workspace → the file's name, any other
    host path → ``…/<name>`` (the person never sees the host's layout)."""
    if "/" not in text:
        return text
    roots = []
    if workspace is not None:
        roots = [str(workspace).rstrip("/") + "/"]
        with contextlib.suppress(OSError):
            roots.append(str(workspace.resolve()).rstrip("/") + "/")

    def repl(m: re.Match[str]) -> str:
        path = m.group(0)
        tail = ""
        while path and path[-1] in ".=~":
            path, tail = path[:-1], path[-1] + tail
        name = path.rsplit("/", 1)[-1]
        if not name:
            return m.group(0)
        if any(path.startswith(r) for r in roots):
            return name + tail
        if path.split("/", 2)[1] not in HOST_ROOTS:
            return m.group(0)
        return f"…/{name}{tail}"

    return _ABS_PATH.sub(repl, text)


__all__ = ["FENCED", "HOST_ROOTS", "MESSAGES_MAX", "fit", "messages", "scrub_paths"]
