"""The HTTP surface against hostile clients, in process (the guard's decisions) and against
real `skilljobs web` processes (memory, descriptors, slow connections)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import select

from dashboard import tokens
from dashboard.app import create_app
from dashboard.guard import Guard
from dashboard.server import UnsafeBind, check_bind
from delivery.channels import web
from jobs.models import OpsAction
from jobs.services import Services
from jobs.settings import Settings
from tests.helpers.dashboard import TOKEN, make_services, seed_job
from tests.helpers.settings import make_settings
from tests.helpers.web import TOKEN as WEB_TOKEN
from tests.helpers.web import WebProcess, half_open, post_huge

READ_TOKEN = "read-token-0123456789abcdef0123456789"
BIG = str(2**70)


def _client(app: Any, host: str = "127.0.0.1", **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=f"http://{host}", headers=headers
    )


async def _audit(services: Services) -> list[tuple[str, str, str]]:
    async with services.sessionmaker() as s:
        rows = (await s.execute(select(OpsAction).order_by(OpsAction.id))).scalars()
        return [(r.action, r.target, r.actor) for r in rows]


@pytest.fixture
async def open_app(
    tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str
) -> AsyncIterator[Any]:
    """The app built with no token configured: nothing is open, loopback included."""
    svc = await make_services(
        tmp_path, sqlite_url, redis_server_url, redis_prefix, None, api_token=None
    )
    yield create_app(svc.settings, services=svc)
    await svc.http.aclose()
    await svc.engine.dispose()


# --- Host, Origin and CSRF ------------------------------------------------------------


@pytest.mark.slow
async def test_foreign_host_is_refused_in_every_mode(client: httpx.AsyncClient, open_app) -> None:
    for app in (client._transport.app, open_app):  # type: ignore[attr-defined]
        async with _client(app, "evil.example", authorization=f"Bearer {TOKEN}") as c:
            for path in ("/api/v1/jobs", "/", "/api/v1/sessions/s1/messages"):
                resp = await c.get(path)
                assert resp.status_code == 421, path
                assert "SKILLJOBS_ALLOWED_HOSTS" in resp.json()["error"]
            # Health checks stay open (probes use the pod address).
            assert (await c.get("/healthz")).status_code == 200
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "app.localhost"):
        async with _client(client._transport.app, host, authorization=f"Bearer {TOKEN}") as c:  # type: ignore[attr-defined]
            assert (await c.get("/api/v1/jobs")).status_code == 200, host


@pytest.mark.slow
async def test_no_token_is_nobody_on_loopback_too(
    client: httpx.AsyncClient, open_app, services
) -> None:
    """No tokenless admin: without a configured token nothing is open, and with only the
    read-only token a caller presenting nothing gets 401, not admin."""
    for host in ("127.0.0.1", "localhost", "[::1]"):
        async with _client(open_app, host) as c:
            for path in ("/api/v1/jobs", "/api/v1/queue", "/metrics"):
                assert (await c.get(path)).status_code == 401, (host, path)
            put = await c.put("/api/v1/roles/r1/skills/demo/config", json={"a": 1})
            assert put.status_code == 401
    services.settings.api_read_token = SecretStr(READ_TOKEN)
    app = client._transport.app  # type: ignore[attr-defined]
    async with _client(app) as c:
        assert (await c.get("/api/v1/jobs")).status_code == 401
        put = await c.put("/api/v1/roles/r1/skills/demo/config", json={"a": 1})
        assert put.status_code == 401
    async with _client(app, authorization=f"Bearer {READ_TOKEN}") as c:
        assert (await c.get("/api/v1/jobs")).status_code == 200
        put = await c.put("/api/v1/roles/r1/skills/demo/config", json={"a": 1})
        assert put.status_code == 403


@pytest.mark.slow
async def test_configured_host_names_are_served(client: httpx.AsyncClient, services) -> None:
    services.settings.allowed_hosts = "ops.example.com, api.example.com"
    app = client._transport.app  # type: ignore[attr-defined]
    async with _client(app, "ops.example.com", authorization=f"Bearer {TOKEN}") as c:
        assert (await c.get("/api/v1/jobs")).status_code == 200
    async with _client(app, "evil.example", authorization=f"Bearer {TOKEN}") as c:
        assert (await c.get("/api/v1/jobs")).status_code == 421


@pytest.mark.slow
async def test_cross_site_writes_are_refused_without_a_token(open_app, services) -> None:
    async with _client(open_app) as c:
        job = "/api/v1/jobs/nope/retry"
        # A cross-site form: text/plain, no custom header.
        form = await c.post(job, content=b"x=1", headers={"content-type": "text/plain"})
        assert form.status_code == 403 and "X-Requested-With" in form.json()["error"]
        assert (await c.post(job)).status_code == 403  # body-less
        foreign = await c.post(job, json={}, headers={"origin": "https://evil.example"})
        assert foreign.status_code == 403 and "cross-origin" in foreign.json()["error"]
        site = await c.post(job, headers={"x-requested-with": "x", "sec-fetch-site": "cross-site"})
        assert site.status_code == 403
        # The page's own requests (JSON or the custom header, same origin) pass this check
        # and then need a token like any other caller.
        assert (await c.post(job, json={})).status_code == 401
        same = await c.post(
            job, headers={"x-requested-with": "skilljobs-dashboard", "origin": "http://127.0.0.1"}
        )
        assert same.status_code == 401
        # Reads from a foreign origin are refused too.
        assert (await c.get("/api/v1/jobs", headers={"origin": "null"})).status_code == 403


def test_the_page_marks_its_requests() -> None:
    from dashboard.app import STATIC

    js = (STATIC / "app.js").read_text()
    assert '"x-requested-with": "skilljobs-dashboard"' in js


# --- identities: read-only, per-session, audit ------------------------------------------


@pytest.mark.slow
async def test_read_token_reads_everything_and_changes_nothing(
    client: httpx.AsyncClient, services
) -> None:
    services.settings.api_read_token = SecretStr(READ_TOKEN)
    job = await seed_job(services, status="failed")
    app = client._transport.app  # type: ignore[attr-defined]
    async with _client(app, authorization=f"Bearer {READ_TOKEN}") as c:
        for path in ("/api/v1/jobs", f"/api/v1/jobs/{job.id}", "/api/v1/queue", "/metrics"):
            assert (await c.get(path)).status_code == 200, path
        for path in (f"/api/v1/jobs/{job.id}/retry", "/api/v1/sessions/s1/token"):
            resp = await c.post(path, json={})
            assert resp.status_code == 403 and "read" in resp.json()["error"], path
        put = await c.put("/api/v1/roles/r1/skills/demo/config", json={"a": 1})
        assert put.status_code == 403
    # The operator's retry is recorded as admin whatever X-Actor says.
    resp = await client.post(f"/api/v1/jobs/{job.id}/retry", headers={"x-actor": "mallory"})
    assert resp.status_code == 200
    audit = await _audit(services)
    assert ("refused", f"POST /api/v1/jobs/{job.id}/retry", "read") in audit
    assert ("retry", job.id, "admin") in audit
    assert not any("mallory" in actor for _, _, actor in audit)


@pytest.mark.slow
async def test_session_token_reads_its_own_session_only(
    client: httpx.AsyncClient, services
) -> None:
    sm = services.sessionmaker
    for sid in ("s1", "s2"):
        await web.ensure_session(sm, sid, role_id="r1", channel="web")
        await web.post_message(sm, None, services.settings, sid, f"hello {sid}")
    issued = await client.post("/api/v1/sessions/s1/token", json={"ttl_sec": 600})
    assert issued.status_code == 200, issued.text
    body = issued.json()
    assert body["session_id"] == "s1" and body["expires_at"] > time.time() + 500
    token = body["token"]
    app = client._transport.app  # type: ignore[attr-defined]
    async with _client(app, authorization=f"Bearer {token}") as c:
        own = await c.get("/api/v1/sessions/s1/messages")
        assert own.status_code == 200 and [m["text"] for m in own.json()["items"]] == ["hello s1"]
        for path in (
            "/api/v1/sessions/s2/messages",
            "/api/v1/sessions/s2/events",
            "/api/v1/jobs",
            "/api/v1/queue",
            "/metrics",
            "/api/v1/openapi.json",
        ):
            resp = await c.get(path)
            assert resp.status_code == 403 and "scoped to session 's1'" in resp.json()["error"]
        assert (await c.post("/api/v1/sessions/s1/token", json={})).status_code == 403
    # ?token= works on the event stream only (an EventSource cannot set headers).
    async with _client(app) as anon:
        assert (await anon.get(f"/api/v1/sessions/s1/messages?token={token}")).status_code == 401
        other = await anon.get(f"/api/v1/sessions/s2/events?token={token}")
        assert other.status_code == 403
    audit = await _audit(services)
    assert ("session_token", "s1", "admin") in audit
    assert ("refused", "GET /api/v1/jobs", "session:s1") in audit


@pytest.mark.slow
async def test_session_tokens_expire_and_cannot_be_forged(client: httpx.AsyncClient) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    key = app.state.token_key.get()
    expired, _ = tokens.issue(key, "s1", 60, now=time.time() - 120)
    forged, _ = tokens.issue(b"another key", "s1", 600)
    valid, _ = tokens.issue(key, "s1", 600)
    tampered = valid[:-2] + ("AA" if not valid.endswith("AA") else "BB")
    async with _client(app) as c:
        for bad in (expired, forged, tampered, "sjs1.garbage", "sjs1."):
            resp = await c.get(
                "/api/v1/sessions/s1/messages", headers={"authorization": f"Bearer {bad}"}
            )
            assert resp.status_code == 401, bad
    assert tokens.verify(key, valid) == tokens.Identity("session", "s1")
    assert (
        await client.post("/api/v1/sessions/s1/token", json={"ttl_sec": 10**9})
    ).status_code == 422


# --- numbers, bodies, documents -----------------------------------------------------------


async def test_numbers_out_of_range_and_non_finite_json_name_the_field(
    client: httpx.AsyncClient,
) -> None:
    for path, field in (
        (f"/api/v1/jobs?limit={BIG}", "limit"),
        (f"/api/v1/jobs?cursor={BIG}", "cursor"),
        (f"/api/v1/sessions/s1/messages?after_id={BIG}", "after_id"),
        (f"/api/v1/jobs/j1/artifacts/{BIG}", "path segment"),
    ):
        resp = await client.get(path)
        assert 400 <= resp.status_code < 500 and field in resp.json()["error"], path
    big = await client.post(
        "/api/v1/dispatch",
        content=b'{"skill": "echo", "input": {"n": ' + BIG.encode() + b"}}",
        headers={"content-type": "application/json"},
    )
    assert big.status_code == 422 and "input.n" in big.json()["error"]
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        resp = await client.post(
            "/api/v1/dispatch",
            content=b'{"skill": "echo", "input": {"rows": [1, ' + literal + b"]}}",
            headers={"content-type": "application/json"},
        )
        assert resp.status_code == 422, literal
        assert "input.rows[1]" in resp.json()["error"] and "non-finite" in resp.json()["error"]
    since = await client.get("/api/v1/jobs?since=inf")
    assert since.status_code == 422 and "since" in since.json()["error"]
    deep = await client.post(
        "/api/v1/dispatch", content=b"[" * 100_000, headers={"content-type": "application/json"}
    )
    assert deep.status_code in (400, 422)


@pytest.mark.slow
async def test_bodies_are_capped(client: httpx.AsyncClient, services) -> None:
    services.settings.max_request_mb = 2
    blob = b'{"skill": "echo", "input": {"t": "' + b"a" * (3 * 1024 * 1024) + b'"}}'
    resp = await client.post(
        "/api/v1/dispatch", content=blob, headers={"content-type": "application/json"}
    )
    assert resp.status_code == 413 and "2 MB" in resp.json()["error"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        for _ in range(3):
            yield b"a" * (1024 * 1024)

    streamed = await client.put(
        "/api/v1/roles/r1/skills/demo/config",
        content=chunks(),
        headers={"content-type": "application/json"},
    )
    assert streamed.status_code == 413 and "1 MB" in streamed.json()["error"]


async def test_openapi_needs_the_token(client: httpx.AsyncClient) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    async with _client(app) as anon:
        assert (await anon.get("/api/v1/openapi.json")).status_code == 401
    assert (await client.get("/api/v1/openapi.json")).status_code == 200


def _guard(app: Any) -> Guard:
    layer = app.middleware_stack
    while not isinstance(layer, Guard):
        layer = layer.app
    return layer


async def test_repeated_401s_slow_down(client: httpx.AsyncClient, services: Services) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    # The wait grows in steps of SKILLJOBS_WEB_AUTH_FAILURE_DELAY_SEC (0.25 s by default;
    # tests run with a millisecond step), here 0.1 s.
    assert Settings.model_fields["web_auth_failure_delay_sec"].default == 0.25
    services.settings.web_auth_failure_delay_sec = 0.1
    async with _client(app, authorization="Bearer guess") as c:
        took = []
        for _ in range(8):
            t0 = time.perf_counter()
            assert (await c.get("/api/v1/jobs")).status_code == 401
            took.append(time.perf_counter() - t0)
    # The answers were held back for real: the eighth waited (8 - 5) x 0.1 s.
    assert took[-1] >= 0.3
    failures = _guard(app).failures
    (address,) = failures.seen
    assert failures.seen[address][1] == 8
    # The right token is never slowed down: it is not counted as a failure.
    assert (await client.get("/api/v1/jobs")).status_code == 200
    assert failures.seen[address][1] == 8
    # Free answers first, then a growing wait, capped at eight steps (2 s by default).
    fresh = type(failures)()
    waits = [fresh.delay("203.0.113.9", 0.25) for _ in range(40)]
    assert waits[:5] == [0.0] * 5 and waits[5:8] == [0.25, 0.5, 0.75]
    assert max(waits) == waits[-1] == 2.0


def test_short_tokens_refuse_a_public_bind(tmp_path: Path) -> None:
    for kw in ({"api_token": "x" * 31}, {"api_token": "x" * 40, "api_read_token": "short"}):
        settings = make_settings(tmp_path, redis_url=None, prefix="x", **kw)
        with pytest.raises(UnsafeBind, match="at least 32"):
            check_bind(settings, "0.0.0.0")
        check_bind(settings, "127.0.0.1")


# --- real `skilljobs web` processes -------------------------------------------------------


@pytest.mark.slow
def test_a_200_mb_post_costs_the_web_process_no_memory(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    with WebProcess(tmp_path, sqlite_url, redis_server_url, redis_prefix) as proc:
        with proc.client() as c:  # warm up the paths the attack takes
            assert (
                c.get("/api/v1/jobs", headers={"authorization": f"Bearer {WEB_TOKEN}"}).status_code
                == 200
            )
        before = proc.status_kb("VmHWM")
        total = 200 * 1024 * 1024
        auth = {"Authorization": f"Bearer {WEB_TOKEN}", "Content-Type": "application/json"}
        plain = {"Content-Type": "application/json"}
        assert post_huge(proc.port, "/api/v1/dispatch", total, plain) == 401
        assert post_huge(proc.port, "/api/v1/dispatch", total, plain, chunked=True) == 401
        assert post_huge(proc.port, "/api/v1/dispatch", total, auth) == 413
        assert post_huge(proc.port, "/api/v1/dispatch", total, auth, chunked=True) == 413
        assert post_huge(proc.port, "/api/v1/jobs/x/retry", total, auth, chunked=True) == 413
        growth_mb = (proc.status_kb("VmHWM") - before) / 1024
        with proc.client() as c:
            assert c.get("/healthz").status_code == 200
            # DNS rebinding and a cross-site form, against the real server.
            rebound = c.get("/api/v1/jobs", headers={"host": "evil.example", **auth})
            assert rebound.status_code == 421
            form = c.post(
                "/api/v1/jobs/x/retry",
                content=b"a=1",
                headers={"content-type": "text/plain", "origin": "https://evil.example"},
            )
            assert form.status_code == 403
    assert growth_mb < 50, f"peak RSS grew by {growth_mb:.1f} MB"


@pytest.mark.slow
def test_half_open_connections_do_not_take_the_api_down(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    env = {"SKILLJOBS_WEB_HEADER_TIMEOUT_SEC": "3"}
    with WebProcess(
        tmp_path, sqlite_url, redis_server_url, redis_prefix, env=env, nofile=1024
    ) as proc:
        socks = half_open(proc.port, 1000)
        try:
            t0 = time.perf_counter()
            resp = httpx.get(proc.url + "/healthz", timeout=5)
            took = time.perf_counter() - t0
            # (taken down, it would answer only once the 3 s head deadline drops them)
            assert resp.status_code == 200 and took < 2.0, took
            # The slow ones are dropped once their head deadline passes (3 s after they
            # connected): each read ends as soon as the server closes the connection.
            deadline = time.monotonic() + 10
            closed = 0
            for s in socks[:50]:
                s.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    closed += s.recv(1) == b""
                except ConnectionResetError:
                    closed += 1
                except TimeoutError:
                    pass
            assert closed == 50
        finally:
            for s in socks:
                s.close()
        with proc.client() as c:
            assert c.get("/healthz").status_code == 200
    assert proc.log.stat().st_size < 100_000, proc.log.read_text()[-2000:]


@pytest.mark.slow
def test_web_refuses_a_public_bind_with_a_short_token(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
    env.update({"SKILLJOBS_DATA_DIR": str(tmp_path / "d"), "SKILLJOBS_API_TOKEN": "x"})
    done = subprocess.run(
        [sys.executable, "-m", "jobs.cli.app", "web", "--host", "0.0.0.0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "SKILLJOBS_API_TOKEN has 1 characters, at least 32" in done.stderr


async def test_readyz_says_what_is_down_without_internals(
    client: httpx.AsyncClient, services
) -> None:
    from redis.asyncio import Redis

    from tests.helpers.dashboard import free_port

    live = services.redis
    port = free_port()
    services.redis = Redis(host="127.0.0.1", port=port)  # nothing listens there
    try:
        ready = await client.get("/readyz")
    finally:
        await services.redis.aclose()
        services.redis = live
    assert ready.status_code == 503
    assert ready.json()["checks"] == {"redis": "unreachable", "database": "ok", "schema": "ok"}
    assert str(port) not in ready.text and "Error" not in ready.text


def _healthz_recovers(url: str, limit: float = 15.0) -> int:
    """``/healthz``'s status, asked until it is 200 or ``limit`` seconds have passed."""
    deadline = time.monotonic() + limit
    while True:
        try:
            status = httpx.get(url + "/healthz", timeout=5).status_code
        except httpx.HTTPError:
            status = 0
        if status == 200 or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


