"""provider.stream / provider.tool_call on both wire formats, and the compatibility import
ported skills use — against the loopback fake LLM server (tests/exec_fixtures/fake_api.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from jobs.catalog.loader import load_registry
from jobs.execution.executor import Executor
from jobs.execution.provider import (
    CallOptions,
    Message,
    Provider,
    ProviderError,
    ProviderUnavailable,
)
from tests.exec_fixtures.fake_api import FakeAPI, Running
from tests.helpers.settings import MARKET_SKILLS, ROOT, make_settings

MARKET = MARKET_SKILLS
KINDS = ["openai", "anthropic"]
SAYS = {"openai": "openai says", "anthropic": "claude says"}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def provider(kind: str, api: FakeAPI, http: httpx.AsyncClient, key: str | None = None) -> Provider:
    return Provider(provider=kind, base=api.url, key=key or api.key, model="m1", http=http)


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_chunks_then_usage(kind: str) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        p = provider(kind, api, http)
        stream = p.stream(
            [Message("user", "hello there")], system="sys", options=CallOptions(max_tokens=9)
        )
        chunks = [c async for c in stream]
        assert len(chunks) > 1 and "".join(chunks) == f"{SAYS[kind]}: hello there"
        assert stream.text == "".join(chunks) and stream.stop_reason in ("stop", "end_turn")
        want = {"openai": (11, 5), "anthropic": (13, 7)}[kind]
        assert (stream.usage["input_tokens"], stream.usage["output_tokens"]) == want
        assert p.last_usage == stream.usage
        body = api.requests[-1]["body"]
        assert body["stream"] is True and body["max_tokens"] == 9
        if kind == "openai":
            assert body["stream_options"] == {"include_usage": True}
            assert body["messages"][0] == {"role": "system", "content": "sys"}
        else:
            assert body["system"] == "sys"


@pytest.mark.parametrize("kind", KINDS)
async def test_stream_errors_are_classified(kind: str) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        with pytest.raises(ProviderError, match="HTTP 401"):
            [c async for c in provider(kind, api, http, key="wrong-9").stream("hi")]
        api.fail_next = 503
        with pytest.raises(ProviderUnavailable, match="HTTP 503"):
            [c async for c in provider(kind, api, http).stream("hi")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "tool",
    [
        WEATHER,
        {"type": "function", "function": WEATHER},  # OpenAI shape
        {
            **{k: v for k, v in WEATHER.items() if k != "parameters"},
            "input_schema": WEATHER["parameters"],
        },
    ],
)
async def test_tool_call(kind: str, tool: dict[str, object]) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        p = provider(kind, api, http)
        r = await p.tool_call(
            [Message("user", "weather in Paris?")], [tool], tool_choice="get_weather"
        )
        assert [(c.name, c.arguments) for c in r.tool_calls] == [
            ("get_weather", {"city": "<city>"})
        ]
        assert r.tool_calls[0].id and r.stop_reason in ("tool_calls", "tool_use")
        assert r.input_tokens > 0 and p.last_usage["output_tokens"] == r.output_tokens
        body = api.requests[-1]["body"]
        if kind == "openai":
            assert body["tools"] == [{"type": "function", "function": WEATHER}]
            assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        else:
            assert body["tools"] == [
                {
                    "name": "get_weather",
                    "description": WEATHER["description"],
                    "input_schema": WEATHER["parameters"],
                }
            ]
            assert body["tool_choice"] == {"type": "tool", "name": "get_weather"}
            assert r.text == "calling a tool"


@pytest.mark.parametrize("kind", KINDS)
async def test_ported_skill_imports_unchanged(tmp_path: Path, kind: str) -> None:
    async with Running(FakeAPI()) as api, httpx.AsyncClient() as http:
        s = make_settings(
            tmp_path,
            redis_url=None,
            prefix="t",
            llm_provider=kind,
            llm_base=api.url,
            llm_key=api.key,
            llm_model="m",
        )
        ex = Executor(
            settings=s, registry=load_registry([MARKET]), sessionmaker=None, box=None, http=http
        )
        out = await ex.execute("ported_llm", {"prompt": "ping"}, {"role_id": "r1"})
        await ex.aclose()
    r = out.result
    assert out.status == "succeeded", r
    assert r["text"] == f"{SAYS[kind]}: ping" and "".join(r["chunks"]) == r["text"]
    assert r["tool"] == [["get_weather", {"city": "<city>"}]] or r["tool"] == [
        ("get_weather", {"city": "<city>"})
    ]
    assert r["stream_usage"]["input_tokens"] > 0


@pytest.mark.slow
def test_compat_module_only_for_skill_code() -> None:
    """Importing skilljobs does not make ``backend`` importable; running skill code does."""
    code = (
        "import importlib.util, sys\n"
        "import jobs.execution.executor\n"
        "assert importlib.util.find_spec('backend') is None, 'backend leaked'\n"
        "from jobs.execution import compat\n"
        "compat.install()\n"
        "from backend.infra.providers.base import Message, CallOptions, LLMProvider\n"
        "from jobs.execution import provider\n"
        "assert Message is provider.Message and LLMProvider is provider.Provider\n"
        "print(Message(role='user', content='x'), CallOptions(model='m'))\n"
    )
    root = ROOT
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr
    assert "Message(role='user', content='x')" in res.stdout
