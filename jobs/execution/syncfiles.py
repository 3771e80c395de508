"""Files named by a sync answer (SPEC C1/C2, like the background line): a chat-line answer
hands back only files inside the run's workspace or the turn's attachments.

A skill can print any path (a stdout line ``/etc/hostname``) or leave a symlink to a host
file in its workspace; the background line's delivery refuses such files, and so does the
sync answer: a ``local_path`` / ``filename`` or an item of ``images`` / ``videos`` /
``audios`` / ``files`` / ``media`` that does not resolve (symlinks followed) inside the
workspace is taken out of the answer, and ``refused_files`` says which field and why
(never the host path itself).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from jobs.envelope import is_failure
from jobs.execution.inputs import Confinement

__all__ = ["REFUSED_FILES", "confine_answer"]

REFUSED_FILES = "refused_files"
FILE_LISTS = ("images", "videos", "audios", "files", "media")
_ITEM_KEYS = ("local_path", "path", "filename")
REASON = "not inside this run's workspace (or an attachment of this conversation)"


def _is_url(value: str) -> bool:
    s = value.strip()
    return "://" in s or s.startswith("data:")


def _ok(conf: Confinement, value: object) -> bool:
    if not isinstance(value, str) or not value.strip() or _is_url(value):
        return True
    if "\x00" in value:
        return False
    return conf.inside(value)


def _item_ok(conf: Confinement, item: object) -> bool:
    if isinstance(item, dict):
        return all(_ok(conf, item.get(k)) for k in _ITEM_KEYS)
    return _ok(conf, item)


def confine_answer(result: object, workspace: str | None, attachments: Iterable[Any] = ()) -> Any:
    """``result`` without the files it names outside ``workspace`` / the attachments."""
    if not isinstance(result, dict) or is_failure(result):
        return result
    conf = Confinement(workspace, attachments)
    refused: list[dict[str, str]] = []
    out = dict(result)
    for key in ("local_path", "filename"):
        value = out.get(key)
        if not _ok(conf, value):
            out.pop(key)
            refused.append({"field": key, "name": os.path.basename(str(value)), "reason": REASON})
    for key in FILE_LISTS:
        value = out.get(key)
        if not isinstance(value, list):
            continue
        kept = []
        for i, item in enumerate(value):
            if _item_ok(conf, item):
                kept.append(item)
            else:
                raw = item.get("local_path") or item.get("path") if isinstance(item, dict) else item
                name = os.path.basename(str(raw or ""))
                refused.append({"field": f"{key}[{i}]", "name": name, "reason": REASON})
        out[key] = kept
    if not refused:
        return result
    out[REFUSED_FILES] = refused
    return out
