"""Skills run as less than the worker: a non-dumpable worker, an unprivileged skill user.

``make_undumpable`` (``prctl(PR_SET_DUMPABLE, 0)``) keeps other processes of the same user —
a skill among them — out of ``/proc/<pid>/environ`` and the memory of the worker and the web
app. When the worker runs as root, subprocess skills run as ``SKILLJOBS_SKILL_USER``
(default ``skilljobs-skill``, created when missing): they can then read neither the data dir
(secret key, database, API token: all 0600/0700) nor the worker's memory, and write only
their workspace and a private temp dir.

A run falls back to the worker's own user (with a warning, once per reason) when the skill
user could not reach what it must run — an interpreter or skill folder under a private
directory, a workspace root inside one — rather than failing every skill of a deployment
that is laid out that way.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("skilljobs.privileges")

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
DEFAULT_SKILL_USER = "skilljobs-skill"
RUN_AS_WORKER = frozenset({"root", "0"})  # SKILLJOBS_SKILL_USER=root: no separate user
CHOWN_LIMIT = 10_000  # workspace entries handed to the skill user per run, at most


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, arg, 0, 0, 0))


def make_undumpable() -> bool:
    """Mark this process non-dumpable (Linux); False where that is not possible."""
    try:
        return _prctl(PR_SET_DUMPABLE, 0) == 0
    except (OSError, AttributeError):
        return False


def is_dumpable() -> bool | None:
    try:
        return _prctl(PR_GET_DUMPABLE) == 1
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class SkillUser:
    name: str
    uid: int
    gid: int


def resolve_skill_user(configured: str | None) -> SkillUser | None:
    """The user subprocess skills run as: None unless this process is root (or when the
    operator says ``root``). A missing user is created (system user, no login shell)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    name = (configured or "").strip() or DEFAULT_SKILL_USER
    if name in RUN_AS_WORKER:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _create_user(name)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ValueError(f"SKILLJOBS_SKILL_USER {name!r} is root: name an unprivileged user")
    return SkillUser(name, entry.pw_uid, entry.pw_gid)


def _create_user(name: str) -> None:
    tool = shutil.which("useradd")
    if tool is None:
        raise ValueError(
            f"the skill user {name!r} does not exist and useradd is not available: create it"
        )
    nologin = shutil.which("nologin") or "/bin/false"
    done = subprocess.run(
        [tool, "--system", "--user-group", "--no-create-home", "--shell", nologin, name],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0 and not _exists(name):
        raise ValueError(f"cannot create the skill user {name!r}: {done.stderr.strip()}")
    log.info("created the unprivileged user %s for subprocess skills", name)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def reachable(path: str | os.PathLike[str], *, need: int) -> bool:
    """Whether a user who is neither owner nor in the group can reach ``path``: every
    directory above it searchable by others, and ``path`` itself granting ``need``
    (``stat.S_IROTH``, ``S_IXOTH``…) to others."""
    p = Path(os.path.realpath(path))
    try:
        for parent in reversed(p.parents):
            if not parent.stat().st_mode & stat.S_IXOTH:
                return False
        return bool(p.stat().st_mode & need)
    except OSError:
        return False


_warned: set[str] = set()


def usable(
    user: SkillUser | None,
    program: str,
    skill_dir: str,
    workspace: str,
    *,
    env_dir: str = "",
) -> bool:
    """Whether a run can be made as ``user``; warns once per reason when it cannot.
    ``env_dir``: the skill's dependency environment, which it must be able to read."""
    if user is None:
        return False
    problems = []
    if env_dir and not reachable(env_dir, need=stat.S_IXOTH | stat.S_IROTH):
        problems.append(f"its dependency environment {env_dir}")
    exe = shutil.which(program) or program
    if not reachable(exe, need=stat.S_IXOTH):
        problems.append(f"the program {os.path.realpath(exe)}")
    if not reachable(skill_dir, need=stat.S_IXOTH | stat.S_IROTH):
        problems.append(f"the skill folder {skill_dir}")
    if not workspace or not reachable(Path(workspace).parent, need=stat.S_IXOTH):
        problems.append(f"the workspace {workspace or '(none)'}")
    if not problems:
        return True
    reason = ", ".join(problems)
    if reason not in _warned:
        _warned.add(reason)
        log.warning(
            "subprocess skill runs as the worker's user, not %s: it cannot reach %s "
            "(make these readable by other users, or set SKILLJOBS_SKILL_USER=root to "
            "silence this)",
            user.name,
            reason,
        )
    return False


def hand_over(workspace: str, uid: int, gid: int) -> None:
    """Give the workspace (0700) and what is in it to ``uid``/``gid``: to the skill user
    while a run uses it, back to the worker afterwards, so that at rest no skill can reach
    another workspace."""
    root = Path(workspace)
    os.chown(root, uid, gid)
    root.chmod(0o700)
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            count += 1
            if count > CHOWN_LIMIT:
                return
            with contextlib.suppress(OSError):
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


@contextlib.contextmanager
def private_tmp(user: SkillUser | None) -> Iterator[str]:
    """A temp dir for one run, owned by the skill user (0700), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="skilljobs-tmp-") as path:
        if user is not None:
            os.chown(path, user.uid, user.gid)
        os.chmod(path, 0o700)
        yield path
