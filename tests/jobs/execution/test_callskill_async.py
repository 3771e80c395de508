"""call_skill on an ``async: true`` skill runs it inline within the caller's remaining wall
clock, with a warning (SPEC C9)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry
from jobs.execution.callskill import WALL_DEADLINE, within_caller
from jobs.execution.executor import Executor
from tests.helpers.settings import MARKET_SKILLS, make_settings

MARKET = MARKET_SKILLS
CTX = {"role_id": "r1", "session_id": "s1", "channel": "web"}


@pytest.fixture
async def ex(tmp_path: Path):  # type: ignore[no-untyped-def]
    e = Executor(
        settings=make_settings(tmp_path, redis_url=None, prefix="t"),
        registry=load_registry([MARKET]),
        sessionmaker=None,
        box=None,
    )
    yield e
    await e.aclose()


def test_within_caller() -> None:
    assert within_caller(600.0) == 600.0  # the top level keeps its own wall clock
    token = WALL_DEADLINE.set(time.monotonic() + 5.0)
    try:
        assert 4.0 < within_caller(600.0) <= 5.0
        assert within_caller(1.0) == 1.0
    finally:
        WALL_DEADLINE.reset(token)


async def test_async_callee_runs_inline_with_warning(
    ex: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobs.execution.callskill"):
        out = await ex.execute("async_caller", {"seconds": 0.1}, dict(CTX))
    assert out.status == "succeeded", out.result
    assert out.result["got"] == {"ok": True, "slept": 0.1}
    warning = next(r.getMessage() for r in caplog.records if "slow_async" in r.getMessage())
    assert "async: true" in warning and "async_caller" in warning and "inline" in warning


@pytest.mark.slow
async def test_async_callee_gets_only_the_callers_remaining_wall(ex: Executor) -> None:
    t0 = time.monotonic()
    out = await ex.execute("async_caller", {"seconds": 30}, dict(CTX))
    took = time.monotonic() - t0
    assert took < 15.0  # the caller's wall_sec is 2; the callee would sleep 30 s
    if out.status == "succeeded":  # the callee was stopped first and reported it
        got = out.result["got"]
        assert got["ok"] is False and "was stopped" in got["error"]
    else:
        assert out.status == "timed_out"
