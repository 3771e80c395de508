"""What one run of a skill changed in its workspace.

When a run starts, the workspace's top level is listed (name, size, mtime_ns, inode); when
it ends, the listing is compared. A file that appeared or changed while another run of the
same workspace was also alive is attributed to neither run.

Who else was alive is known two ways. This process's own runs are tracked in memory,
exactly (start, end, job). Other processes (other workers, other hosts sharing the volume)
see this process's runs through a marker under ``.skilljobs-runs/``: one marker per
*episode*, a stretch of time during which this process had at least one run alive in that
workspace. The marker is created when the first run of an episode starts (before that run's
snapshot, so before any of its writes) and renamed with its end when the last one ends.
Many overlapping runs of one workspace (one busy chat session) thus cost no file-system
writes per run; a lone run costs one marker, as before. An episode stops taking new runs
after :data:`ROLL_NS`, so no open marker outlives :data:`STALE_NS` while its process lives.
A marker of another process names the job that opened its episode.

Creating a file costs this file system ~30–110 µs, renaming one ~3 µs; a marker is written
on the start path of every lone run. So when an episode closes, a *spare* file
(``s-<created>-<id>``, which no process reads as a marker) is created for the workspace,
and the next episode's marker is that spare renamed: the marker still exists, with the
episode's own start in its name, before the run's snapshot. Spares nobody took are pruned
once they are older than :data:`STALE_NS`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.context import job_results_dir, job_workspace
from jobs.models import JobRow
from jobs.settings import Settings

RUNS_DIR = ".skilljobs-runs"
PRUNE_EVERY = 16  # runs that changed nothing prune the markers this seldom
_quiet_runs = itertools.count(1)
# A marker older than the longest possible run (hard wall clock cap + margin) is stale: its
# worker died without closing it.
STALE_NS = (1800 + 600) * 1_000_000_000
# An episode takes new runs this long; its marker then closes once its runs have ended (at
# most the hard wall clock cap later), well before it could look stale.
ROLL_NS = 300 * 1_000_000_000
# A file's mtime comes from the kernel's coarse clock, up to a tick (1-10 ms) behind
# time.time_ns() that dates the runs: a file written just after a rival started can carry
# an mtime from just before. A rival's run is taken to start this much earlier, so such a
# file is attributed to neither run instead of to this one alone. (Its end needs no
# margin: what a rival wrote before it ended has an mtime before that end.)
MTIME_SLACK_NS = 20_000_000

Stamp = tuple[int, int, int]  # size, mtime_ns, inode


@dataclass(frozen=True, slots=True)
class RunChanges:
    """Top-level names this run created or changed (``mine``), and those created or changed
    while another run of the workspace was alive (``ambiguous``, name → the other job ids)."""

    mine: tuple[str, ...] = ()
    ambiguous: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(slots=True)
class _Marker:
    """A run (or another process's episode): from ``start`` to ``end`` (None: alive)."""

    name: str
    start: int
    end: int | None
    run: str
    job: str


@dataclass(slots=True)
class _Episode:
    id: str
    start: int
    job: str
    on_disk: bool  # its marker was written (False: an unwritable workspace)
    live: int = 0

    @property
    def open_name(self) -> str:
        return f"o-{self.start}-{self.id}-{self.job}"


class _Local:
    """This process's runs in one workspace: the living ones and the ended ones a living
    run may still overlap, and the episodes (markers) they belong to."""

    __slots__ = ("cap", "current", "ended", "episodes", "live", "own")

    def __init__(self) -> None:
        self.current: _Episode | None = None
        self.episodes: dict[str, _Episode] = {}  # open episodes by id
        self.own: set[str] = set()  # ids of this process's markers (open or closed)
        self.live: dict[str, tuple[_Marker, _Episode]] = {}
        self.ended: list[_Marker] = []
        self.cap = 64  # the ended list is tidied when it grows past this

    def forget_ended(self) -> None:
        """Drop the ended runs no living run overlapped (nobody here can need them)."""
        if self.live:
            horizon = min(m.start for m, _ in self.live.values())
            self.ended = [m for m in self.ended if (m.end or 0) >= horizon]
        else:
            self.ended.clear()
        # (a long run keeps what ended since it started: tidy again only once that doubled)
        self.cap = max(64, 2 * len(self.ended))


_local: dict[str, _Local] = {}
_spares: dict[str, str] = {}  # workspace -> this process's spare marker file in it
MAX_SPARES = 4096  # workspaces with a spare at once (past that, the oldest one's goes)
_lock = threading.Lock()
_run_ids = itertools.count(1)
_NEW_FILE = os.O_CREAT | os.O_EXCL | os.O_WRONLY


def _after_fork() -> None:
    """A forked child does not own its parent's runs or markers (nor its lock's state)."""
    global _lock
    _lock = threading.Lock()
    _local.clear()
    _spares.clear()


os.register_at_fork(after_in_child=_after_fork)


@dataclass
class RunScope:
    """One run of a skill in one workspace, from its first to its last moment."""

    workspace: Path
    job_id: str
    run_id: str
    started_ns: int
    before: dict[str, Stamp]
    _changes: RunChanges | None = None
    _ended: bool = False

    def finish(self) -> RunChanges:
        """Compare the workspace with the snapshot and end the run (once; later calls
        return the same answer)."""
        if self._changes is not None:
            return self._changes
        now = time.time_ns()
        # Files first, then markers: a run whose writes are in this listing started (and
        # was registered, its episode's marker written) before them.
        current = listing(self.workspace)
        if all(self.before.get(name) == stamp for name, stamp in current.items()):
            # Nothing new to attribute: end the run, and leave the markers' upkeep to every
            # PRUNE_EVERY-th such run.
            self._changes = RunChanges((), {})
            closed = self._end(now)
            if closed is not None and next(_quiet_runs) % PRUNE_EVERY == 0:
                self._prune(now, closed)
            return self._changes
        key = os.fspath(self.workspace)
        with _lock:
            here = _local.get(key)
            own = set(here.own) if here is not None else set()
            rivals = [] if here is None else [m for m, _ in here.live.values()] + here.ended
        rivals = [m for m in rivals if m.run != self.run_id]
        markers = [m for m in _markers(self.workspace) if m.run not in own]
        # an open marker older than any run can last: its worker died without closing it
        rivals += [m for m in markers if m.end is not None or _alive(m, now)]
        mine: list[str] = []
        ambiguous: dict[str, tuple[str, ...]] = {}
        for name, stamp in current.items():
            if self.before.get(name) == stamp:
                continue
            mtime = stamp[1]
            jobs = sorted(
                {m.job for m in rivals if m.start - MTIME_SLACK_NS <= mtime <= (m.end or now)}
            )
            if jobs:
                ambiguous[name] = tuple(jobs)
            else:
                mine.append(name)
        self._changes = RunChanges(tuple(sorted(mine)), ambiguous)
        self._prune(now, self._end(now), markers)
        return self._changes

    def close(self, now_ns: int | None = None) -> str | None:
        """End the run without comparing (idempotent). The closed marker's name when this
        was the last run of its episode."""
        return self._end(now_ns or time.time_ns())

    def _end(self, now: int) -> str | None:
        if self._ended:
            return None
        self._ended = True
        key = os.fspath(self.workspace)
        with _lock:
            here = _local.get(key)
            entry = here.live.pop(self.run_id, None) if here is not None else None
            if here is None or entry is None:
                return None
            run, ep = entry
            run.end = now
            here.ended.append(run)
            ep.live -= 1
            if ep.live > 0:
                if len(here.ended) > here.cap:
                    here.forget_ended()
                return None
            del here.episodes[ep.id]
            if here.current is ep:
                here.current = None
            here.forget_ended()
            if not here.live and not here.episodes:
                del _local[key]  # (its closed markers are then foreign to later runs)
        if not ep.on_disk:
            return None
        closed = f"c-{ep.start}-{now}-{ep.id}-{ep.job}"
        runs = os.path.join(key, RUNS_DIR)
        try:
            os.rename(os.path.join(runs, ep.open_name), os.path.join(runs, closed))
        except OSError:
            return None
        _make_spare(key, runs, now)
        return closed

    def _prune(self, now: int, own: str | None, markers: list[_Marker] | None = None) -> None:
        """Forget ended runs that no living run overlapped, and open markers of runs that
        cannot still be alive: nobody can need them any more."""
        key = os.fspath(self.workspace)
        found = _markers(self.workspace) if markers is None else markers
        with _lock:
            here = _local.get(key)
            living = [m.start for m, _ in here.live.values()] if here is not None else []
            mine = set(here.own) if here is not None else set()
            if here is not None and markers is None:  # own markers someone else pruned
                here.own &= {*here.episodes, *(m.run for m in found)}
        others = [m for m in found if m.run not in mine]
        living += [m.start for m in others if _alive(m, now)]
        horizon = min(living) if living else now + 1
        doomed = [m.name for m in others if (m.end or 0) < horizon and not _alive(m, now)]
        if own is not None and not living:
            doomed.append(own)
        if markers is None:  # (the periodic upkeep) spares nobody took for a long time
            with _lock:
                kept = _spares.get(key)
            doomed += [n for n in _stale_spares(self.workspace, now) if n != kept]
        for name in doomed:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(key, RUNS_DIR, name))


