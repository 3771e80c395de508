"""Artifact registration: the files a result declares (plus backfill), vetted and described.

Declared files: top-level ``filename`` / ``local_path`` (kind from a string ``media``), the lists
``images videos files audios`` and a ``media`` list (paths, or dicts with ``local_path`` /
``path`` / ``filename``). Paths may be absolute, workspace-relative or ``~/``; they must resolve
INSIDE the workspace (``..`` and symlink escapes are refused). Refused and missing files are
reported, never raised. Backfill adds undeclared top-level workspace files when the skill
declared none itself — only those this run created or changed (``jobs.runscope``), at most
:data:`BACKFILL_MAX_FILES`; one delivery carries at most :data:`DELIVERY_MAX_BYTES`.

``collect`` reads files (sniffing, SHA-256); from async code call ``acollect``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobs import nofollow
from jobs.media import HEAD_BYTES, MEDIA_KINDS, media_of, sniff_bytes, sniff_head, stream_digest
from jobs.runscope import RunChanges

log = logging.getLogger(__name__)

MEDIA_LISTS = {"images": "image", "videos": "video", "audios": "audio", "files": "file"}
BACKFILL_EXCLUDED_SUFFIXES = frozenset({".py", ".js", ".sh", ".log", ".tmp", ".srt", ".pyc"})
BACKFILL_EXCLUDED_PREFIXES = (".", "toolout_")
BACKFILL_MAX_FILES = 20
DELIVERY_MAX_BYTES = 200 * 1024 * 1024
CAP_REASON = (
    f"not sent: over the per-delivery cap ({BACKFILL_MAX_FILES} files backfilled, "
    f"{DELIVERY_MAX_BYTES // (1024 * 1024)} MB in all)"
)

Problems = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ArtifactInfo:
    filename: str
    local_path: str
    media: str  # image | video | audio | file
    mime: str
    size: int
    sha256: str
    source_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Declared:
    raw: str
    where: str
    kind: str | None
    mime: str | None = None
    source_url: str | None = None
    sha256: str | None = None
    size: int | None = None


class ArtifactRefused(Exception):
    """A declared path that is not an acceptable local attachment."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fill_local_path(result: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """A result with only ``filename`` gets ``local_path = <workspace>/<filename>`` (a copy)."""
    if not isinstance(result, dict):
        return result
    out = dict(result)
    name = out.get("filename")
    if isinstance(name, str) and name.strip() and not out.get("local_path"):
        out["local_path"] = str(Path(workspace) / name.strip())
    return out


def resolve_inside(raw: str, workspace: Path) -> Path:
    """The real path of a declared file, which must be a file inside ``workspace``."""
    text = raw.strip()
    if not text or "\0" in text:
        raise ArtifactRefused(f"invalid path {raw!r}")
    path = Path(text).expanduser() if text == "~" or text.startswith("~/") else Path(text)
    if not path.is_absolute():
        path = workspace / path
    root = Path(os.path.realpath(workspace))
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        via = "symlink " if Path(os.path.normpath(path)).is_relative_to(root) else ""
        raise ArtifactRefused(f"{via}{raw} resolves outside the workspace")
    if not real.exists():
        raise ArtifactRefused(f"missing file {raw}")
    if not real.is_file():
        raise ArtifactRefused(f"not a regular file {raw}")
    return real


def declared_files(result: dict[str, Any]) -> list[_Declared]:
    """Every local file ``result`` declares, in order (URL-only entries are not files)."""
    found: list[_Declared] = []
    if not isinstance(result, dict):
        return found
    media = result.get("media")
    top_kind = media if media in MEDIA_KINDS else None
    top = result.get("local_path") or result.get("filename")
    if isinstance(top, str) and top.strip() and not _is_url(top):
        found.append(_Declared(top, "local_path", top_kind, _str(result.get("mime"))))
    for key, kind in [*MEDIA_LISTS.items(), ("media", None)]:
        value = result.get(key)
        if key == "media" and not isinstance(value, list):
            continue
        for item in value if isinstance(value, list) else [value]:
            entry = _declared_entry(item, key, kind)
            if entry is not None:
                found.append(entry)
    return found


def _declared_entry(item: object, key: str, kind: str | None) -> _Declared | None:
    if isinstance(item, str):
        return None if not item.strip() or _is_url(item) else _Declared(item, key, kind)
    if not isinstance(item, dict):
        return None
    raw = next(
        (
            item[k]
            for k in ("local_path", "path", "filename")
            if isinstance(item.get(k), str) and item[k].strip() and not _is_url(item[k])
        ),
        None,
    )
    if raw is None:
        return None
    declared_kind = item.get("media") or item.get("type") or item.get("kind")
    size = item.get("size")
    return _Declared(
        raw,
        key,
        declared_kind if declared_kind in MEDIA_KINDS else kind,
        _str(item.get("mime")),
        _str(item.get("source_url")),
        _str(item.get("sha256")),
        size if isinstance(size, int) else None,
    )


def declares_own_files(result: dict[str, Any]) -> bool:
    """The skill named its files itself (materialized downloads do not count)."""
    if not isinstance(result, dict):
        return False
    if any(
        isinstance(result.get(k), str) and result[k].strip() for k in ("filename", "local_path")
    ):
        return True
    return any(d.source_url is None for d in declared_files(result))


def backfill(
    result: dict[str, Any],
    workspace: Path,
    changes: RunChanges | None = None,
    problems: Problems | None = None,
) -> list[Path]:
    """Top-level workspace files the result does not declare (only if it declares none).

    With ``changes`` (what this run created or changed), only those files; the ones another
    run of the workspace may have written are attributed to neither and reported in
    ``problems``, as are symlinks that lead outside and files over the cap. Without
    ``changes`` every top-level file is a candidate.
    """
    if changes is not None and not changes.mine and not changes.ambiguous:
        return []  # this run wrote nothing: nothing to backfill, nothing to report
    workspace = Path(workspace)
    if declares_own_files(result) or not workspace.is_dir():
        return []
    declared = set()
    for d in declared_files(result):
        try:
            declared.add(resolve_inside(d.raw, workspace))
        except ArtifactRefused:
            continue
    report = problems if problems is not None else []
    if changes is None:
        names = sorted(p.name for p in workspace.iterdir())
    else:
        names = list(changes.mine)
        for name, rivals in sorted(changes.ambiguous.items()):
            if _backfillable(name):
                why = "written while another run of this workspace was running (job "
                report.append(
                    {"path": name, "field": "backfill", "reason": why + ", ".join(rivals) + ")"}
                )
    found: list[Path] = []
    for name in names:
        if not _backfillable(name):
            continue
        try:
            real = resolve_inside(name, workspace)
        except ArtifactRefused as exc:
            if changes is not None and "outside" in exc.reason:
                report.append({"path": name, "field": "backfill", "reason": exc.reason})
            continue
        if real in declared or real in found:
            continue
        if len(found) >= BACKFILL_MAX_FILES:
            report.append({"path": name, "field": "backfill", "reason": CAP_REASON})
            continue
        found.append(real)
    return found


def _backfillable(name: str) -> bool:
    if name.startswith(BACKFILL_EXCLUDED_PREFIXES):
        return False
    return Path(name).suffix.lower() not in BACKFILL_EXCLUDED_SUFFIXES


def collect(
    result: dict[str, Any],
    workspace: Path,
    problems: Problems | None = None,
    changes: RunChanges | None = None,
) -> list[ArtifactInfo]:
    """Every declared file plus backfill, each vetted and described once.

    Refused or missing files are left out and appended to ``problems`` as
    ``{"path", "field", "reason"}`` (and logged).
    """
    found = candidates(result, workspace, changes, problems)
    return describe_all(found, workspace, problems)


def candidates(
    result: dict[str, Any],
    workspace: Path,
    changes: RunChanges | None = None,
    problems: Problems | None = None,
) -> list[_Declared]:
    """The files a result declares plus the backfill (a listing of the workspace, no reads)."""
    workspace = Path(workspace)
    found = declared_files(result)
    extra = backfill(result, workspace, changes, problems)
    found += [_Declared(str(p), "backfill", None) for p in extra]
    return found


def describe_all(
    declared: list[_Declared], workspace: Path, problems: Problems | None = None
) -> list[ArtifactInfo]:
    workspace = Path(workspace)
    seen: set[Path] = set()
    artifacts: list[ArtifactInfo] = []
    total = 0
    for d in declared:
        try:
            real = resolve_inside(d.raw, workspace)
            if real in seen:
                continue
            seen.add(real)
            size = real.stat().st_size
            if total + size > DELIVERY_MAX_BYTES:
                raise ArtifactRefused(CAP_REASON)
            total += size
            artifacts.append(_describe(real, d))
        except (ArtifactRefused, OSError) as exc:
            reason = exc.reason if isinstance(exc, ArtifactRefused) else f"unreadable: {exc}"
            log.warning("artifact %s (%s) not collected: %s", d.raw, d.where, reason)
            if problems is not None:
                problems.append({"path": d.raw, "field": d.where, "reason": reason})
    return artifacts


async def acollect(
    result: dict[str, Any],
    workspace: Path,
    problems: Problems | None = None,
    changes: RunChanges | None = None,
) -> list[ArtifactInfo]:
    """``collect`` for async code: the listing runs inline (a directory read), the file
    reads (sniffing, SHA-256) in a worker thread, and only when there are files. A hop to a
    thread costs milliseconds on a busy loop, which most results never need."""
    found = candidates(result, workspace, changes, problems)
    if not found:
        return []
    return await asyncio.to_thread(describe_all, found, workspace, problems)


def _describe(real: Path, declared: _Declared) -> ArtifactInfo:
    """Sniffed and hashed from one descriptor opened with no symlink followed: a file
    swapped for a symlink after it was vetted is refused, never read through."""
    try:
        fd = nofollow.open_real(real)
    except nofollow.Refused as exc:
        raise ArtifactRefused(str(exc)) from exc
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(HEAD_BYTES)
        magic = sniff_bytes(head, real.name)
        if magic is not None:
            media, mime = media_of(magic), magic
        else:  # the bytes say nothing: a declared kind wins over header hint and extension
            media, mime = sniff_head(head, real, declared.mime)
            media = declared.kind or media
        size = os.fstat(fh.fileno()).st_size
        if declared.sha256 and declared.size == size:
            digest = declared.sha256  # hashed while it was downloaded
        else:
            fh.seek(0)
            size, digest = stream_digest(fh)
    return ArtifactInfo(real.name, str(real), media, mime, size, digest, declared.source_url)


def _is_url(value: str) -> bool:
    head = value.strip().split("/", 1)[0]
    return head.endswith(":") and len(head) > 2


def _str(value: object) -> str | None:
    return value if isinstance(value, str) and value else None
