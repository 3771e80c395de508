"""The skill environments on disk (``<data_dir>/envs``): who uses one, what each holds, and
the cleanup that removes the ones nobody needs.

Every run that uses an environment holds a shared ``flock`` on ``<name>.use`` next to it
(an in-process skill's environment stays held for the worker's life: its packages are on
the import path). Removing an environment takes that lock exclusively, and the build lock
``<name>.lock``, without waiting: an environment a running job uses, or one being built,
is never removed — it is skipped and counted as in use. The lock file's mtime is the last
time a run used the environment (refreshed at most every few minutes).

An environment is removed (``skilljobs envs prune``, and each pass of the worker's pruner):

- when no run used it for ``SKILLJOBS_SKILL_ENV_RETENTION_DAYS`` (it is built again on
  next use);
- when no loaded skill declares it any more and no run used it for a day (the skill's
  dependencies changed, or the skill is gone);
- when a build died half-way (no ``.ready``, not being built, older than an hour);
- least recently used first while all of them together exceed ``SKILLJOBS_SKILL_ENV_MAX_MB``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.settings import Settings

__all__ = ["EnvInfo", "Lease", "Policy", "PruneReport", "prune", "remove", "scan"]

READY = ".ready"  # written last by a build: an environment without it is incomplete
INFO = "skilljobs-env.json"
DAY = 86400.0
TOUCH_EVERY_SEC = 300.0  # how often a run refreshes the last-used time
ORPHAN_GRACE_SEC = DAY
STALE_BUILD_SEC = 3600.0
_PREFIXES = ("py-", "node-")


def use_lock(root: Path, name: str) -> Path:
    return root / f"{name}.use"


def build_lock(root: Path, name: str) -> Path:
    return root / f"{name}.lock"


class Lease:
    """A shared hold on one environment while a run uses it (``release`` when done)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    async def take(cls, root: Path, name: str, wait_sec: float) -> Lease:
        """Hold ``name`` shared; waits (polling) while a cleanup is removing it."""
        os.makedirs(root, exist_ok=True)
        fd = os.open(use_lock(root, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait_sec
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"environment {name} is being removed") from None
                    await asyncio.sleep(0.05)
            now = time.time()
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_mtime < now - TOUCH_EVERY_SEC:
                    os.utime(fd, (now, now))  # last used
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


@contextlib.contextmanager
def _exclusive(path: Path, *, create: bool = True) -> Iterator[bool]:
    """An exclusive ``flock`` on ``path`` if nobody holds it now (True), else False.
    Without ``create`` a missing lock file counts as free and is not made (a check must
    not touch the last-used time)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        yield not create
        return
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


# --- what is there ----------------------------------------------------------------------------


@dataclass
class EnvInfo:
    """One environment directory as found on disk."""

    name: str
    path: Path
    ready: bool
    size: int  # bytes, files counted once, symlinks not followed
    last_used: float  # a run's last use, else when it was built (or started being built)
    source: str = ""
    requirements: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "python" if self.name.startswith("py-") else "node"

    def to_dict(self, *, now: float, in_use: bool | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "requirements": self.requirements,
            "ready": self.ready,
            "size_bytes": self.size,
            "last_used": self.last_used,
            "unused_days": round(max(0.0, now - self.last_used) / DAY, 2),
        }
        if in_use is not None:
            out["in_use"] = in_use
        return out


def _size(path: Path) -> int:
    total = 0
    stack = [path]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_size
    return total


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def scan(root: Path) -> list[EnvInfo]:
    """Every environment directory under ``root``, least recently used first."""
    found: list[EnvInfo] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(root):
            if not entry.name.startswith(_PREFIXES) or not entry.is_dir(follow_symlinks=False):
                continue
            path = Path(entry.path)
            ready = (path / READY).is_file()
            info: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                info = json.loads((path / INFO).read_text(encoding="utf-8"))
            used = max(_mtime(use_lock(root, entry.name)), _mtime(path / READY), _mtime(path))
            found.append(
                EnvInfo(
                    name=entry.name,
                    path=path,
                    ready=ready,
                    size=_size(path),
                    last_used=used,
                    source=str(info.get("source") or ""),
                    requirements=[str(r) for r in info.get("requirements") or []],
                )
            )
    found.sort(key=lambda e: e.last_used)
    return found


def in_use(root: Path, name: str) -> bool:
    """Whether a run holds the environment, or a build of it is under way (asked now)."""
    with (
        _exclusive(use_lock(root, name), create=False) as free,
        _exclusive(build_lock(root, name), create=False) as idle,
    ):
        return not (free and idle)


# --- removing -----------------------------------------------------------------------------------


def remove(root: Path, name: str) -> bool:
    """Remove one environment unless a run uses it or it is being built (False then)."""
    path = root / name
    with _exclusive(use_lock(root, name)) as free, _exclusive(build_lock(root, name)) as idle:
        if not (free and idle):
            return False
        # Unready first: a run that waited for this lock sees it gone and builds it again.
        with contextlib.suppress(FileNotFoundError):
            (path / READY).unlink()
        shutil.rmtree(path, ignore_errors=True)
        return True


@dataclass(frozen=True)
class Policy:
    """When an environment goes (see the module docstring); None disables a rule."""

    max_age_days: float | None = 30.0
    max_bytes: int | None = None
    orphan_grace_sec: float = ORPHAN_GRACE_SEC
    stale_build_sec: float = STALE_BUILD_SEC

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        days = getattr(settings, "skill_env_retention_days", 30.0)
        mb = getattr(settings, "skill_env_max_mb", None)
        return cls(
            max_age_days=days if days and days > 0 else None,
            max_bytes=int(mb * (1 << 20)) if mb and mb > 0 else None,
        )


@dataclass
class PruneReport:
    """What a cleanup removed (or, dry, would remove), and what it had to keep."""

    removed: list[tuple[EnvInfo, str]] = field(default_factory=list)  # (environment, why)
    in_use: list[str] = field(default_factory=list)  # due for removal, but held or building
    kept: int = 0
    size_before: int = 0
    dry_run: bool = False

    @property
    def freed(self) -> int:
        return sum(e.size for e, _ in self.removed)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "removed": [{**e.to_dict(now=now), "reason": why} for e, why in self.removed],
            "in_use": self.in_use,
            "kept": self.kept,
            "size_before_bytes": self.size_before,
            "freed_bytes": self.freed,
            "dry_run": self.dry_run,
        }


def _reason(env: EnvInfo, policy: Policy, wanted: set[str] | None, now: float) -> str | None:
    idle = now - env.last_used
    if not env.ready:
        return "an unfinished build" if idle > policy.stale_build_sec else None
    if policy.max_age_days is not None and idle > policy.max_age_days * DAY:
        return f"unused for {idle / DAY:.0f} days"
    if wanted is not None and env.name not in wanted and idle > policy.orphan_grace_sec:
        return "no loaded skill declares it"
    return None


def prune(
    root: Path,
    policy: Policy,
    *,
    wanted: Iterable[str] | None = None,
    dry_run: bool = False,
    now: float | None = None,
) -> PruneReport:
    """Remove the environments under ``root`` the policy lets go (blocking; run it in a
    thread). ``wanted``: the names the loaded skills declare (None: not known, so the
    "no skill declares it" rule is off)."""
    now = time.time() if now is None else now
    want = set(wanted) if wanted is not None else None
    envs = scan(root)
    report = PruneReport(size_before=sum(e.size for e in envs), dry_run=dry_run)
    total = report.size_before

    def drop(env: EnvInfo, why: str) -> bool:
        gone = not in_use(root, env.name) if dry_run else remove(root, env.name)
        if gone:
            report.removed.append((env, why))
        else:
            report.in_use.append(env.name)
        return gone

    left: list[EnvInfo] = []
    for env in envs:
        why = _reason(env, policy, want, now)
        if why is not None and drop(env, why):
            total -= env.size
        else:
            left.append(env)
    if policy.max_bytes is not None:
        for env in left[:]:  # least recently used first
            if total <= policy.max_bytes:
                break
            if env.name not in report.in_use and drop(env, "over the size cap"):
                total -= env.size
                left.remove(env)
    report.kept = len(left)
    return report
