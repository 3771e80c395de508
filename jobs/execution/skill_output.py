"""What a subprocess skill printed → its result (SPEC §2): whole stdout JSON → last line
JSON object → media file path / ``MEDIA:`` / ``MEDIA_URL:`` lines → ``{"output": ...}``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jobs.media import media_kind

LOG_CAP = 64 * 1024  # stderr tail kept as the run's log
ERROR_TAIL = 2000  # stderr tail quoted in an exit-code error


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def log_tail(stderr: bytes, cap: int = LOG_CAP) -> str:
    if len(stderr) <= cap:
        return decode(stderr)
    return f"[… {len(stderr) - cap} bytes cut]\n" + decode(stderr[-cap:])


def _loads(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


def _path_line(line: str, workspace: Path | None) -> Path | None:
    s = line.strip().strip("'\"")
    if not s or len(s) > 4096 or "\n" in s or s.startswith(("{", "[")):
        return None
    p = Path(os.path.expanduser(s))
    if not p.is_absolute():
        if workspace is None:
            return None
        p = workspace / p
    try:
        return p.resolve() if p.is_file() else None
    except OSError:
        return None


def parse_stdout(text: str, workspace: str | os.PathLike[str] | None = None) -> Any:
    """Whole stdout JSON → last line JSON object → media file path / ``MEDIA:`` /
    ``MEDIA_URL:`` lines → ``{"output": <raw stdout>}``."""
    stripped = text.strip()
    if stripped:
        ok, value = _loads(stripped)
        if ok:
            return value
        lines = [ln for ln in stripped.splitlines() if ln.strip()]
        ok, value = _loads(lines[-1].strip())
        if ok and isinstance(value, dict):
            return value
    ws = Path(workspace) if workspace else None
    files: list[Path] = []
    urls: list[str] = []
    rest: list[str] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("MEDIA_URL:"):
            url = s[len("MEDIA_URL:") :].strip()
            if url:
                urls.append(url)
            continue
        if s.startswith("MEDIA:"):
            p = _path_line(s[len("MEDIA:") :], ws)
            if p is not None:
                files.append(p)
                continue
            rest.append(line)
            continue
        p = _path_line(s, ws)
        if p is not None:
            files.append(p)
        else:
            rest.append(line)
    if not files and not urls:
        return {"output": text}
    result: dict[str, Any] = {"ok": True, "output": "\n".join(rest).strip()}
    groups: dict[str, list[dict[str, str]]] = {}
    for p in dict.fromkeys(files):
        kind = media_kind(p.name)
        groups.setdefault(kind + "s", []).append(
            {"filename": p.name, "local_path": str(p), "media": kind}
        )
    if files:
        first = files[0]
        result.update(filename=first.name, local_path=str(first), media=media_kind(first.name))
    result.update(groups)
    if urls:
        result["urls"] = list(dict.fromkeys(urls))
        if not files:
            result["media"] = media_kind(urls[0])
    return result
