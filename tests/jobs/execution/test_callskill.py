"""call_skill: input precedence, pass-through context, config re-resolution, depth, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.catalog.configs import ConfigStore
from jobs.catalog.loader import load_registry
from jobs.context import ACTOR_KEYS, CALL_PASS_KEYS, FIXED_SEGMENT
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.execution.callskill import MAX_DEPTH, fill_template
from jobs.execution.executor import Executor
from tests.helpers.settings import EXEC_FIXTURES, make_settings

FIXTURES = EXEC_FIXTURES
KEY = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="

PARENT = {
    "role_id": "r1",
    "session_id": "s1",
    "org_id": "o1",
    "user_id": "u1",
    "team_id": "t1",
    "team_role": "owner",
    "is_admin": False,
    "channel": "feishu",
    "chat_mode": True,
    "allow_sql": False,
    "abort_signal": None,
    "raw_input": "do it",
    "triggered_at": 1.0,
    "attachments": [],
    "actor_name": "Li",
    "actor_emp_no": "E1",
    "actor_key": "ou_1",
    "actor_tags": ["a"],
    "actor_id": "u-9",
    "actor_is_admin": False,
    "emp_no": "E1",
    "custom": "not passed",
    "skill_configs": {"caller": {"api_key": "caller-secret"}, "api_key": "caller-secret"},
    "skill_args": {"api_key": "caller-secret"},
    "api_key": "caller-secret",
}


@pytest.fixture
async def ex(tmp_path: Path, sessionmaker):  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path, redis_url=None, prefix="t")
    executor = Executor(
        settings=settings,
        registry=load_registry([FIXTURES]),
        sessionmaker=sessionmaker,
        box=SecretBox(KEY),
    )
    yield executor
    await executor.aclose()


async def call(ex: Executor, target: str, args=None, ctx=None, **kwargs):  # type: ignore[no-untyped-def]
    out = await ex.execute(
        "caller", {"target": target, "args": args, "kwargs": kwargs}, dict(ctx or PARENT)
    )
    assert out.status == "succeeded", out.error
    return out.result["got"]


async def test_success_returns_callee_output_as_is(ex: Executor) -> None:
    got = await call(ex, "one_arg", {"n": 3})
    assert got == {"result": [3, 2], "ok": True}


async def test_pass_through_context_is_exactly_the_whitelist(ex: Executor) -> None:
    got = await call(ex, "echo_ctx", {"x": 1})
    ctx = got["ctx"]
    config_layers = {"skill_configs", "skill_args"}
    expected = {k for k in CALL_PASS_KEYS if k in PARENT or k == "workspace_dir"}
    expected |= set(FIXED_SEGMENT)  # the whole fixed segment (C11)
    expected -= {"abort_signal"}  # live object: echo_ctx leaves it out of its report
    assert set(ctx) - config_layers == expected
    assert set(ACTOR_KEYS) & set(PARENT) <= set(ctx)
    for k in ("emp_no", "custom", "api_key"):
        assert k not in ctx, k
    # not in the pass-through whitelist: present as typed empties, not the parent's values
    assert ctx["raw_input"] == "" and ctx["attachments"] == []
    assert ctx["triggered_at"] == 0.0 and ctx["triggered_at_str"] == ""
    assert ctx["actor_key"] == "ou_1" and ctx["actor_tags"] == ["a"]
    assert ctx["skill_configs"] == {"echo_ctx": {}}  # the caller's configs are not inherited
    assert ctx["allow_sql"] is False and ctx["team_role"] == "owner"
    assert got["live"]["db"] == "LazySession" and got["live"]["call_skill"] == "function"
    assert got["call_depth"] == 1
    assert got["workspace_exists"]


async def test_input_precedence_and_callee_configs(ex: Executor, sessionmaker) -> None:  # type: ignore[no-untyped-def]
    store = ConfigStore(sessionmaker, SecretBox(KEY))
    await store.replace(
        "r1", "callee_cfg", {"region": "cfg", "title": "cfg-title", "api_key": "callee-secret"}
    )
    got = await call(ex, "callee_cfg")
    assert got["input"] == {"region": "cfg", "title": "cfg-title"}  # secrets never become input
    # the callee saw its own secret (echoing it back is masked by the executor)
    assert got["api_key"] == "••••••" and got["api_key_len"] == len("callee-secret")
    assert got["region"] == "cfg"
    assert got["configs_for"] == ["callee_cfg"]

    source = {"region": "src", "title": "src-title", "extra": 7, "_private": 1}
    got = await call(ex, "callee_cfg", source=source, passthrough=True)
    assert got["input"] == {"region": "src", "title": "src-title", "extra": 7}
    got = await call(
        ex,
        "callee_cfg",
        {"region": "explicit"},
        source=source,
        passthrough=True,
        template={"title": "T {extra}", "region": "from-template"},
    )
    assert got["input"] == {"region": "explicit", "title": "T 7", "extra": 7}
    got = await call(ex, "callee_cfg", {"region": "explicit"}, region="kwarg")
    assert got["input"]["region"] == "kwarg"


async def test_depth_limit(ex: Executor) -> None:
    out = await ex.execute("ping", {}, dict(PARENT))
    r = out.result
    levels = []
    while isinstance(r, dict) and "level" in r:
        levels.append(r["level"])
        r = r["next"]
    assert levels == list(range(MAX_DEPTH + 1))
    assert (
        r["ok"] is False and "limited to 3 levels" in r["error"] and r["skill"] in ("ping", "pong")
    )


async def test_refusals_never_raise(ex: Executor) -> None:
    out = await ex.execute("self_caller", {}, dict(PARENT))
    assert out.result["got"] == {
        "ok": False,
        "error": "skill 'self_caller' may not call itself through call_skill",
        "skill": "self_caller",
        "output": None,
    }
    assert await call(ex, "bg_only") == {"ok": True}  # async: true runs inline (C9)
    got = await call(ex, "nope")
    assert got["ok"] is False and "unknown skill 'nope'" in got["error"]
    got = await call(ex, "echo_ctx", ["not", "a", "dict"])
    assert got["ok"] is False and "must be a dict" in got["error"]
    got = await call(ex, "echo_ctx", template={"t": "x {missing.field}"}, source={"a": 1})
    assert got["ok"] is False and "{missing.field}" in got["error"]


async def test_callee_failures(ex: Executor) -> None:
    got = await call(ex, "fails_soft")
    assert (
        got["ok"] is False and got["error"] == "no such customer" and got["skill"] == "fails_soft"
    )
    assert got["output"]["user_message"] == "Check the id"
    got = await call(ex, "raiser", {"kind": "conn"})
    assert got["ok"] is False and "ConnectionError" in got["error"]
    assert got["output"]["error_type"] == "transient"


async def test_subprocess_callee(ex: Executor) -> None:
    got = await call(ex, "shell_echo", {"q": 1})
    assert got["input"] == {"q": 1} and got["ok"] is True


async def test_config_store_failure_is_returned(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}")  # no tables
    ex = Executor(
        settings=make_settings(tmp_path, redis_url=None, prefix="t"),
        registry=load_registry([FIXTURES]),
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(KEY),
    )
    try:
        got = await call(ex, "echo_ctx")
        assert got["ok"] is False and "OperationalError" in got["error"]
    finally:
        await engine.dispose()


def test_fill_template() -> None:
    src = {"day": "Mon", "data": {"rows": [1, 2], "n": 2}}
    assert fill_template({"t": "Sales {day}", "rows": "{data.rows}", "k": 5}, src) == {
        "t": "Sales Mon",
        "rows": [1, 2],
        "k": 5,
    }
    with pytest.raises(KeyError):
        fill_template({"t": "{nope}"}, src)
