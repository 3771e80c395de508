"""The distribution as a user gets it: a wheel built from the checkout, installed into a
throw-away virtualenv, run from a directory with no checkout in sight."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from jobs.cli.embedded import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def test_package_list_is_complete() -> None:
    """Every package folder of ours is listed in pyproject.toml (a missing one would be
    absent from the wheel while the checkout still works)."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for pkg in ("jobs", "chains", "delivery", "dashboard")
        for p in (ROOT / pkg).rglob("__init__.py")
    }
    assert found - listed == set()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the built wheel (not editable). Its dependencies come from this test
    environment's site-packages through a path file, which does not carry our own code."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(tmp / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("skilljobs-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = Path(
        subprocess.check_output(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            text=True,
        ).strip()
    )
    (target / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inst.returncode == 0, inst.stderr[-3000:]
    return venv


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLJOBS_", "PYTHON"))}
    env["SKILLJOBS_DATA_DIR"] = str(home / "data")
    env["SKILLJOBS_WORKER_GRACE_SEC"] = "3"
    return env


def _run(venv: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "skilljobs"), *args],
        cwd=home,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    home.mkdir()
    where = subprocess.check_output(
        [str(installed / "bin" / "python"), "-c", "import jobs; print(jobs.__file__)"],
        cwd=home,
        env=_env(home),
        text=True,
    )
    assert not where.startswith(str(ROOT)), "the checkout leaked into the installed venv"
    hook = Path(where.strip()).parent / "execution" / "node_paths.mjs"
    assert hook.is_file(), "the Node ES-module resolve hook is missing from the wheel"

    version = _run(installed, home, "--version")
    assert version.returncode == 0 and re.match(r"skilljobs \d", version.stdout), version

    up = _run(installed, home, "db", "upgrade")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "database at revision" in up.stdout

    listed = _run(installed, home, "skills", "list")
    assert listed.returncode == 0, listed.stderr
    for name in ("echo", "notify", "send_message", "sales_report", "word_count"):
        assert name in listed.stdout


@pytest.mark.slow
def test_wheel_runs_the_demo(installed: Path, tmp_path: Path) -> None:
    home = tmp_path / "demo"
    home.mkdir()
    port = free_port()
    log = home / "up.log"
    proc = subprocess.Popen(
        [str(installed / "bin" / "skilljobs"), "up", "--port", str(port)],
        cwd=home,
        env=_env(home),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        token = ""
        while time.monotonic() < deadline and not token:
            assert proc.poll() is None, log.read_text()
            m = re.search(r"API token : (\S+)", log.read_text())
            if m:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                        token = m.group(1)
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        assert token, log.read_text()
        banner = log.read_text()
        cmd = re.search(r"^\s+\S*skilljobs (dispatch .+)$", banner, re.M).group(1)
        done = subprocess.run(
            [str(installed / "bin" / "skilljobs"), *_split(cmd)],
            cwd=home,
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "succeeded" in done.stdout
        msgs = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/sessions/demo/messages",
            headers={"Authorization": f"Bearer {token}"},
        ).json()["items"]
        assert any("Sales report" in m["text"] for m in msgs)
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def _split(cmd: str) -> list[str]:
    import shlex

    return shlex.split(cmd)
