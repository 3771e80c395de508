"""The sandbox seam (jobs.execution.sandbox): trust per skills path, fail closed, limits,
the workspace quota, and a skill's processes dying with their worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry
from jobs.execution import sandbox
from jobs.execution.executor import Executor
from jobs.settings import BUNDLED_SKILLS
from tests.helpers.settings import make_settings

CTX = {"channel": "web", "role_id": "r1", "session_id": "s1", "actor_key": "u1"}
BWRAP = pytest.mark.skipif(sandbox.Sandbox().problem() is not None, reason="no bubblewrap here")


def skill_folder(root: Path, name: str, script: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: sandbox test skill\n"
        "exec:\n  primary: {type: shell, entry: run.sh}\n---\n"
    )
    (folder / "run.sh").write_text("#!/bin/sh\n" + textwrap.dedent(script))
    return folder


# --- trust ---------------------------------------------------------------------------------


def test_trust_is_the_operator_s_word_per_skills_path(tmp_path: Path) -> None:
    own, market, listed = tmp_path / "own", tmp_path / "market", tmp_path / "listed"
    path = os.pathsep.join(["bundled", f"trusted={own}", str(market)])
    s = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=path)
    assert s.skill_dirs == [BUNDLED_SKILLS, own, market]
    assert sandbox.trust(own / "a", s) == (True, f"under the trusted path {own}")
    assert sandbox.trust(BUNDLED_SKILLS / "x", s) == (True, "a bundled skill")
    assert sandbox.trust(market / "b", s)[0] is False
    assert sandbox.trust(tmp_path / "ownx" / "c", s)[0] is False  # a prefix is not a parent
    s = make_settings(
        tmp_path, redis_url=None, prefix="t", skills_path=str(market), trusted_skills=str(listed)
    )
    assert sandbox.trust(listed / "d", s)[0] is True
    assert sandbox.trust(market / "b", s)[0] is False
    s = make_settings(tmp_path, redis_url=None, prefix="t", sandbox="none")
    assert sandbox.trust(market / "b", s) == (
        True,
        "SKILLJOBS_SANDBOX=none: every skill is trusted",
    )


def test_an_unknown_network_mode_is_refused() -> None:
    with pytest.raises(sandbox.SandboxUnavailable, match="SKILLJOBS_SANDBOX_NETWORK"):
        sandbox.Sandbox(network="host")


def test_a_missing_bubblewrap_says_what_to_install() -> None:
    box = sandbox.Sandbox(bwrap="")
    box.bwrap = None
    assert "apt-get install bubblewrap" in (box.problem() or "")


# --- fail closed ----------------------------------------------------------------------------


@pytest.mark.integration
async def test_an_untrusted_skill_is_refused_when_the_sandbox_cannot_start(tmp_path: Path) -> None:
    """Never run as the worker: ``error_type: config`` naming what to install; a trusted
    skill runs as the worker all the same."""
    market, own = tmp_path / "market", tmp_path / "own"
    skill_folder(market, "untrusted", 'echo "{\\"uid\\": $(id -u)}"\n')
    skill_folder(own, "mine", 'echo "{\\"uid\\": $(id -u)}"\n')
    path = os.pathsep.join([str(market), f"trusted={own}"])
    settings = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=path)
    ex = Executor(
        settings=settings, registry=load_registry([market, own]), sessionmaker=None, box=None
    )
    broken = sandbox.Sandbox()
    broken.bwrap = None  # as on a host without bubblewrap
    ex._sandbox = broken
    try:
        out = await ex.execute("untrusted", {}, dict(CTX))
        assert out.status == "failed" and out.result["error_type"] == "config", out.result
        assert "not trusted" in (out.error or "") and "bubblewrap" in (out.error or "")
        assert out.stdout == "" and out.stderr == ""  # it never started
        mine = await ex.execute("mine", {}, dict(CTX))
        assert mine.status == "succeeded" and mine.result["uid"] == os.getuid(), mine.result
    finally:
        await ex.aclose()


# --- limits ---------------------------------------------------------------------------------


@BWRAP
@pytest.mark.integration
@pytest.mark.slow
async def test_limits_and_the_workspace_quota_stop_a_run_with_a_reason(tmp_path: Path) -> None:
    market = tmp_path / "market"
    skill_folder(
        market,
        "big_file",
        'head -c 3000000 /dev/zero > "$SKILL_WORKSPACE/big.bin" || exit 3\necho \'{"ok": true}\'\n',
    )
    skill_folder(
        market,
        "fills_ws",
        'for i in 1 2 3; do head -c 900000 /dev/zero > "$SKILL_WORKSPACE/f$i.bin"; done\n'
        "echo '{\"ok\": true}'\n",
    )
    skill_folder(market, "fills_tmp", "head -c 3000000 /dev/zero > /tmp/x || exit 4\necho '{}'\n")
    skill_folder(
        market,
        "eats_memory",
        "python3 -c 'x = bytearray(300 * 1024 * 1024)' 2>/dev/null || exit 5\necho '{}'\n",
    )
    settings = make_settings(
        tmp_path,
        redis_url=None,
        prefix="t",
        skills_path=str(market),
        sandbox_fsize_mb=2,
        sandbox_workspace_mb=2,
        sandbox_tmp_mb=1,
        sandbox_memory_mb=100,
    )
    ex = Executor(settings=settings, registry=load_registry([market]), sessionmaker=None, box=None)
    try:
        out = await ex.execute("big_file", {}, dict(CTX))
        assert out.status == "failed" and out.result.get("exit_code") == 3, out.result
        out = await ex.execute("fills_ws", {}, dict(CTX))
        assert out.status == "failed", out.result
        assert "quota of 2 MB" in (out.error or "") and "SKILLJOBS_SANDBOX_WORKSPACE_MB" in (
            out.error or ""
        )
        again = await ex.execute("big_file", {}, dict(CTX))  # over already: not this run's doing
        assert again.result.get("exit_code") == 3, again.result
        out = await ex.execute("fills_tmp", {}, dict(CTX, session_id="s2"))
        assert out.status == "failed" and out.result.get("exit_code") == 4, out.result
        out = await ex.execute("eats_memory", {}, dict(CTX, session_id="s3"))
        assert out.status == "failed" and out.result.get("exit_code") == 5, out.result
    finally:
        await ex.aclose()


# --- a skill dies with its worker ------------------------------------------------------------

WORKER = """
import asyncio, sys
from pathlib import Path
from jobs.catalog.loader import load_registry
from jobs.execution.executor import Executor
from tests.helpers.settings import make_settings

