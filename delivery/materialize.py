"""Remote URL materialization: the remote files a result points at, into the job workspace.

Explicit URL fields and media-list entries are downloaded; ambiguous fields and plain links in
the text are probed first and skipped when they are web pages or JSON (at most ``MAX_PROBES``
probes). Every URL considered gets a fetch record; one failure never fails the job. The result
keeps every original URL; downloaded files are added as entries with ``local_path`` +
``source_url``. Entries that already have an existing ``local_path`` are skipped, so running
this twice downloads nothing new.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from delivery.net.fetch import MAX_BYTES, FetchError, SafeFetcher
from delivery.net.urlsafety import RefusedURL, check_url
from jobs.media import mime_from_name, sniff

log = logging.getLogger(__name__)

EXPLICIT_FIELDS = (
    "urls",
    "image_url",
    "image_urls",
    "video_url",
    "video_urls",
    "audio_url",
    "audio_urls",
    "file_url",
    "file_urls",
    "output_url",
    "result_url",
    "oss_url",
    "cdn_url",
    "download_url",
    "abs_url",
    # the outbound media protocol of the chat platform (seed 004): explicit media
    "mediaUrl",
    "mediaUrls",
    "media_url",
    "media_urls",
)
AMBIGUOUS_FIELDS = ("url", "link", "href", "src", "image", "video", "audio", "file")
TEXT_FIELDS = ("message", "result", "text", "display_md")
MEDIA_LISTS = {"images": "image", "videos": "video", "audios": "audio", "files": "file"}
LIST_FOR = {"image": "images", "video": "videos", "audio": "audios", "file": "files"}
MAX_PROBES = 8
MAX_DOWNLOADS = 50  # per result: a list of thousands of URLs must not fill the disk
CONCURRENCY = 4

_URL_LIKE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_TEXT_LINK = re.compile(r"""https?://[^\s<>"'`\\]+""", re.IGNORECASE)
_NOT_FILES = re.compile(
    r"^(text/.*|application/(json|.*\+json|xml|.*\+xml|xhtml\+xml|javascript|x-javascript|"
    r"ecmascript|x-www-form-urlencoded))$"
)

Status = Literal["downloaded", "skipped", "refused", "failed"]


@dataclass
class _Spot:
    """Where a URL sits in the result, i.e. how to record its download there."""

    how: Literal["append", "replace", "update"]
    holder: Any = None  # list for "replace", dict for "update"
    index: int = 0
    kind: str | None = None  # media kind the place implies (images → image)
    key: str = ""  # result key of a lone string entry


@dataclass
class _Candidate:
    url: str
    where: str  # the result field it was found in
    explicit: bool
    spots: list[_Spot] = field(default_factory=list)
    hint: str | None = None
    status: Status | None = None
    reason: str = ""
    entry: dict[str, Any] | None = None
    artifact: str | None = None