def listing(workspace: Path) -> dict[str, Stamp]:
    """The workspace's top level: name → (size, mtime_ns, inode); symlinks not followed."""
    out: dict[str, Stamp] = {}
    try:
        with os.scandir(workspace) as it:
            for entry in it:
                if entry.name == RUNS_DIR:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                out[entry.name] = (st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        pass
    return out


def begin(workspace: Path, job_id: str) -> RunScope:
    """Register a run as started in ``workspace`` and snapshot its top level."""
    workspace = Path(workspace)
    key = os.fspath(workspace)
    now = time.time_ns()
    job = _safe(job_id)
    run = _Marker("", now, None, f"r{next(_run_ids)}", job)
    with _lock:
        here = _local.get(key)
        if here is None:
            here = _local[key] = _Local()
        ep = here.current
        if ep is None or now - ep.start > ROLL_NS or not _still_there(key, ep):
            ep = here.current = _open_episode(key, now, job)
            here.episodes[ep.id] = ep
            here.own.add(ep.id)
        ep.live += 1
        here.live[run.run] = (run, ep)
    scope = RunScope(workspace, job_id, run.run, now, {})
    scope.before = listing(workspace)
    return scope


def begin_run(settings: Settings, job: JobRow, ctx: dict[str, Any]) -> RunScope:
    """A queued job's run is about to start: ``ctx`` points at the job's own workspace (a
    per-recipient one for third-party channels without a session), and that workspace is
    snapshotted. (Its secret configs join the log filter when the executor takes the run,
    before anything of the run can log.)"""
    root = settings.resolved_workspace_root
    ws = job_workspace(root, job)
    if ws is not None:
        ctx["workspace_dir"] = str(ws)
        return begin(ws, str(job.id))
    # No role, no workspace for the skill; its results are still post-processed in a
    # folder that earlier jobs' downloads may have filled.
    return begin(job_results_dir(root, job), str(job.id))


def _open_episode(key: str, now: int, job: str) -> _Episode:
    """(Called under ``_lock``.) The episode's marker: this workspace's spare renamed, else
    a new file."""
    ep = _Episode(uuid.uuid4().hex[:16], now, job, on_disk=True)
    runs = os.path.join(key, RUNS_DIR)
    target = os.path.join(runs, ep.open_name)
    spare = _spares.pop(key, None)
    if spare is not None:
        try:
            os.rename(os.path.join(runs, spare), target)
            return ep
        except OSError:
            pass  # pruned by another process, or the workspace was removed: write one
    try:
        try:
            fd = os.open(target, _NEW_FILE, 0o644)
        except FileNotFoundError:
            os.makedirs(runs, exist_ok=True)
            fd = os.open(target, _NEW_FILE, 0o644)
        os.close(fd)
    except OSError:
        ep.on_disk = False  # an unwritable workspace: the skill will say so itself
    return ep


def _make_spare(key: str, runs: str, now: int) -> None:
    """A spare marker for the workspace's next episode (off the start path)."""
    evicted: tuple[str, str] | None = None
    with _lock:
        if key in _spares:
            return
        if len(_spares) >= MAX_SPARES:  # the workspace that got its spare longest ago
            evicted = next(iter(_spares.items()))
            del _spares[evicted[0]]
        name = f"s-{now}-{uuid.uuid4().hex[:16]}"
        _spares[key] = name  # (taken before the file exists: one spare per workspace)
    if evicted is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(evicted[0], RUNS_DIR, evicted[1]))
    try:
        os.close(os.open(os.path.join(runs, name), _NEW_FILE, 0o644))
    except OSError:
        with _lock:
            if _spares.get(key) == name:
                del _spares[key]


