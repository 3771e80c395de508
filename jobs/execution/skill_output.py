"""What a subprocess skill printed → its result (SPEC §2): whole stdout JSON → last line
JSON object → media file path / ``MEDIA:`` / ``MEDIA_URL:`` lines → ``{"output": ...}``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jobs.envelope import failure
from jobs.media import media_kind
from jobs.texts import REASON_MAX, reason_block

LOG_CAP = 64 * 1024  # stderr tail kept as the run's log
ERROR_TAIL = 2000  # stderr tail quoted in an exit-code error
STDOUT_REASON_LINES = 20  # stdout lines quoted when a failing script wrote nothing on stderr
STREAM_TAIL_CAP = 4000  # characters of each stream kept on a failed job


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


def _tail(data: bytes, cap: int) -> str:
    text = decode(data[-cap:]) if len(data) > cap else decode(data)
    return text.strip()


def _envelope_reason(stdout: bytes) -> str:
    """The reason of a JSON error envelope printed on stdout (``error`` / ``message``…),
    or ``""`` when stdout holds none."""
    text = _tail(stdout, ERROR_TAIL * 8)
    if not text or "{" not in text:
        return ""
    parsed = parse_stdout(text)
    if not isinstance(parsed, dict) or ("output" in parsed and len(parsed) == 1):
        return ""
    failed = parsed.get("ok") is False or parsed.get("success") is False
    if not failed and "error" not in parsed:
        return ""
    for key in ("error", "user_message", "msg", "message", "reason", "detail"):
        value = parsed.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, dict):  # {"error": {"message": …, "code": …}}
            inner = value.get("message") or value.get("detail")
            if isinstance(inner, str) and inner.strip():
                return inner.strip()
    return ""


def exit_failure(skill: str, code: int, stdout: bytes, stderr: bytes) -> dict[str, Any]:
    """The failure envelope of a process that exited non-zero (SPEC §2, C5, C26): the
    reason is the JSON error envelope on stdout if there is one, else stderr without its
    warning noise, else stdout's tail — the last meaningful block (at most
    ``REASON_MAX`` characters), not the last line; both tails are kept (capped)."""
    reason = _envelope_reason(stdout)
    if reason:
        reason = reason_block(reason) or reason[:REASON_MAX]
    else:
        reason = reason_block(_tail(stderr, ERROR_TAIL * 4)) or reason_block(
            _tail(stdout, ERROR_TAIL * 4)
        )
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    env = failure(
        f"skill {skill!r} {how}" + (f": {reason}" if reason else " (no output)"),
        skill=skill,
        exit_code=code,
        stdout_tail=_tail(stdout, STREAM_TAIL_CAP),
        stderr_tail=_tail(stderr, STREAM_TAIL_CAP),
    )
    if reason:
        env["user_message"] = reason
    return env


__all__ = [
    "ERROR_TAIL",
    "LOG_CAP",
    "decode",
    "exit_failure",
    "log_tail",
    "media_kind",
    "parse_stdout",
]
