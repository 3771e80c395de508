"""The instance state file: what ``skilljobs up`` started (web URL, Redis URL, database URL,
skills path, pid), left in the data dir so every other command finds the same instance
with nothing but ``SKILLJOBS_DATA_DIR`` set."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from jobs.cli.embedded import write_private
from jobs.settings import Settings

STATE_FILE = "state.json"
#: settings taken from the state file when the matching variable is not set
FROM_STATE = ("redis_url", "database_url", "skills_path")
#: the ones that only hold while the instance runs (its embedded Redis goes with it)
WHILE_RUNNING = ("redis_url",)


def state_path(data_dir: Path) -> Path:
    return Path(data_dir) / STATE_FILE


def write_state(settings: Settings, *, web_url: str, pid: int | None = None) -> Path:
    """Write the state of this instance (0600: the Redis URL may carry its password)."""

    data = {
        "pid": pid or os.getpid(),
        "web_url": web_url,
        "redis_url": settings.redis_url,
        "database_url": settings.resolved_database_url,
        "skills_path": settings.skills_path,
        "data_dir": str(settings.data_dir.resolve()),
        "started_at": time.time(),
    }
    path = state_path(settings.data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(data, indent=2) + "\n")
    return path


def read_state(data_dir: Path) -> dict[str, Any] | None:
    """The state file's content, or None (missing or unreadable)."""
    try:
        data = json.loads(state_path(data_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def running(state: dict[str, Any] | None) -> bool:
    return state is not None and pid_alive(state.get("pid"))


def apply_state(settings: Settings) -> Settings:
    """Fill the settings the environment leaves unset from the state file of ``up``."""
    state = read_state(settings.data_dir)
    if state is None:
        return _embedded(settings)
    alive = running(state)
    for field in FROM_STATE:
        value = state.get(field)
        if field in settings.model_fields_set or not value or not isinstance(value, str):
            continue
        if field in WHILE_RUNNING and not alive:
            continue
        setattr(settings, field, value)
    return _embedded(settings)


def _embedded(settings: Settings) -> Settings:
    """The URL a running `up` leaves for its bundled Redis (also before its state file)."""
    marker = settings.data_dir / "redis" / "url"
    if settings.redis_url is None and marker.is_file():
        settings.redis_url = marker.read_text().strip() or None
    return settings


def remove_state(settings: Settings) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(settings.data_dir).unlink()