tmp, path, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
settings = make_settings(tmp, redis_url=None, prefix="t", skills_path=path)
roots = [Path(p.removeprefix("trusted=")) for p in path.split(":")]
ex = Executor(settings=settings, registry=load_registry(roots), sessionmaker=None, box=None)
asyncio.run(ex.execute(name, {}, {"channel": "web", "role_id": "r1", "session_id": "s1"}))
"""


def _alive(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found


def _wait(cond, limit: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.integration
@pytest.mark.chaos
@pytest.mark.parametrize("trusted", [False, True], ids=["sandboxed", "trusted"])
def test_a_skill_s_processes_die_with_a_killed_worker(tmp_path: Path, trusted: bool) -> None:
    """kill -9 of the worker: a sandboxed skill and everything it started (setsid included)
    die with it (the pid namespace); a trusted skill's process by its parent-death signal."""
    if not trusted and sandbox.Sandbox().problem() is not None:
        pytest.skip("no bubblewrap here")
    token = f"{int(time.time() * 1000) % 10**8}"
    market = tmp_path / "skills"
    if trusted:  # the process the worker started: it gets the parent-death signal
        script = f"exec sleep 40.{token}\n"
    else:  # and, sandboxed, whatever it starts, in a new session or not
        script = f"setsid sleep 41.{token} &\nsleep 42.{token} &\nwait\n"
    skill_folder(market, "long", script)
    path = f"trusted={market}" if trusted else str(market)
    root = Path(__file__).resolve().parents[3]
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(tmp_path), path, "long"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        want = 1 if trusted else 2
        # the worker process starts, imports, claims and spawns first: seconds on a busy host
        assert _wait(lambda: len(_alive(f".{token}")) >= want, 60), _alive(f".{token}")
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert _wait(lambda: not _alive(f".{token}")), _alive(f".{token}")
    finally:
        worker.kill()
        worker.wait()
        for pid in _alive(f".{token}"):
            os.kill(pid, signal.SIGKILL)


# --- doctor ---------------------------------------------------------------------------------


@pytest.mark.integration
def test_doctor_says_whether_untrusted_skills_can_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.cli.checks import Status, check_sandbox

    market = tmp_path / "market"
    skill_folder(market, "one", "echo '{}'\n")
    settings = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=f"bundled:{market}")
    if sandbox.Sandbox().problem() is None:
        got = check_sandbox(settings)
        assert got.status is Status.OK and "1 skill(s) sandboxed" in got.detail, got
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no bwrap to be found
    got = check_sandbox(settings)
    assert got.status is Status.FAIL and "untrusted skills are refused" in got.detail, got
    assert "bubblewrap" in got.detail
    none = make_settings(tmp_path, redis_url=None, prefix="t", sandbox="none")
    assert check_sandbox(none).status is Status.WARN


def test_skills_check_names_in_process_handlers_of_untrusted_paths(tmp_path: Path) -> None:
    """They run in the sandbox (the runner), never inside the worker: reported as such."""
    from jobs.catalog.loader import load_skill

    market, own = tmp_path / "market", tmp_path / "own"
    for root in (market, own):
        folder = root / "handler_skill"
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text("---\nname: handler_skill\ndescription: d\n---\n# h\n")
        (folder / "handler.py").write_text("def execute(input_data, ctx):\n    return {}\n")
    skill_folder(market, "script_skill", "echo '{}'\n")
    s = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=f"{market}:trusted={own}")
    assert sandbox.run_mode(load_skill(market / "handler_skill"), s) == (
        "sandboxed",
        sandbox.IN_PROCESS_REASON,
    )
    assert sandbox.run_mode(load_skill(own / "handler_skill"), s)[0] == "trusted"
    assert sandbox.run_mode(load_skill(market / "script_skill"), s)[0] == "sandboxed"
