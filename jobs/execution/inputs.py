"""Confined file parameters (SPEC C15): a chat input never names a file outside its job.

Every file-like value of the input must resolve — symlinks followed, ``..`` applied — inside
the job's workspace, or be the ``local_path`` of one of the current turn's attachments.
Anything else is refused before the skill runs, with a recoverable error naming the field.

Which values are file-like:

* a property the skill's schema marks with ``format: path`` / ``format: file`` (or
  ``x-file: true``);
* a field whose name says so, however it is spelled (``file_path``, ``filePath``,
  ``file-path`` are one name): ``path``, ``file``, ``filename``, ``local_path``, ``attach``,
  ``attachments``, ``paths``, ``files``, ``dir``, ``directory``, names ending in
  ``_path``, ``_file``, ``_paths``, ``_files``, ``_dir`` and names with one of those words;
* a conventional media field (``input``, ``output``, ``src``, ``dst``, ``image``, ``video``,
  ``audio``, …) whose value looks like a path (one line, absolute, ``~/`` or containing a
  ``..`` segment).

Other fields are data: whether a value is refused never depends on what happens to exist
on the host. URLs (``scheme://``) and ``data:`` values are not paths. Nested objects and
lists are checked with the same rules.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jobs.crypto import ENC_TAG
from jobs.envelope import failure

STRONG_NAMES = frozenset(
    {
        "path",
        "file",
        "filename",
        "local_path",
        "attach",
        "attachments",
        "paths",
        "files",
        "dir",
        "directory",
    }
)
STRONG_SUFFIXES = ("_path", "_file", "_paths", "_files", "_dir")
MEDIA_NAMES = frozenset(
    "input output out src dst video audio image inputs videos images audios clips sources "
    "bgm".split()
)
PATH_FORMATS = frozenset({"path", "file", "file-path"})
MAX_DEPTH = 64


def shape_problem(value: object, where: str) -> str | None:
    """Why a dispatched value is not plain data, or None: containers nested deeper than
    ``MAX_DEPTH``, non-finite numbers, or our sealed-value key (user input is never
    unsealed, so it may not look sealed either)."""
    stack: list[tuple[Any, str, int]] = [(value, where, 1)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"{path} is not a finite number ({v})"
        if not isinstance(v, dict | list | tuple):
            continue
        if depth > MAX_DEPTH:
            return f"{where} is nested deeper than {MAX_DEPTH} levels"
        if isinstance(v, dict):
            if ENC_TAG in v:
                return f"{path}: the key {ENC_TAG!r} is reserved"
            stack.extend((x, f"{path}.{k}", depth + 1) for k, x in v.items())
        else:
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
    return None


class Refused(ValueError):
    """A file-like value points outside the job; ``field`` names where it was found."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.value, self.reason = field, value, reason


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def canonical(key: str) -> str:
    """``filePath``, ``file-path``, ``FILE_PATH`` → ``file_path``: one spelling for the
    name rules, since a CLI renders ``file_path`` and ``file-path`` as the same flag."""
    return _CAMEL.sub("_", key).replace("-", "_").lower()


def _is_strong(key: str) -> bool:
    k = canonical(key)
    if k in STRONG_NAMES or k.endswith(STRONG_SUFFIXES):
        return True
    # inputFile, sourcePaths, file_name: any word of the name that says "file"
    return any(w in STRONG_NAMES for w in k.split("_"))


def _schema_paths(schema: object) -> frozenset[str]:
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping):
        return frozenset()
    return frozenset(
        k
        for k, p in props.items()
        if isinstance(p, Mapping)
        and (str(p.get("format") or "").lower() in PATH_FORMATS or p.get("x-file") is True)
    )


def _not_a_path(value: str) -> bool:
    s = value.strip()
    return not s or "://" in s or s.startswith("data:") or "\x00" in s or "\n" in s


def _escapes(value: str) -> bool:
    parts = value.replace("\\", "/").split("/")
    return ".." in parts


def _looks_like_path(value: str) -> bool:
    s = value.strip()
    if os.path.isabs(s) or s.startswith("~"):
        return " " not in s  # "/imagine a cat" is a prompt
    return _escapes(s)


