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
    assert len(os.listdir(ws / RUNS_DIR)) == 1  # one open marker for all of them
    (ws / "out.csv").write_text("written while 50 ran")
    for scope in many:
        assert scope.finish().mine == ()  # each of them overlapped the others
    changes = first.finish()  # the others ended, but overlapped the write
    assert changes.mine == () and set(changes.ambiguous["out.csv"]) >= {"job_1", "job_49"}
    assert os.listdir(ws / RUNS_DIR) == []  # nobody alive needs it any more
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
    assert len(os.listdir(ws / RUNS_DIR)) == 2
    long.finish()
    assert sorted(n[0] for n in os.listdir(ws / RUNS_DIR)) in (["c", "o"], ["o"])
    monkeypatch.setattr(runscope, "ROLL_NS", runscope.STALE_NS)
    for name in os.listdir(ws / RUNS_DIR):
        os.unlink(ws / RUNS_DIR / name)  # e.g. the workspace was cleaned meanwhile
    third = begin(ws, "job-third")
    assert len(os.listdir(ws / RUNS_DIR)) == 1  # other processes see this run again
    (ws / "late.csv").write_text("x")
    assert third.finish().ambiguous == {"late.csv": ("job_later",)}
    later.close()
    assert os.listdir(ws / RUNS_DIR) == [] or all(
        n.startswith("c-") for n in os.listdir(ws / RUNS_DIR)
    )


def test_a_closed_run_ends_once(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    a = begin(ws, "job-a")
    b = begin(ws, "job-b")
    a.close()
    a.close()  # idempotent: b's run still holds the marker open
    assert [n[0] for n in os.listdir(ws / RUNS_DIR)] == ["o"]
    (ws / "b.csv").write_text("b")
    assert b.finish().mine == ("b.csv",)  # a ended before the write
