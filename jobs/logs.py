"""Structured logging: ``SKILLJOBS_LOG_FORMAT=json`` gives one JSON object per line.

No credential reaches a log line: the HTTP client libraries' request logs are silenced (the
Telegram Bot API carries the bot token in the URL path), and :class:`SecretFilter` replaces
every configured secret value — channel credentials, API tokens, the LLM key, the secret
key, and the per-role secret configs of the jobs this process runs — in every record, as
the last line of defence.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import IO, Any
from urllib.parse import urlsplit

from jobs.settings import Settings

_STD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
MASK = "••••••"
MIN_SECRET_LEN = 6  # shorter values are too likely to be ordinary words or numbers
MAX_JOB_SECRETS = 2000  # per-role secrets remembered (oldest forgotten first)
# Loggers that log request URLs (and so any token in them) at INFO or DEBUG.
NOISY_HTTP = ("httpx", "httpcore", "hpack", "urllib3", "requests", "apprise")


class _Registry:
    """The secret values this process knows: fixed ones from the settings, plus the job
    secrets seen lately. One compiled pattern, rebuilt only when the set changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fixed: set[str] = set()
        self._jobs: OrderedDict[str, None] = OrderedDict()
        self._pattern: re.Pattern[str] | None = None
        self._dirty = False

    def set_fixed(self, values: Iterable[str]) -> None:
        with self._lock:
            self._fixed = {v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_LEN}
            self._dirty = True

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            for v in values:
                if not isinstance(v, str) or len(v) < MIN_SECRET_LEN or v in self._fixed:
                    continue
                if v in self._jobs:
                    self._jobs.move_to_end(v)
                    continue
                self._jobs[v] = None
                self._dirty = True
                if len(self._jobs) > MAX_JOB_SECRETS:
                    self._jobs.popitem(last=False)

    def pattern(self) -> re.Pattern[str] | None:
        if self._dirty:
            with self._lock:
                values = sorted(self._fixed | set(self._jobs), key=lambda v: (-len(v), v))
                self._pattern = (
                    re.compile("|".join(re.escape(v) for v in values)) if values else None
                )
                self._dirty = False
        return self._pattern

    def scrub(self, text: str) -> str:
        pattern = self.pattern()
        return text if pattern is None or not text else pattern.sub(MASK, text)


SECRETS = _Registry()


def register_secrets(values: Iterable[str]) -> None:
    """Secret values that must never appear in a log line (e.g. a job's secret configs)."""
    SECRETS.add(values)


def settings_secrets(settings: Settings) -> list[str]:
    """Every credential the settings hold, and the secret key (configured or generated)."""
    out: list[str] = []
    for name, value in settings:
        if hasattr(value, "get_secret_value"):
            raw = value.get_secret_value()
            if raw:
                out.append(str(raw))
        elif name.endswith(("_secret", "_token", "_key", "_password")) and value:
            out.append(str(value))
        elif name.endswith("_url") and isinstance(value, str) and "@" in value:
            with contextlib.suppress(ValueError):
                password = urlsplit(value).password
                if password:
                    out.append(password)
    key_file = settings.data_dir / "secret.key"
    try:
        if key_file.is_file():
            out.append(key_file.read_text(encoding="utf-8").strip())
    except OSError:
        pass
    return out


class SecretFilter(logging.Filter):
    """Replaces every known secret value in a record (message, arguments, traceback and
    extra fields) with a mask. Attach it to handlers: it sees every record they emit."""

    def __init__(self, registry: _Registry = SECRETS) -> None:
        super().__init__()
        self.registry = registry

    def filter(self, record: logging.LogRecord) -> bool:
        if self.registry.pattern() is None:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep what there is
            message = str(record.msg)
        record.msg, record.args = self.registry.scrub(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.registry.scrub(record.exc_text)
            record.exc_info = None  # only the scrubbed text is rendered
        if record.stack_info:
            record.stack_info = self.registry.scrub(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _STD and isinstance(value, str):
                setattr(record, key, self.registry.scrub(value))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _STD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def setup_logging(settings: Settings, stream: IO[str] | None = None) -> None:
    handler = logging.StreamHandler(stream)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    SECRETS.set_fixed(settings_secrets(settings))
    handler.addFilter(SecretFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    # arq logs every job start/finish at INFO; keep it for debugging only.
    logging.getLogger("arq").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    for name in NOISY_HTTP:
        logging.getLogger(name).setLevel(logging.WARNING)
