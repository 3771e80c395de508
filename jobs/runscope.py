"""What one run of a skill changed in its workspace.

When a run starts, the workspace's top level is listed (name, size, mtime_ns, inode) and a
marker for the run is written under ``.skilljobs-runs/``; when it ends, the listing is
compared and the markers of other runs tell whether someone else was writing there too.
A file that appeared or changed while another run of the same workspace was also alive is
attributed to neither run. Markers live in the workspace itself, so runs in different
worker processes (or hosts sharing the volume) see each other.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.context import job_results_dir, job_workspace, secret_values
from jobs.logs import register_secrets
from jobs.models import JobRow

RUNS_DIR = ".skilljobs-runs"
PRUNE_EVERY = 16  # runs that changed nothing prune the markers this seldom
_quiet_runs = itertools.count(1)
# A marker older than the longest possible run (hard wall clock cap + margin) is stale: its
# worker died without closing it.
STALE_NS = (1800 + 600) * 1_000_000_000

Stamp = tuple[int, int, int]  # size, mtime_ns, inode


@dataclass(frozen=True, slots=True)
class RunChanges:
    """Top-level names this run created or changed (``mine``), and those created or changed
    while another run of the workspace was alive (``ambiguous``, name → the other job ids)."""

    mine: tuple[str, ...] = ()
    ambiguous: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class RunScope:
    """One run of a skill in one workspace, from its first to its last moment."""

    workspace: Path
    job_id: str
    run_id: str
    started_ns: int
    before: dict[str, Stamp]
    _changes: RunChanges | None = None

    @property
    def marker(self) -> Path:
        """``o-<start ns>-<run>-<job>`` while the run lives; renamed to
        ``c-<start ns>-<end ns>-<run>-<job>`` when it ends. Everything is in the name: a
        listing of the folder is all another run reads."""
        return self.workspace / RUNS_DIR / f"o-{self.started_ns}-{self.run_id}-{_safe(self.job_id)}"

    def finish(self) -> RunChanges:
        """Compare the workspace with the snapshot and close the marker (once; later calls
        return the same answer)."""
        if self._changes is not None:
            return self._changes
        now = time.time_ns()
        # Files first, then markers: a run whose writes are in this listing made its
        # marker before them, so it is in the marker listing below.
        current = listing(self.workspace)
        if all(self.before.get(name) == stamp for name, stamp in current.items()):
            # Nothing new to attribute: close the marker (other runs still see that this
            # one overlapped them) and leave the markers' upkeep to every PRUNE_EVERY-th
            # such run — listing them all on every run costs O(concurrent runs).
            self._changes = RunChanges((), {})
            closed = self.close(now)
            if next(_quiet_runs) % PRUNE_EVERY == 0:
                others = [m for m in _markers(self.workspace, now) if m.run != self.run_id]
                _prune(self.workspace, others, now, closed)
            return self._changes
        markers = [m for m in _markers(self.workspace, now) if m.run != self.run_id]
        # an open marker older than any run can last: its worker died without closing it
        others = [m for m in markers if m.end is not None or _alive(m, now)]
        mine: list[str] = []
        ambiguous: dict[str, tuple[str, ...]] = {}
        for name, stamp in current.items():
            if self.before.get(name) == stamp:
                continue
            mtime = stamp[1]
            rivals = sorted({m.job for m in others if m.start <= mtime <= (m.end or now)})
            if rivals:
                ambiguous[name] = tuple(rivals)
            else:
                mine.append(name)
        self._changes = RunChanges(tuple(sorted(mine)), ambiguous)
        _prune(self.workspace, markers, now, self.close(now))
        return self._changes

    def close(self, now_ns: int | None = None) -> str | None:
        """Record the run's end on its marker (idempotent, best effort); the closed name."""
        end = now_ns or time.time_ns()
        closed = f"c-{self.started_ns}-{end}-{self.run_id}-{_safe(self.job_id)}"
        try:
            os.rename(self.marker, self.marker.with_name(closed))
        except OSError:
            return None
        return closed


@dataclass(frozen=True, slots=True)
class _Marker:
    name: str
    start: int
    end: int | None
    run: str
    job: str


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
    """Mark a run as started in ``workspace`` and snapshot its top level."""
    workspace = Path(workspace)
    now = time.time_ns()
    scope = RunScope(workspace, job_id, uuid.uuid4().hex[:16], now, {})
    try:
        (workspace / RUNS_DIR).mkdir(parents=True, exist_ok=True)
        with open(scope.marker, "x"):
            pass
    except OSError:
        pass  # an unwritable workspace: the skill will say so itself
    scope.before = listing(workspace)
    return scope


def begin_run(settings: Any, job: JobRow, ctx: dict[str, Any]) -> RunScope:
    """A queued job's run is about to start: its secret configs join the log filter,
    ``ctx`` points at the job's own workspace (a per-recipient one for third-party
    channels without a session), and that workspace is snapshotted."""
    register_secrets(secret_values(ctx, str(job.skill)))
    root = settings.resolved_workspace_root
    ws = job_workspace(root, job)
    if ws is not None:
        ctx["workspace_dir"] = str(ws)
        return begin(ws, str(job.id))
    # No role, no workspace for the skill; its results are still post-processed in a
    # folder that earlier jobs' downloads may have filled.
    return begin(job_results_dir(root, job), str(job.id))


def _markers(workspace: Path, now: int) -> list[_Marker]:
    found: list[_Marker] = []
    try:
        names = os.listdir(workspace / RUNS_DIR)
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


def _prune(workspace: Path, others: list[_Marker], now: int, own: str | None) -> None:
    """Forget ended runs that no living run overlapped, and open markers of runs that
    cannot still be alive: nobody can need them any more."""
    living = [m.start for m in others if m.end is None and now - m.start <= STALE_NS]
    horizon = min(living) if living else now + 1
    doomed = [m.name for m in others if (m.end or 0) < horizon and not _alive(m, now)]
    if own is not None and not living:
        doomed.append(own)
    for name in doomed:
        with contextlib.suppress(OSError):
            os.unlink(workspace / RUNS_DIR / name)


def _alive(m: _Marker, now: int) -> bool:
    return m.end is None and now - m.start <= STALE_NS


def _safe(job_id: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]", "_", job_id)[:64]
    return text or "job"
