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
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.context import job_results_dir, job_workspace, secret_values
from jobs.logs import register_secrets

RUNS_DIR = ".skilljobs-runs"
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
        return self.workspace / RUNS_DIR / f"{self.run_id}.json"

    def finish(self) -> RunChanges:
        """Compare the workspace with the snapshot and close the marker (once; later calls
        return the same answer)."""
        if self._changes is not None:
            return self._changes
        now = time.time_ns()
        others = [o for o in _markers(self.workspace, now) if o["run"] != self.run_id]
        mine: list[str] = []
        ambiguous: dict[str, tuple[str, ...]] = {}
        for name, stamp in listing(self.workspace).items():
            if self.before.get(name) == stamp:
                continue
            mtime = stamp[1]
            rivals = tuple(
                sorted(
                    {
                        str(o["job"])
                        for o in others
                        if int(o["start"]) <= mtime <= int(o.get("end") or now)
                    }
                )
            )
            if rivals:
                ambiguous[name] = rivals
            else:
                mine.append(name)
        self._changes = RunChanges(tuple(sorted(mine)), ambiguous)
        self.close(now)
        return self._changes

    def close(self, now_ns: int | None = None) -> None:
        """Record the run's end on its marker (idempotent, best effort)."""
        with contextlib.suppress(OSError):
            data = {"run": self.run_id, "job": self.job_id, "start": self.started_ns}
            data["end"] = now_ns or time.time_ns()
            _write(self.marker, data)


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
        _prune(workspace, now)
        _write(scope.marker, {"run": scope.run_id, "job": job_id, "start": now, "end": None})
    except OSError:
        pass  # an unwritable workspace: the skill will say so itself
    scope.before = listing(workspace)
    return scope


def begin_run(settings: Any, job: Any, ctx: dict[str, Any]) -> RunScope:
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


def _markers(workspace: Path, now: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    try:
        with os.scandir(workspace / RUNS_DIR) as it:
            for entry in it:
                if not entry.name.endswith(".json"):
                    continue
                try:
                    with open(entry.path, encoding="utf-8") as fh:
                        data = json.load(fh)
                except (OSError, ValueError):
                    continue
                if not isinstance(data, dict) or not isinstance(data.get("start"), int):
                    continue
                if data.get("end") is None and now - data["start"] > STALE_NS:
                    continue
                found.append(data)
    except OSError:
        pass
    return found


def _prune(workspace: Path, now: int) -> None:
    with os.scandir(workspace / RUNS_DIR) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime_ns > STALE_NS:
                    os.unlink(entry.path)


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)
