"""Redis URLs an operator gives: plain, TLS and Sentinel (against a real redis-server sentinel)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.cli.embedded import free_port
from jobs.constants import FN_RUN_JOB
from jobs.queue import broker
from jobs.services import Services, redis_settings
from tests.helpers.settings import make_settings

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def test_url_forms() -> None:
    plain = redis_settings("redis://:pw@cache:6380/2")
    assert (plain.host, plain.port, plain.database, plain.password) == ("cache", 6380, 2, "pw")
    assert redis_settings("rediss://cache:6380/0").ssl is True
    s = redis_settings("redis+sentinel://:p%40ss@s1:26379,s2:26380/prod-master/3")
    assert s.sentinel and s.sentinel_master == "prod-master"
    assert s.host == [("s1", 26379), ("s2", 26380)]
    assert (s.database, s.password) == (3, "p@ss")
    assert redis_settings("redis+sentinel://s1/m").host == [("s1", 26379)]
    with pytest.raises(ValueError, match="names its sentinels and master"):
        redis_settings("redis+sentinel://s1:26379")


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert proc.poll() is None
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[str]:
    """A Redis master and one sentinel watching it; the Sentinel URL."""
    if not Path(REDIS_SERVER).exists():
        pytest.skip("redis-server is not installed")
    master, watcher = free_port(), free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {watcher}\nbind 127.0.0.1\n"
        f"sentinel monitor skj 127.0.0.1 {master} 1\n"
        "sentinel down-after-milliseconds skj 5000\n"
    )
    procs = [
        subprocess.Popen(
            [REDIS_SERVER, "--port", str(master), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL,
        ),
        subprocess.Popen([REDIS_SERVER, str(conf), "--sentinel"], stdout=subprocess.DEVNULL),
    ]  # fmt: skip
    try:
        _wait_port(master, procs[0])
        _wait_port(watcher, procs[1])
        yield f"redis+sentinel://127.0.0.1:{watcher}/skj/0"
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


async def test_sentinel_url_reaches_the_master(sentinel: str, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, redis_url=sentinel, prefix=f"sent{time.time_ns()}")
    svc = await Services.open(settings)  # connects to Redis through the sentinel
    try:
        assert svc.redis is not None
        assert await broker.enqueue(svc, FN_RUN_JOB, "job-1", 0, job_id="job-1:0")
        assert await broker.waiting(svc, ["job-1:0"]) == [True]
        info = await svc.redis.info("replication")
        assert info["role"] == "master"
    finally:
        await svc.close()