class Confinement:
    """The places a job's file parameters may name: its workspace and its attachments."""

    def __init__(self, workspace: str | None, attachments: Iterable[Any] = ()) -> None:
        self.root = Path(os.path.realpath(workspace)) if workspace else None
        self.allowed: set[str] = set()
        for att in attachments:
            local = att.get("local_path") if isinstance(att, Mapping) else None
            if isinstance(local, str) and local.strip():
                self.allowed.add(os.path.realpath(local.strip()))

    def resolve(self, value: str) -> str:
        """The real path ``value`` names (relative to the workspace; ``~`` is the workspace)."""
        s = value.strip()
        if s == "~" or s.startswith("~/"):
            s = s[2:] if s.startswith("~/") else ""
        elif s.startswith("~"):
            return os.path.realpath(os.path.expanduser(s))  # ~user: somebody's home
        if os.path.isabs(s):
            return os.path.realpath(s)
        base = str(self.root) if self.root is not None else os.path.realpath(os.getcwd())
        return os.path.realpath(os.path.join(base, s))

    def inside(self, value: str) -> bool:
        s = value.strip()
        if self.root is None and not os.path.isabs(s) and not s.startswith("~"):
            return not _escapes(s)  # no workspace: plain relative names only
        real = self.resolve(s)
        if real in self.allowed:
            return True
        if self.root is None:
            return False
        return real == str(self.root) or real.startswith(str(self.root) + os.sep)

    def check(self, field: str, value: str) -> None:
        if not self.inside(value):
            where = "this job's workspace" if self.root is not None else "this job"
            raise Refused(
                field,
                value,
                f"{value!r} is outside {where} (files must be in the workspace or be an "
                "attachment of this conversation)",
            )


def _walk(conf: Confinement, field: str, value: object, mode: str, depth: int) -> None:
    """``mode``: "strong" (a file field), "media" (a file field when it looks like a
    path) or "any" (data; only nested file fields are checked)."""
    if depth > MAX_DEPTH:
        raise Refused(field, "", f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if _not_a_path(value):
            return
        if mode == "strong" or (mode == "media" and _looks_like_path(value)):
            conf.check(field, value)
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _walk(conf, f"{field}[{i}]", item, mode, depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            k = str(key)
            sub = "strong" if mode == "strong" or _is_strong(k) else _mode(k, frozenset())
            _walk(conf, f"{field}.{k}" if field else k, item, sub, depth + 1)


def _mode(key: str, schema_paths: frozenset[str]) -> str:
    if key in schema_paths or _is_strong(key):
        return "strong"
    return "media" if canonical(key) in MEDIA_NAMES else "any"


_FLAG_FILE_NAMES = (*STRONG_NAMES, "file_path", "input_file", "output_file", "file_name")


def mode_of(key: str, schema: object = None, *, flag: bool = False) -> str:
    """How the value of input ``key`` is judged: "strong" (always a path), "media" (a
    path when it looks like one) or "any" (data). ``flag``: the key becomes a command-line
    flag, and a prefix of a file flag's name (``fil``, ``file-p``) is read as that flag by
    argparse, so it is judged as one."""
    mode = _mode(key, _schema_paths(schema))
    if mode == "any" and flag:
        k = canonical(key)
        if k and any(name.startswith(k) for name in _FLAG_FILE_NAMES):
            return "strong"
    return mode


def looks_like_url(value: str) -> bool:
    """Not a path at all: empty, a URL, ``data:``, multi-line or with NUL."""
    return _not_a_path(value)


def looks_like_path(value: str) -> bool:
    """A one-line value that names a file: absolute, ``~``-relative or with ``..``."""
    return not _not_a_path(value) and _looks_like_path(value)


def confine(
    input_data: Mapping[str, Any],
    *,
    workspace: str | None,
    attachments: Iterable[Any] = (),
    schema: object = None,
) -> None:
    """Raise :class:`Refused` for the first file-like value that points outside the job."""
    if all(str(key).startswith("_") for key in input_data):
        return  # nothing to judge (and no realpath of the workspace to pay for)
    conf = Confinement(workspace, attachments)
    paths = _schema_paths(schema)
    for key, value in input_data.items():
        k = str(key)
        if k.startswith("_"):
            continue
        _walk(conf, k, value, _mode(k, paths), 1)


def refusal(exc: Refused, skill: str) -> dict[str, Any]:
    """The recoverable failure envelope for a refused file parameter."""
    return failure(
        f"input field {exc.field!r} was refused: {exc.reason}",
        error_type="recoverable",
        need_param=[exc.field.split(".", 1)[0].split("[", 1)[0]],  # the field(s), as dispatch
        field=exc.field,
        skill=skill,
    )
