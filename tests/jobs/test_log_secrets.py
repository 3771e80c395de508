"""A synchronous skill that logs its own secret config: the log line never carries it."""

from __future__ import annotations

import io
import logging

import pytest

from jobs.catalog.configs import ConfigStore
from jobs.logs import SecretFilter
from jobs.queue.dispatcher import Dispatcher

WEB = {"channel": "web", "role_id": "r-logs", "session_id": "s-logs"}
TOKEN = "tok-live-7c1e90ab33"


@pytest.mark.slow
async def test_sync_line_secrets_are_scrubbed_from_logs(services) -> None:  # type: ignore[no-untyped-def]
    await ConfigStore(services.sessionmaker, services.box).set(
        "r-logs", "sync_logger", "api_token", TOKEN
    )
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretFilter())
    logger = logging.getLogger("skill.sync_logger")
    logger.addHandler(handler)
    try:
        res = await Dispatcher(services).dispatch("sync_logger", {}, WEB)
    finally:
        logger.removeHandler(handler)
    assert res.status_code == 200 and res.body["message"] == "called", res.body
    text = stream.getvalue()
    assert "calling the upstream API with token" in text
    assert TOKEN not in text