@pytest.mark.slow
def test_past_the_connection_cap_answers_are_a_fast_503(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    env = {"SKILLJOBS_WEB_MAX_CONNECTIONS": "16"}
    with WebProcess(tmp_path, sqlite_url, redis_server_url, redis_prefix, env=env) as proc:
        socks = half_open(proc.port, 20)
        try:
            t0 = time.perf_counter()
            resp = httpx.get(proc.url + "/healthz", timeout=5)
            assert resp.status_code == 503 and time.perf_counter() - t0 < 4.0  # not the 5 s timeout
        finally:
            for s in socks:
                s.close()
        assert _healthz_recovers(proc.url) == 200  # once the server has seen them closed


@pytest.mark.slow
def test_descriptor_exhaustion_is_logged_sparingly(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    with WebProcess(
        tmp_path, sqlite_url, redis_server_url, redis_prefix, nofile=200, nofile_hard=200
    ) as proc:
        socks = []
        try:
            for _ in range(400):  # past the hard limit: accept() fails with EMFILE
                try:
                    socks.append(half_open(proc.port, 1)[0])
                except OSError:
                    break
            time.sleep(3)
        finally:
            for s in socks:
                s.close()
        assert _healthz_recovers(proc.url) == 200  # once the server has seen them closed
    text = proc.log.read_text()
    # One line per interval, not thousands a second (nor a storm of retries at shutdown).
    assert text.count("out of system resource") <= 1, text[-3000:]
    assert len(text) < 30_000


@pytest.mark.slow
async def test_slow_bodies_time_out(client: httpx.AsyncClient, monkeypatch) -> None:
    import asyncio

    from dashboard import guard

    monkeypatch.setattr(guard, "BODY_TIMEOUT_S", 0.3)

    async def slow() -> AsyncIterator[bytes]:
        yield b'{"a": '
        await asyncio.sleep(1.0)
        yield b"1}"

    for ctype in ("application/json", "text/plain"):
        resp = await client.put(
            "/api/v1/roles/r1/skills/demo/config", content=slow(), headers={"content-type": ctype}
        )
        assert resp.status_code == 408, (ctype, resp.text)


def _exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send ``pieces`` one by one on one connection; everything the server sent until it
    closed the connection (or went quiet for 5 s)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return got


@pytest.mark.slow
def test_request_heads_are_capped_at_16_kib(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    with WebProcess(tmp_path, sqlite_url, redis_server_url, redis_prefix) as proc:
        start = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\n".encode()
        # One header of 20 KiB, at once and in 1 KiB pieces: refused, connection closed.
        big = start + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n"
        assert _exchange(proc.port, [big]).startswith(b"HTTP/1.1 431 ")
        pieces = [big[i : i + 1024] for i in range(0, len(big), 1024)]
        assert _exchange(proc.port, pieces).startswith(b"HTTP/1.1 431 ")
        # Many small headers adding up past the cap: the same.
        many = start + b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 90) for i in range(200))
        assert _exchange(proc.port, [many + b"\r\n"]).startswith(b"HTTP/1.1 431 ")
        # A 15 KiB head is served, and each head of a kept-alive connection is counted
        # on its own (three of 12 KiB in a row, in one send).
        # (the last head asks for the connection to be closed after its answer, so that
        # reading the answers does not wait out the keep-alive timeout)
        close = b"Connection: close\r\n"
        fine = start + close + b"X-Fine: " + b"c" * 15_000 + b"\r\n\r\n"
        assert _exchange(proc.port, [fine]).startswith(b"HTTP/1.1 200 ")
        twelve = start + b"X-K: " + b"d" * 12_000 + b"\r\n\r\n"
        last = start + close + b"X-K: " + b"d" * 12_000 + b"\r\n\r\n"
        answers = _exchange(proc.port, [twelve * 2 + last])
        assert answers.count(b"HTTP/1.1 200 ") == 3 and b" 431 " not in answers
        # A body is not part of the head: 100 kB sent with its head in one piece (answered
        # from the head: no token).
        body = b'{"skill": "echo", "input": {"text": "' + b"e" * 100_000 + b'"}}'
        post = (
            f"POST /api/v1/dispatch HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        assert _exchange(proc.port, [post + body]).startswith(b"HTTP/1.1 401 ")
        with proc.client() as c:
            assert c.get("/healthz").status_code == 200