def _stale_spares(workspace: Path, now: int) -> list[str]:
    try:
        names = os.listdir(os.path.join(workspace, RUNS_DIR))
    except OSError:
        return []
    out = []
    for name in names:
        parts = name.split("-")
        if parts[0] == "s" and len(parts) == 3 and parts[1].isdigit():
            if now - int(parts[1]) > STALE_NS:
                out.append(name)
    return out


def _still_there(key: str, ep: _Episode) -> bool:
    """Is the episode's marker still on disk (a workspace removed meanwhile loses it)?"""
    if not ep.on_disk:
        return False  # try to write one again
    return os.path.exists(os.path.join(key, RUNS_DIR, ep.open_name))


def _markers(workspace: Path) -> list[_Marker]:
    found: list[_Marker] = []
    try:
        names = os.listdir(os.path.join(workspace, RUNS_DIR))
    except OSError:
        return found
    for name in names:
        parts = name.split("-", 4 if name.startswith("c-") else 3)
        try:
            if parts[0] == "o" and len(parts) == 4:
                found.append(_Marker(name, int(parts[1]), None, parts[2], parts[3]))
            elif parts[0] == "c" and len(parts) == 5:
                found.append(_Marker(name, int(parts[1]), int(parts[2]), parts[3], parts[4]))
        except ValueError:
            continue
    return found


def _alive(m: _Marker, now: int) -> bool:
    return m.end is None and now - m.start <= STALE_NS


def _safe(job_id: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]", "_", job_id)[:64]
    return text or "job"
