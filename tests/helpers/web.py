"""A real ``skilljobs web`` process for the HTTP-surface tests, and raw-socket clients that
behave the way hostile ones do (huge bodies, half-open connections)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from jobs.cli.embedded import free_port

TOKEN = "web-token-0123456789abcdef0123456789abcdef"


class WebProcess:
    """``python -m jobs.cli.app web`` on a free loopback port (SQLite + the test Redis),
    without sync-line executor processes unless ``env`` asks for them."""

    def __init__(
        self,
        tmp_path: Path,
        database_url: str,
        redis_url: str,
        prefix: str,
        *,
        env: dict[str, str] | None = None,
        nofile: int | None = None,
        nofile_hard: int | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"web-{self.port}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
        base.update(
            {
                "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
                "SKILLJOBS_DATABASE_URL": database_url,
                "SKILLJOBS_REDIS_URL": redis_url,
                "SKILLJOBS_REDIS_PREFIX": prefix,
                "SKILLJOBS_QUEUE_NAME": f"{prefix}:queue",
                "SKILLJOBS_API_TOKEN": TOKEN,
                # no sync-line executor processes (two more interpreters to start) unless
                # the test is about them
                "SKILLJOBS_SYNC_PROCESSES": "0",
            }
        )
        base.update(env or {})
        self.env = base
        self.cwd = tmp_path
        self.nofile = nofile
        self.nofile_hard = nofile_hard
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        args = ["web", "--port", str(self.port)]
        if self.nofile is None:
            return [sys.executable, "-m", "jobs.cli.app", *args]
        # A low soft descriptor limit, as on many hosts (the server raises it itself).
        boot = (
            "import resource, runpy, sys\n"
            f"hard = {self.nofile_hard} or resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({self.nofile}, hard))\n"
            f"sys.argv = ['skilljobs', *{args!r}]\n"
            "runpy.run_module('jobs.cli.app', run_name='__main__')\n"
        )
        return [sys.executable, "-c", boot]

    def __enter__(self) -> WebProcess:
        self.proc = subprocess.Popen(
            self.argv(),
            cwd=self.cwd,
            env=self.env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"`skilljobs web` did not start:\n{self.log.read_text()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def status_kb(self, field: str) -> int:
        """A ``/proc/<pid>/status`` memory figure (``VmHWM`` = peak RSS) in kB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, **kw)


def post_huge(
    port: int, path: str, total: int, headers: dict[str, str], *, chunked: bool = False
) -> int | None:
    """POST ``total`` bytes of JSON-looking junk, stopping as soon as the server answers.
    The status the server sent, or ``None`` when it only dropped the connection."""
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    piece = b"[" + b"1," * (256 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        sent = 0
        try:
            while sent < total:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break
                data = piece[: total - sent]
                if chunked:
                    data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
                sock.sendall(data)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            first = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            return None
    if not first.startswith(b"HTTP/1.1 "):
        return None
    return int(first.split()[1])


def half_open(port: int, count: int) -> list[socket.socket]:
    """``count`` connections that each send part of a request head and then nothing."""
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode())
        socks.append(s)
    return socks
