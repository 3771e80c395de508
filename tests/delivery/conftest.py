"""Fixtures of the delivery tests: a deployment with the trust test skills and fake Telegram."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from jobs.services import Services
from tests.helpers.keys import clear_keys
from tests.helpers.settings import TRUST_SKILLS, make_settings


@pytest.fixture
async def trust(
    tmp_path: Path,
    database_url: str,
    redis_server_url: str,
    redis_prefix: str,
    tg: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Services]:
    """Services on the parametrized backend: the ``ws_tool`` skill plus the bundled ones,
    Telegram on the fake server. The bundled delivery skills read their settings from the
    environment, so the same values are exported there."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "skills_path": os.pathsep.join([str(TRUST_SKILLS), "bundled"]),
        "telegram_bot_token": tg.token,
        "telegram_api_base": tg.url,
        "worker_lease_sec": 5.0,
    }
    settings = make_settings(tmp_path, redis_url=redis_server_url, prefix=redis_prefix, **values)
    exported = (
        "data_dir",
        "redis_url",
        "redis_prefix",
        "queue_name",
        "secret_key",
        "trusted_skills",
    )
    for name in exported:
        value = getattr(settings, name)
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        monkeypatch.setenv(f"SKILLJOBS_{name.upper()}", str(value))
    for name, value in values.items():
        monkeypatch.setenv(f"SKILLJOBS_{name.upper()}", str(value))
    svc = await Services.open(settings)
    yield svc
    if svc.redis is not None:
        await clear_keys(svc.redis, redis_prefix)
    await svc.close()
