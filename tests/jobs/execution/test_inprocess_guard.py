"""In-process skills never see or change the host's argv or stdout (SPEC C6): real skill
files written the way the world writes them (argparse, ``sys.argv``, prints, sys.exit)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry, load_skill
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.execution.executor import Executor
from jobs.execution.hostguard import host_argv
from jobs.skill import ExecType, Skill
from tests.helpers.settings import make_settings

KEY = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
CTX = {"role_id": "r1", "session_id": "s1", "org_id": "o1", "channel": "web"}

# argparse inside the entry, no __main__ block: the loader keeps it in-process, and
# parse_args() reads the command line it was given.
ARGPARSE_SKILL = """
import argparse

def run(input_data):
    parser = argparse.ArgumentParser(description="count words")
    parser.add_argument("--text", required=True)
    args = parser.parse_args()
    return {"message": f"{len(args.text.split())} words"}
"""
# reads the command line the way libraries do (through argparse, parse_known_args)
SEES_ARGV = """
import argparse

def run(input_data):
    parser = argparse.ArgumentParser()
    _, rest = parser.parse_known_args()
    print("looking at my command line")
    return {"prog": parser.prog, "rest": rest}
"""
# replaces and mutates the command line, then waits, so that runs overlap on the loop
REWRITES_ARGV = """
import asyncio
import importlib

async def execute(input_data, runtime_context):
    s = importlib.import_module("sys")
    s.argv.append("--mutated")
    first = list(s.argv)
    s.argv = ["tool", input_data["tag"]]
    await asyncio.sleep(0.05)
    return {"first": first, "later": list(s.argv)}
"""
SYNC_REWRITES = """
import importlib
import time

def run(input_data):
    s = importlib.import_module("sys")
    s.argv[:] = ["sync", input_data["tag"]]
    time.sleep(0.05)
    return {"later": list(s.argv)}
"""
EXITS = """
import sys

def run(input_data):
    print("checking input")
    sys.exit("no input file given")
"""

ASYNC_EXITS = """
import sys

async def execute(input_data, runtime_context):
    print("checking input")
    sys.exit("no input file given")
"""


def _skill(tmp_path: Path, name: str, body: str) -> Skill:
    folder = tmp_path / "skills" / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {name}\n---\n# {name}\n")
    (folder / "handler.py").write_text(textwrap.dedent(body))
    skill = load_skill(folder)
    assert skill.error is None and skill.exec_type is ExecType.PYTHON, skill.cli_reason
    return skill


@pytest.fixture
async def ex(tmp_path: Path, sqlite_url: str):  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path, redis_url=None, prefix="t")
    engine = create_engine(sqlite_url)
    executor = Executor(
        settings=settings,
        registry=load_registry([]),
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(KEY),
    )
    yield executor
    await executor.aclose()
    await engine.dispose()


async def test_argparse_error_in_process_is_a_clean_failure(
    ex: Executor, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = list(sys.argv)
    skill = _skill(tmp_path, "word_count", ARGPARSE_SKILL)
    out = await ex.execute(skill, {"text": "a b c"}, dict(CTX))
    assert out.status == "failed"
    assert out.result["error_type"] == "config" and out.result["non_retriable"] is True
    assert "the following arguments are required: --text" in (out.error or "")
    assert out.result["user_message"].endswith(
        "error: the following arguments are required: --text"
    )
    assert "usage: handler.py" in out.log  # argparse's usage went into the run's log
    assert sys.argv == before
    printed = capfd.readouterr()
    assert "usage:" not in printed.out + printed.err  # nothing reached the host's streams
    # the worker lives on: the next run of another skill works
    other = _skill(tmp_path, "sees_argv", SEES_ARGV)
    assert (await ex.execute(other, {}, dict(CTX))).status == "succeeded"


@pytest.mark.parametrize("body", [EXITS, ASYNC_EXITS], ids=["sync", "async"])
async def test_sys_exit_reason_is_the_failure(ex: Executor, tmp_path: Path, body: str) -> None:
    out = await ex.execute(_skill(tmp_path, "exits", body), {}, dict(CTX))
    assert out.status == "failed" and "no input file given" in (out.error or "")
    assert "checking input" in out.log


async def test_skill_sees_only_its_own_script_path(
    ex: Executor, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    sys.argv.append("--host-only-flag")
    try:
        out = await ex.execute(_skill(tmp_path, "sees_argv", SEES_ARGV), {}, dict(CTX))
    finally:
        sys.argv.remove("--host-only-flag")
    assert out.status == "succeeded", out.error
    assert out.result["prog"] == "handler.py" and out.result["rest"] == []
    assert "looking at my command line" in out.log
    assert "looking at my command line" not in capfd.readouterr().out


async def test_overlapping_runs_keep_their_own_argv_and_the_host_keeps_its(
    ex: Executor, tmp_path: Path
) -> None:
    before = list(sys.argv)
    encoding = sys.stdout.encoding
    rewrites = _skill(tmp_path, "rewrites", REWRITES_ARGV)
    sync = _skill(tmp_path, "sync_rewrites", SYNC_REWRITES)
    runs = [
        asyncio.ensure_future(ex.execute(rewrites, {"tag": "one"}, dict(CTX))),
        asyncio.ensure_future(ex.execute(rewrites, {"tag": "two"}, dict(CTX))),
        asyncio.ensure_future(ex.execute(sync, {"tag": "three"}, dict(CTX))),
    ]
    await asyncio.sleep(0.02)
    assert sys.argv == before and host_argv() is sys.argv  # while they run
    assert sys.stdout.encoding == encoding  # the host's streams behave as they did
    print("the host still prints", file=sys.stdout)
    one, two, three = await asyncio.gather(*runs)
    handler = str(rewrites.entry)
    assert one.result["first"] == [handler, "--mutated"]
    assert one.result["later"] == ["tool", "one"]
    assert two.result["first"] == [handler, "--mutated"]
    assert two.result["later"] == ["tool", "two"]
    assert three.result["later"] == ["sync", "three"]
    assert sys.argv == before and "--mutated" not in sys.argv
    assert all("the host still prints" not in r.log for r in (one, two, three))


async def test_a_script_with_a_main_block_that_exits_still_runs_as_cli(
    ex: Executor, tmp_path: Path
) -> None:
    body = """
    import json, os, sys
    def main(input_data=None):
        sys.exit("use the command line")
    if __name__ == "__main__":
        print(json.dumps({"ran_as": "cli", "input": json.loads(os.environ["SKILL_INPUT"])}))
    """
    out = await ex.execute(_skill(tmp_path, "cli_after_all", body), {"q": 1}, dict(CTX))
    assert out.status == "succeeded" and out.result["ran_as"] == "cli"
