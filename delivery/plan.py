"""What goes out for one finished result on one channel: the items (text, files with an
optional caption) in order, planned for what the channel can show (SPEC C25): the readable
text (plain text kept plain), the files, and the files made for the person — the full result
when the text shows only part of it, the whole of a text too long for a few messages. The router sends them;
a resend of a result held because its channel was missing plans them again
(``delivery.custody``)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delivery.channels.base import MARKDOWN_IMAGE, Channel
from delivery.fitting import fit, scrub_paths
from delivery.render import failure_text, render, render_result
from delivery.richtext import PlainText
from delivery.shown import URL_FIELDS, escape_markdown, result_file
from jobs.envelope import is_failure
from jobs.media import media_kind
from jobs.texts import text as text_of

log = logging.getLogger(__name__)

__all__ = [
    "DELIVERED_DIR",
    "SEALED_RESULT",
    "Item",
    "delivered_folder",
    "field_of",
    "plan",
    "write_files",
]


@dataclass
class Item:
    kind: str  # text image video audio file
    key: str  # ledger item: "text", "failure" or "<kind>:<path>"
    path: str | None = None
    text: str | None = None  # text item body, or the caption of a media item
    data: bytes | None = None  # a file made for the person, written at ``path`` first


#: the content key of a delivery refused because its channel was not configured: the
#: result and files it was to carry, sealed (``custody.resend`` sends them once it is)
SEALED_RESULT = "sealed_result"


def field_of(a: object, name: str) -> Any:
    """``name`` of an artifact row or dict."""
    return a.get(name) if isinstance(a, dict) else getattr(a, name, None)


#: where the files made for the person (full result, long text) are written, per job
DELIVERED_DIR = ".delivered"


def delivered_folder(workspace: Path, job_id: str) -> Path:
    """The folder of the files written for the person from one job's result."""
    return workspace / DELIVERED_DIR / job_id


def _materialized(value: object, sources: set[str]) -> bool:
    if isinstance(value, str):
        return value in sources
    if isinstance(value, list) and value:
        return all(isinstance(v, str) and v in sources for v in value)
    return False


def plan(
    result: dict[str, Any],
    artifacts: list[Any],
    adapter: Channel,
    *,
    skill: str = "",
    lang: str = "en",
    workspace: Path | None = None,
    folder: Path | None = None,
) -> list[Item]:
    """What to send, in order, for one recipient on ``adapter``. ``folder``: where files
    made for the person go (the full result when the text cannot hold it, the rest of a
    long text); without it the text is all there is."""
    if is_failure(result):
        notice = scrub_paths(failure_text(skill, result, lang), workspace)
        return [Item("text", "failure", text=PlainText(notice))]
    rich = adapter.rich_text
    md = adapter.renders_markdown  # the adapter converts it (richtext)
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
    # a field whose file goes out as media is not repeated as text
    skip = frozenset(k for k in URL_FIELDS if _materialized(result.get(k), sources))
    got = render_result(
        result,
        skill=skill,
        lang=lang,
        rich=rich,
        markdown=md,
        fallback=False,
        skip=skip,
        monospace=adapter.monospace,
    )
    text, markdown = scrub_paths(got.text, workspace), got.markdown
    docs: list[Item] = []
    if got.lossy and folder is not None:
        name, data = result_file(skill, {k: v for k, v in result.items() if k not in skip})
        docs.append(_doc(folder / name, data))
        note = text_of("full_result_file", lang, name=name)
        text = f"{text}\n\n{escape_markdown(note) if markdown else note}" if text else note
    if text and adapter.converts_markdown_images and sources:
        # an image that already goes out as a file must not come again from the text
        text = MARKDOWN_IMAGE.sub(lambda m: "" if m.group(2) in sources else m.group(0), text)
        text = text.strip()
    if text and folder is not None:
        text, rest = fit(text, markdown, adapter, skill, lang)
        if rest is not None:
            docs.append(_doc(folder / rest[0], rest[1]))
    files = media + docs
    if not files:
        if not text:
            text = render(result, skill=skill, lang=lang, rich=rich, markdown=md)
            markdown = md
        return [Item("text", "text", text=_typed(text, markdown))]
    body = _typed(text, markdown) if text else None
    if body and adapter.supports_caption:
        files[0].text = body
        return files
    return ([Item("text", "text", text=body)] if body else []) + files


def _typed(text: str, markdown: bool) -> str:
    return text if markdown else PlainText(text)


def _doc(path: Path, data: bytes) -> Item:
    return Item("file", f"file:{path}", path=str(path), data=data)


async def write_files(items: list[Item], job_id: str) -> None:
    """Write the files made for the person (full result, long text) before they are sent."""
    for item in items:
        if item.data is not None and item.path is not None:
            try:
                await asyncio.to_thread(_write, Path(item.path), item.data)
            except OSError as exc:  # the text still goes; the file's send fails with this
                log.warning("job %s: could not write %s: %s", job_id, item.path, exc)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
