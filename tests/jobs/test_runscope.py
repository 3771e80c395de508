"""Run scopes: this process's runs of one workspace share one marker (an episode) and see
each other exactly; other processes see the episode's marker. Real files, a real second
process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import runscope
from jobs.runscope import RUNS_DIR, begin


def markers(ws: Path) -> list[str]:
    """The markers in ``ws`` (not this process's spare files)."""
    return sorted(n for n in os.listdir(ws / RUNS_DIR) if not n.startswith("s-"))


HOLDER = """
import sys, time
from pathlib import Path
from jobs.runscope import begin
scope = begin(Path(sys.argv[1]), "job-other")
print("started", flush=True)
sys.stdin.readline()
print(scope.finish().mine, flush=True)
"""


def test_overlapping_runs_of_one_process_write_one_marker(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    first = begin(ws, "job-0")
    many = [begin(ws, f"job-{i}") for i in range(1, 50)]
    assert len(markers(ws)) == 1  # one open marker for all of them
    (ws / "out.csv").write_text("written while 50 ran")
    for scope in many:
        assert scope.finish().mine == ()  # each of them overlapped the others
    changes = first.finish()  # the others ended, but overlapped the write
    assert changes.mine == () and set(changes.ambiguous["out.csv"]) >= {"job_1", "job_49"}
    assert markers(ws) == []  # nobody alive needs it any more
    alone = begin(ws, "job-alone")
    (ws / "mine.csv").write_text("only this run")
    assert alone.finish().mine == ("mine.csv",)


def test_a_run_of_another_process_makes_a_write_ambiguous(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    root = Path(__file__).resolve().parents[2]
    other = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(ws)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    try:
        assert other.stdout is not None and other.stdin is not None
        assert other.stdout.readline().strip() == "started"
        here = begin(ws, "job-here")
        (ws / "who.csv").write_text("this run or the other process's?")
        assert here.finish().ambiguous == {"who.csv": ("job_other",)}
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "()"  # who.csv: ambiguous there too
    finally:
        other.kill()
        other.wait()
    later = begin(ws, "job-later")
    (ws / "later.csv").write_text("after the other process's run ended")
    assert later.finish().mine == ("later.csv",)


def test_an_episode_rolls_over_and_a_lost_marker_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    long = begin(ws, "job-long")
    monkeypatch.setattr(runscope, "ROLL_NS", 0)
    time.sleep(0.001)
    later = begin(ws, "job-later")  # the first episode takes no new runs
    assert len(markers(ws)) == 2
    long.finish()
    assert sorted(n[0] for n in markers(ws)) in (["c", "o"], ["o"])
    monkeypatch.setattr(runscope, "ROLL_NS", runscope.STALE_NS)
    for name in os.listdir(ws / RUNS_DIR):
        os.unlink(ws / RUNS_DIR / name)  # e.g. the workspace was cleaned meanwhile
    third = begin(ws, "job-third")
    assert len(markers(ws)) == 1  # other processes see this run again
    (ws / "late.csv").write_text("x")
    assert third.finish().ambiguous == {"late.csv": ("job_later",)}
    later.close()
    assert markers(ws) == [] or all(n.startswith("c-") for n in markers(ws))


def test_a_closed_run_ends_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    a = begin(ws, "job-a")
    b = begin(ws, "job-b")
    a.close()
    a.close()  # idempotent: b's run still holds the marker open
    assert [n[0] for n in markers(ws)] == ["o"]
    (ws / "b.csv").write_text("b")
    assert b.finish().mine == ("b.csv",)  # a ended before the write


def test_the_next_episodes_marker_is_a_spare_renamed(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    begin(ws, "job-first").finish()
    (spare,) = [n for n in os.listdir(ws / RUNS_DIR) if n.startswith("s-")]
    spare_inode = os.stat(ws / RUNS_DIR / spare).st_ino
    second = begin(ws, "job-second")
    (marker,) = [n for n in markers(ws) if n.startswith("o-")]
    assert marker.endswith("-job_second") and not (ws / RUNS_DIR / spare).exists()
    assert os.stat(ws / RUNS_DIR / marker).st_ino == spare_inode  # renamed, not created
    assert int(marker.split("-")[1]) == second.started_ns  # the episode's own start
    second.finish()
    # a spare someone removed meanwhile: the marker is written as before
    for name in os.listdir(ws / RUNS_DIR):
        os.unlink(ws / RUNS_DIR / name)
    third = begin(ws, "job-third")
    assert [n[0] for n in markers(ws)] == ["o"]
    (ws / "third.csv").write_text("x")
    assert third.finish().mine == ("third.csv",)


def test_spares_nobody_took_are_pruned_when_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    (ws / RUNS_DIR).mkdir(parents=True)
    old = time.time_ns() - runscope.STALE_NS - 1
    (ws / RUNS_DIR / f"s-{old}-0123456789abcdef").write_text("")  # a dead process's
    fresh = f"s-{time.time_ns()}-fedcba9876543210"
    (ws / RUNS_DIR / fresh).write_text("")  # a living process's, idle for a while
    monkeypatch.setattr(runscope, "PRUNE_EVERY", 1)  # the periodic upkeep at every run
    begin(ws, "job-quiet").finish()
    left = os.listdir(ws / RUNS_DIR)
    assert fresh in left and not any(n.startswith(f"s-{old}") for n in left)


def test_spares_are_kept_for_the_latest_workspaces_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runscope, "MAX_SPARES", 2)
    monkeypatch.setattr(runscope, "_spares", {})
    spaces = [tmp_path / f"ws{i}" for i in range(3)]
    for ws in spaces:
        ws.mkdir()
        begin(ws, "job-x").finish()
    spares = [[n for n in os.listdir(ws / RUNS_DIR) if n.startswith("s-")] for ws in spaces]
    assert [len(found) for found in spares] == [0, 1, 1]  # the first one's was removed
    assert list(runscope._spares) == [os.fspath(ws) for ws in spaces[1:]]
