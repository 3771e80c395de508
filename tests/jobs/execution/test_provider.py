"""LLM provider against a loopback server speaking the OpenAI and Anthropic shapes."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from jobs.catalog.loader import load_registry
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.execution.executor import Executor
from jobs.execution.provider import (
    CallOptions,
    Message,
    ProviderError,
    ProviderUnavailable,
    build_provider,
    subprocess_llm_env,
)
from tests.exec_fixtures.fake_api import FakeAPI, Running
from tests.helpers.settings import EXEC_FIXTURES, make_settings

FIXTURES = EXEC_FIXTURES


def settings_for(tmp_path: Path, **kw: object):  # type: ignore[no-untyped-def]
    return make_settings(tmp_path, redis_url=None, prefix="t", **kw)


def test_no_model_configured(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    assert build_provider(s) is None
    assert subprocess_llm_env(s) == {}


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ("https://llm.example.com", "https://llm.example.com/v1"),
        ("https://llm.example.com/", "https://llm.example.com/v1"),
        ("https://llm.example.com/v1", "https://llm.example.com/v1"),
    ],
)
def test_openai_env(tmp_path: Path, base: str, expected: str) -> None:
    s = settings_for(tmp_path, llm_provider="deepseek", llm_base=base, llm_key="k1", llm_model="m")
    assert subprocess_llm_env(s) == {
        "OPENAI_API_KEY": "k1",
        "OPENAI_BASE_URL": expected,
        "MYINC_LLM_KEY": "k1",
        "MYINC_LLM_BASE": expected,
        "MYINC_LLM_MODEL": "m",
    }


def test_anthropic_env_uses_bare_base(tmp_path: Path) -> None:
    s = settings_for(
        tmp_path, llm_provider="anthropic", llm_base="https://claude.example.com/", llm_key="k2"
    )
    assert subprocess_llm_env(s) == {
        "ANTHROPIC_API_KEY": "k2",
        "ANTHROPIC_BASE_URL": "https://claude.example.com",
        "MYINC_LLM_KEY": "k2",
        "MYINC_LLM_BASE": "https://claude.example.com",
    }


def test_keyless_model_injects_nothing(tmp_path: Path) -> None:
    s = settings_for(
        tmp_path, llm_provider="ollama", llm_base="http://127.0.0.1:11434", llm_model="q"
    )
    assert subprocess_llm_env(s) == {}
    assert build_provider(s) is not None  # in-process skills can still use a key-less model
    s = settings_for(tmp_path, llm_provider="openai", llm_key="k3")
    assert subprocess_llm_env(s) == {"OPENAI_API_KEY": "k3", "MYINC_LLM_KEY": "k3"}


async def test_openai_complete(tmp_path: Path) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        s = settings_for(
            tmp_path,
            llm_provider="openai",
            llm_base=api.url + "/v1",
            llm_key=api.key,
            llm_model="gpt-x",
        )
        p = build_provider(s, http)
        assert p is not None and api.key not in repr(p)
        r = await p.complete(
            [Message("user", "hi")], system="be brief", max_tokens=20, temperature=0.1
        )
        assert (r.text, r.stop_reason, r.input_tokens, r.output_tokens) == (
            "openai says: hi",
            "stop",
            11,
            5,
        )
        req = api.requests[-1]
        assert req["path"] == "/v1/chat/completions"
        assert req["body"] == {
            "model": "gpt-x",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
            ],
            "max_tokens": 20,
            "temperature": 0.1,
        }
        r = await p.complete(
            [{"role": "user", "content": "yo"}], options=CallOptions(model="other", max_tokens=7)
        )
        assert api.requests[-1]["body"]["model"] == "other"
        assert (
            api.requests[-1]["body"]["max_tokens"] == 7
            and "temperature" not in api.requests[-1]["body"]
        )
        assert p.last_usage == {"input_tokens": 11, "output_tokens": 5}


async def test_anthropic_complete(tmp_path: Path) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        s = settings_for(
            tmp_path,
            llm_provider="anthropic",
            llm_base=api.url,
            llm_key=api.key,
            llm_model="claude-x",
        )
        p = build_provider(s, http)
        assert p is not None
        r = await p.complete([Message("user", "hello")], system="sys", max_tokens=64)
        assert (r.text, r.stop_reason, r.input_tokens, r.output_tokens) == (
            "claude says: hello",
            "end_turn",
            13,
            7,
        )
        req = api.requests[-1]
        assert req["path"] == "/v1/messages"
        assert req["headers"]["x-api-key"] == api.key and req["headers"]["anthropic-version"]
        assert req["body"] == {
            "model": "claude-x",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 64,
            "system": "sys",
        }


@pytest.mark.slow
async def test_errors_are_classified_and_keep_the_key_out(tmp_path: Path) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        s = settings_for(
            tmp_path, llm_provider="openai", llm_base=api.url, llm_key="wrong-key-77", llm_model="m"
        )
        p = build_provider(s, http)
        assert p is not None
        with pytest.raises(ProviderError, match="HTTP 401") as info:
            await p.complete("hi")
        assert "wrong-key-77" not in str(info.value)
        api.fail_next = 503
        with pytest.raises(ProviderUnavailable, match="HTTP 503"):
            await p.complete("hi")
        assert issubclass(ProviderUnavailable, ConnectionError)  # the worker re-runs these
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    s = settings_for(
        tmp_path,
        llm_provider="openai",
        llm_base=f"http://127.0.0.1:{port}",
        llm_key="k",
        llm_model="m",
    )
    p = build_provider(s)
    assert p is not None
    with pytest.raises(ProviderUnavailable):
        await p.complete("hi")
    await p.aclose()


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.slow
async def test_in_process_skill_uses_provider(tmp_path: Path, sqlite_url: str, kind: str) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        s = settings_for(
            tmp_path, llm_provider=kind, llm_base=api.url, llm_key=api.key, llm_model="m"
        )
        engine = create_engine(sqlite_url)
        ex = Executor(
            settings=s,
            registry=load_registry([FIXTURES]),
            sessionmaker=create_sessionmaker(engine),
            box=SecretBox(b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="),
            http=http,
        )
        try:
            r = await ex.run("llm_user", {"prompt": "ping"}, {"role_id": "r1"})
        finally:
            await engine.dispose()
        says = "openai says" if kind == "openai" else "claude says"
        assert r == {
            "ok": True,
            "text": f"{says}: ping",
            "in": r["in"],
            "out": r["out"],
            "stop": r["stop"],
        }
        assert r["in"] > 0 and r["out"] > 0
    # without a model the skill sees provider None and reports it as a config failure
    ex = Executor(
        settings=settings_for(tmp_path),
        registry=load_registry([FIXTURES]),
        sessionmaker=None,
        box=None,
    )
    out = await ex.execute("llm_user", {"prompt": "x"}, {"role_id": "r1"})
    assert out.status == "failed" and out.error_type == "config"


def test_role_binding_values() -> None:
    from jobs.execution.provider import role_llm_values

    default = {"provider": "openai", "base": "https://a", "key": "k-default", "model": "m0"}
    assert role_llm_values(default, {}) is default
    assert role_llm_values(default, {"unrelated": 1}) is default
    # same provider: only the model changes, base and key are inherited
    assert role_llm_values(default, {"model": "m1"}) == {**default, "model": "m1"}
    # another provider never inherits the default's key or base
    assert role_llm_values(default, {"provider": "anthropic", "model": "c"}) == {
        "provider": "anthropic",
        "base": "",
        "key": "",
        "model": "c",
    }
    got = role_llm_values(default, {"provider": "anthropic", "api_key": "k2", "base": "https://b"})
    assert got == {"provider": "anthropic", "base": "https://b", "key": "k2", "model": "m0"}


async def test_role_bound_model(tmp_path: Path, sqlite_url: str) -> None:
    from jobs.catalog.configs import ConfigStore

    key = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        s = settings_for(
            tmp_path, llm_provider="openai", llm_base=api.url, llm_key=api.key, llm_model="gpt-d"
        )
        engine = create_engine(sqlite_url)
        sm = create_sessionmaker(engine)
        store = ConfigStore(sm, SecretBox(key))
        await store.replace(
            "r2",
            "@llm",
            {"provider": "anthropic", "base": api.url, "key": api.key, "model": "claude-r2"},
        )
        ex = Executor(
            settings=s,
            registry=load_registry([FIXTURES]),
            sessionmaker=sm,
            box=SecretBox(key),
            http=http,
        )
        ex.role_llm_ttl = 0  # look the binding up on every run
        try:
            r1 = await ex.run("llm_user", {"prompt": "a"}, {"role_id": "r1"})
            r2 = await ex.run("llm_user", {"prompt": "b"}, {"role_id": "r2"})
            assert r1["text"] == "openai says: a" and r2["text"] == "claude says: b"
            assert api.requests[-1]["body"]["model"] == "claude-r2"
            env = (await ex.run("cli_py", {"_subcommand": "show"}, {"role_id": "r2"}))["env"]
            assert env == {
                "ANTHROPIC_API_KEY": "••••••",
                "ANTHROPIC_BASE_URL": api.url,
                "MYINC_LLM_KEY": "••••••",
                "MYINC_LLM_BASE": api.url,
                "MYINC_LLM_MODEL": "claude-r2",
            }
            # a changed binding is picked up once the cached one expires (here: at once)
            await store.replace("r2", "@llm", {"model": "gpt-r2"})
            r2 = await ex.run("llm_user", {"prompt": "c"}, {"role_id": "r2"})
            assert r2["text"] == "openai says: c" and api.requests[-1]["body"]["model"] == "gpt-r2"
            # call_skill re-resolves the provider for the callee's role
            got = (
                await ex.execute(
                    "caller", {"target": "llm_user", "args": {"prompt": "d"}}, {"role_id": "r1"}
                )
            ).result
            assert (
                got["got"]["text"] == "openai says: d"
                and api.requests[-1]["body"]["model"] == "gpt-d"
            )
        finally:
            await ex.aclose()
            await engine.dispose()