async def materialize(
    result: dict[str, Any],
    workspace: Path,
    fetcher: SafeFetcher,
    *,
    max_probes: int = MAX_PROBES,
    max_bytes: int = MAX_BYTES,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Download the remote files ``result`` points at into ``workspace``.

    Returns the updated result (a copy) and the fetch records
    ``{"url", "field", "status", "reason", "artifact"}``.
    """
    if not mentions_urls(result):
        return result, []  # most results: nothing to look at, nothing to copy
    out = copy.deepcopy(result)
    workspace = Path(workspace)
    candidates = _find_candidates(out)
    known = _already_local(out, workspace)

    for cand in candidates.values():
        if cand.url in known:
            cand.status, cand.reason, cand.artifact = (
                "skipped",
                "already downloaded",
                known[cand.url],
            )
            continue
        try:
            check_url(cand.url, fetcher.allow_hosts)
        except RefusedURL as exc:
            cand.status, cand.reason = "refused", exc.reason

    pending = [c for c in candidates.values() if c.status is None]
    ambiguous = [c for c in pending if not c.explicit]
    for cand in ambiguous[max_probes:]:
        cand.status, cand.reason = "skipped", f"probe limit ({max_probes}) reached"
    await _bounded([_probe_step(c, fetcher) for c in ambiguous[:max_probes]])
    wanted = [c for c in pending if c.status is None]
    for cand in wanted[MAX_DOWNLOADS:]:
        cand.status, cand.reason = "skipped", f"download limit ({MAX_DOWNLOADS}) reached"
    await _bounded(
        [_download_step(c, fetcher, workspace, max_bytes) for c in wanted[:MAX_DOWNLOADS]]
    )

    for cand in candidates.values():
        if cand.entry is not None:
            _apply(out, cand)
    records = [
        {
            "url": c.url,
            "field": c.where,
            "status": c.status,
            "reason": c.reason,
            "artifact": c.artifact,
        }
        for c in candidates.values()
    ]
    return out, records


# --- finding URLs -------------------------------------------------------------------------

_URL_FIELDS = frozenset([*EXPLICIT_FIELDS, *MEDIA_LISTS, "media", *AMBIGUOUS_FIELDS])


def mentions_urls(result: object) -> bool:
    """Could ``result`` hold a remote URL at all (a cheap test before the full scan)?"""
    if not isinstance(result, dict):
        return False
    if not _URL_FIELDS.isdisjoint(result):
        return True
    return any(isinstance(v, str) and "://" in v for k in TEXT_FIELDS if (v := result.get(k)))


def _find_candidates(out: dict[str, Any]) -> dict[str, _Candidate]:
    """Every remote URL of a result, with where it sits (explicit fields first)."""
    found = _Candidates(out)
    for key in EXPLICIT_FIELDS:
        found.scan_field(key, explicit=True)
    for key, kind in [*MEDIA_LISTS.items(), ("media", None)]:
        found.scan_media(key, kind)
    for key in AMBIGUOUS_FIELDS:
        found.scan_field(key, explicit=False)
    for key in TEXT_FIELDS:
        text = out.get(key)
        if isinstance(text, str):
            for url in text_links(text):
                found.add(url, key, False, _Spot("append"))
    return found.by_url


class _Candidates:
    """URLs found in one result, each with every spot it was found at."""

    def __init__(self, out: dict[str, Any]) -> None:
        self.out = out
        self.by_url: dict[str, _Candidate] = {}

    def add(
        self, url: str, where: str, explicit: bool, spot: _Spot, hint: str | None = None
    ) -> None:
        url = url.strip()
        cand = self.by_url.get(url)
        if cand is None:
            cand = self.by_url[url] = _Candidate(url, where, explicit, hint=hint)
        cand.explicit = cand.explicit or explicit
        cand.spots.append(spot)

    def scan_field(self, key: str, *, explicit: bool) -> None:
        value = self.out.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and _URL_LIKE.match(item.strip()):
                self.add(item, key, explicit, _Spot("append"))
            elif isinstance(item, dict):
                url = _entry_url(item)
                if url:
                    self.add(url, key, explicit, _Spot("update", item), _entry_name(item))

    def scan_media(self, key: str, kind: str | None) -> None:
        value = self.out.get(key)
        if key == "media" and not isinstance(value, list):
            if isinstance(value, str) and _URL_LIKE.match(value.strip()):
                self.add(value, key, True, _Spot("append"))
            return
        entries = value if isinstance(value, list) else [value]
        for i, item in enumerate(entries):
            if isinstance(item, str) and _URL_LIKE.match(item.strip()):
                # a lone string (not a list) is replaced by a one-entry list when downloaded
                holder = entries if isinstance(value, list) else None
                self.add(item, key, True, _Spot("replace", holder, i, kind, key))
            elif isinstance(item, dict):
                url = _entry_url(item)
                if url:
                    entry_kind = kind or _declared_kind(item)
                    self.add(
                        url, key, True, _Spot("update", item, kind=entry_kind), _entry_name(item)
                    )


def text_links(text: str) -> list[str]:
    """Plain ``http(s)://`` links in ``text`` (Markdown links and images included)."""
    links = []
    for match in _TEXT_LINK.finditer(text):
        url = match.group(0)
        while url and url[-1] in ".,;:!?*_~]}>":
            url = url[:-1]
        while url.endswith(")") and url.count(")") > url.count("("):
            url = url[:-1]
        if url not in links:
            links.append(url)
    return links


def _entry_url(entry: dict[str, Any]) -> str | None:
    for key in ("url", "src", "href", "source_url", "download_url"):
        value = entry.get(key)
        if isinstance(value, str) and _URL_LIKE.match(value.strip()):
            return value.strip()
    return None


def _entry_name(entry: dict[str, Any]) -> str | None:
    name = entry.get("filename") or entry.get("name")
    return name if isinstance(name, str) else None


def _declared_kind(entry: dict[str, Any]) -> str | None:
    kind = entry.get("media") or entry.get("type") or entry.get("kind")
    return kind if kind in LIST_FOR else None


def _local_file(entry: dict[str, Any], workspace: Path) -> Path | None:
    path = entry.get("local_path")
    if not isinstance(path, str) or not path:
        return None
    p = Path(path).expanduser()
    p = p if p.is_absolute() else workspace / p
    return p if p.is_file() else None


def _already_local(out: dict[str, Any], workspace: Path) -> dict[str, str]:
    """source URL → existing local path, for entries a previous run (or the skill) stored."""
    known: dict[str, str] = {}
    for key in [*MEDIA_LISTS, "media", *EXPLICIT_FIELDS, *AMBIGUOUS_FIELDS]:
        value = out.get(key)
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                continue
            local = _local_file(item, workspace)
            if local is not None:
                for url_key in ("source_url", "url"):
                    url = item.get(url_key)
                    if isinstance(url, str) and url:
                        known.setdefault(url.strip(), str(local))
    return known


# --- probing and downloading --------------------------------------------------------------


async def _bounded(steps: list[Awaitable[None]]) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def run(step: Awaitable[None]) -> None:
        async with gate:
            await step

    await asyncio.gather(*(run(s) for s in steps))


async def _guarded(cand: _Candidate, action: Callable[[], Awaitable[None]]) -> None:
    try:
        await action()
    except RefusedURL as exc:
        cand.status, cand.reason = "refused", exc.reason
    except FetchError as exc:
        cand.status, cand.reason = "failed", exc.reason
    except Exception as exc:  # one URL never fails the job; the record keeps the cause
        log.warning("materializing %s failed", cand.url, exc_info=True)
        cand.status, cand.reason = "failed", f"{type(exc).__name__}: {exc}"


async def _probe_step(cand: _Candidate, fetcher: SafeFetcher) -> None:
    async def probe() -> None:
        found = await fetcher.probe(cand.url)
        mime = found.content_type or mime_from_name(_url_path(found.final_url))
        if mime is None:
            cand.status, cand.reason = "skipped", "unknown content type"
        elif _NOT_FILES.match(mime):
            cand.status, cand.reason = "skipped", f"not a file ({mime})"

    await _guarded(cand, probe)


async def _download_step(
    cand: _Candidate, fetcher: SafeFetcher, workspace: Path, max_bytes: int
) -> None:
    async def download() -> None:
        got = await fetcher.download(
            cand.url, workspace, max_bytes=max_bytes, filename_hint=cand.hint
        )
        media, mime = await asyncio.to_thread(sniff, got.path, got.mime)
        cand.status, cand.artifact = "downloaded", str(got.path)
        cand.entry = {
            "filename": got.filename,
            "local_path": str(got.path),
            "media": media,
            "mime": mime,
            "size": got.size,
            "sha256": got.sha256,
            "source_url": cand.url,
        }

    await _guarded(cand, download)


def _url_path(url: str) -> str:
    return url.split("?", 1)[0].split("#", 1)[0]


# --- recording downloads in the result ----------------------------------------------------


def _apply(out: dict[str, Any], cand: _Candidate) -> None:
    entry = cand.entry
    assert entry is not None
    # a URL that also sits in a media list is recorded there, not added a second time
    appended = any(spot.how != "append" for spot in cand.spots)
    for spot in cand.spots:
        if spot.how == "replace" and spot.holder is None:
            out[spot.key] = [{"url": cand.url, **entry}]
        elif spot.how == "replace":
            spot.holder[spot.index] = {"url": cand.url, **entry}
        elif spot.how == "update":
            extra = {k: v for k, v in entry.items() if k not in spot.holder or k == "local_path"}
            spot.holder.update(extra)
        elif not appended:
            appended = True
            key = LIST_FOR.get(entry["media"], "files")
            bucket = out.get(key)
            if not isinstance(bucket, list):
                bucket = out[key] = [] if bucket is None else [bucket]
            bucket.append(dict(entry))
