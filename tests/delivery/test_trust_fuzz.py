"""Hostile text over every endpoint of the web app: NUL, lone surrogates, invalid UTF-8
and 10,000-deep JSON in paths, queries, headers and bodies, on SQLite and PostgreSQL.
Every answer is a 4xx (or an ordinary success): never a server error."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from tests.helpers.settings import ADMIN_AUTH

pytestmark = pytest.mark.integration

SEGMENTS = ["%00", "a%00b", "%FF", "%ED%A0%80", "%F0%9F", "x" * 5000, "%C0%80"]
QUERIES = ["limit=%00", "status=%ED%A0%80", "q=%FF", "%00=1", "cursor=a%00", "before=%F0%9F"]
BODIES = [
    b'{"a": "\\u0000"}',
    b'{"a": "\\ud800"}',
    b'{"\\udc80": 1}',
    b'{"a": "\xff\xfe"}',
    b"[" * 10_000 + b"]" * 10_000,
    b'{"a": ' * 10_000 + b"1" + b"}" * 10_000,
    b'{"skill": "echo", "input": {"t": "\\ud83d"}, "context": {"channel": "web"}}',
    b'{"skill": "echo", "input": {}, "context": {"channel": "telegram", "actor_key": "1\\u0000"}}',
    b'{"skill": "echo", "input": {}, "context": {"channel": "telegram", "actor_key": {"a": 1}}}',
    b'{"skill": "echo", "input": {}, "context": {"role_id": "\\ud800", "channel": "web"}}',
    b'{"skill": "echo", "input": {}, "context": {"session_id": "' + b"s" * 300 + b'"}}',
    b'{"skill": "echo", "input": {"n": "\\u0000"}, "context": {"channel": "web"}}',
    b'{"skill": "\\u0000", "input": {}}',
]
HEADERS = [
    {"x-actor": b"a\x00b"},
    {"idempotency-key": b"k\x00"},
    {"idempotency-key": b"k\xff\xfe"},
    {"traceparent": b"00-\xff"},
]


def _operations(app: Any) -> list[tuple[str, str]]:
    ops = [("GET", "/files/{token}"), ("GET", "/metrics")]
    for path, methods in app.openapi()["paths"].items():
        ops += [(m.upper(), path) for m in methods]
    return ops


def _fill(path: str, value: str) -> str:
    return re.sub(r"\{[^}]+\}", value, path)


@pytest.mark.slow
async def test_no_server_error_on_any_endpoint(trust) -> None:
    app = create_app(trust.settings, services=trust)
    errors: list[str] = []
    sent = 0
    started = time.monotonic()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://127.0.0.1",
        headers=ADMIN_AUTH,
        timeout=10,
    ) as c:

        async def go(method: str, url: str, **kw: Any) -> None:
            nonlocal sent
            sent += 1
            try:
                async with asyncio.timeout(5):
                    r = await c.request(method, url, **kw)
            except TimeoutError:
                errors.append(f"{method} {url[:120]} {kw.get('headers')} -> no answer in 5 s")
                return
            if r.status_code >= 500 and r.status_code != 503:
                errors.append(f"{method} {url[:120]} {kw.get('headers')} -> {r.status_code}")

        for method, path in _operations(app):
            streams = path.endswith("/events")
            for seg in SEGMENTS if "{" in path else []:
                if streams and seg.isalnum():
                    continue  # a plain id: a stream that stays open
                await go(method, _fill(path, seg), json={} if method != "GET" else None)
            base = _fill(path, "x1")
            for query in QUERIES:
                if streams:
                    query += "&x=%00"  # refused before a stream opens
                await go(method, f"{base}?{query}", json={} if method != "GET" else None)
            if method in ("POST", "PUT", "PATCH"):
                for body in BODIES:
                    await go(
                        method, base, content=body, headers={"content-type": "application/json"}
                    )
            if not streams:
                for headers in HEADERS:
                    await go(method, base, headers=headers)
    assert sent > 500
    assert not errors, "\n".join(errors[:40])
    assert time.monotonic() - started < 60
