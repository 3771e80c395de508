"""What goes out for one finished result on one channel: the items (text, files with an
optional caption) in order, planned for what the channel can show. The router sends them;
a resend of a result held because its channel was missing plans them again
(``delivery.custody``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delivery.channels.base import MARKDOWN_IMAGE, Channel
from delivery.channels.web import WebChannel
from delivery.render import failure_text, render
from jobs.envelope import is_failure
from jobs.media import media_kind

__all__ = ["SEALED_RESULT", "Item", "field_of", "plan"]


@dataclass
class Item:
    kind: str  # text image video audio file
    key: str  # ledger item: "text", "failure" or "<kind>:<path>"
    path: str | None = None
    text: str | None = None  # text item body, or the caption of a media item


#: the content key of a delivery refused because its channel was not configured: the
#: result and files it was to carry, sealed (``custody.resend`` sends them once it is)
SEALED_RESULT = "sealed_result"


def field_of(a: Any, name: str) -> Any:
    """``name`` of an artifact row or dict."""
    return a.get(name) if isinstance(a, dict) else getattr(a, name, None)


def plan(
    result: dict[str, Any],
    artifacts: list[Any],
    adapter: Channel,
    *,
    skill: str = "",
    lang: str = "en",
) -> list[Item]:
    """What to send, in order, for one recipient on ``adapter``."""
    if is_failure(result):
        return [Item("text", "failure", text=failure_text(skill, result, lang))]
    rich = isinstance(adapter, WebChannel)
    limit = getattr(adapter, "text_limit", None)
    md = getattr(adapter, "renders_markdown", False)  # the adapter converts it (richtext)
    text = render(
        result, skill=skill, lang=lang, rich=rich, markdown=md, limit=limit, fallback=False
    )
    media: list[Item] = []
    seen: set[str] = set()
    sources: set[str] = set()
    for a in artifacts:
        path = field_of(a, "local_path")
        if not path:
            continue
        real = str(Path(path).resolve())
        source = field_of(a, "source_url")
        if real in seen or (source and source in sources):
            continue  # one file (or one URL) is sent once
        seen.add(real)
        if source:
            sources.add(source)
        kind = media_kind(real, field_of(a, "media"))
        media.append(Item(kind, f"{kind}:{real}", path=real))
    if text and adapter.converts_markdown_images and sources:
        # an image that already goes out as a file must not come again from the text
        text = MARKDOWN_IMAGE.sub(lambda m: "" if m.group(2) in sources else m.group(0), text)
        text = text.strip()
    if not media:
        if not text:
            text = render(result, skill=skill, lang=lang, rich=rich, markdown=md, limit=limit)
        return [Item("text", "text", text=text)]
    if text and adapter.supports_caption:
        media[0].text = text
        return media
    return ([Item("text", "text", text=text)] if text else []) + media
