"""Open files a skill left behind without following a symlink it may have planted.

A path is opened one component at a time (``openat`` with ``O_NOFOLLOW``), starting at a
directory the worker trusts (the workspace, or ``/`` for a path that was vetted as real):
a symlink anywhere on the way — swapped in after the path was checked — is refused, not
followed. Only regular files are opened (a FIFO would block, a device is not a file).
"""

from __future__ import annotations

import os
import stat
from pathlib import PurePosixPath

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class Refused(OSError):
    """Not a regular file reached without a symlink; the message says why."""


def relative_parts(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> list[str]:
    """``path`` (absolute or relative to ``root``) as components beneath ``root``, lexically:
    ``..`` that leaves ``root`` and absolute paths elsewhere are refused."""
    p = PurePosixPath(os.fspath(path))
    base = PurePosixPath(os.path.normpath(os.fspath(root)))
    if p.is_absolute():
        norm = PurePosixPath(os.path.normpath(p))
        if norm != base and base not in norm.parents:
            raise Refused(f"{path} is outside {root}")
        p = norm.relative_to(base)
    parts: list[str] = []
    for part in p.parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise Refused(f"{path} leaves {root}")
            parts.pop()
            continue
        parts.append(part)
    if not parts:
        raise Refused(f"{path} names no file")
    return parts


def open_beneath(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file ``path`` beneath ``root``; no component
    after ``root`` may be a symlink. The caller closes it."""
    parts = relative_parts(path, root)
    fd = os.open(os.fspath(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = _step(fd, part, _DIR, path)
            os.close(fd)
            fd = nxt
        out = _step(fd, parts[-1], _FILE, path)
    finally:
        os.close(fd)
    try:
        st = os.fstat(out)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"not a regular file: {path}")
        os.set_blocking(out, True)
    except BaseException:
        os.close(out)
        raise
    return out


def open_real(path: str | os.PathLike[str]) -> int:
    """:func:`open_beneath` from ``/``: for a path vetted earlier as a real path (no symlink
    in it), now opened so that a symlink swapped in since is refused."""
    text = os.fspath(path)
    if not os.path.isabs(text):
        raise Refused(f"not an absolute path: {text}")
    return open_beneath("/", text)


def _step(fd: int, name: str, flags: int, whole: str | os.PathLike[str]) -> int:
    try:
        return os.open(name, flags, dir_fd=fd)
    except OSError as exc:
        if exc.errno in (40, 20):  # ELOOP (a symlink), ENOTDIR (a symlink to a directory)
            raise Refused(f"symlink in {whole}: not followed") from exc
        raise


def read_beneath(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> bytes:
    fd = open_beneath(root, path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_real(path: str | os.PathLike[str]) -> bytes:
    fd = open_real(path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()
