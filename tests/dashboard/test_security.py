"""Dashboard access and exposure: tokens, secret redaction, escaping, headers, live streams."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from dashboard.app import CSP, STATIC, create_app
from dashboard.server import UnsafeBind, check_bind, is_loopback, serve
from jobs.models import Artifact, ChainRun, ChainStep, Delivery, JobAttempt, Schedule
from tests.helpers.dashboard import TOKEN, LiveServer, free_port, seed_job, seed_rows
from tests.helpers.settings import make_settings

PROTECTED = [
    "/api/v1/jobs",
    "/api/v1/jobs/x",
    "/api/v1/queue",
    "/api/v1/workers",
    "/api/v1/schedules",
    "/api/v1/roles/r1/skills/demo/config",
    "/api/v1/sessions/s1/messages",
    "/metrics",
]


async def test_token_required_everywhere_but_health(client: httpx.AsyncClient) -> None:
    transport = client._transport
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as anon:
        for path in PROTECTED:
            resp = await anon.get(path)
            assert resp.status_code == 401, path
            body = resp.json()
            assert body["ok"] is False and "token" in body["error"], path
            assert resp.headers["www-authenticate"] == "Bearer"
            wrong = await anon.get(path, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"] == "the API token is wrong"
        for path in ("/api/v1/jobs/x/retry", "/api/v1/dispatch", "/api/v1/schedules/x/run"):
            assert (await anon.post(path, json={})).status_code == 401, path
        # ?token= is for event streams only, not for the JSON API
        assert (await anon.get("/api/v1/jobs", params={"token": TOKEN})).status_code == 401
        assert (await anon.get("/healthz")).status_code == 200
        assert (await anon.get("/readyz")).status_code == 200
        page = await anon.get("/")
        assert page.status_code == 200 and TOKEN not in page.text
    assert (await client.get("/api/v1/jobs")).status_code == 200
    assert (await client.get("/metrics")).status_code == 200


async def test_without_a_token_nothing_is_open_on_loopback(
    tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str
) -> None:
    from tests.helpers.dashboard import make_services

    svc = await make_services(
        tmp_path, sqlite_url, redis_server_url, redis_prefix, None, api_token=None
    )
    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        assert (await c.get("/api/v1/jobs")).status_code == 401
    await svc.engine.dispose()


def test_serve_refuses_public_bind_without_token(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, redis_url=None, prefix="x", api_token=None)
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert is_loopback(host)
        check_bind(settings, host)
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.org"):
        with pytest.raises(UnsafeBind, match="SKILLJOBS_API_TOKEN") as err:
            check_bind(settings, host)
        assert "\n" not in str(err.value)
    check_bind(make_settings(tmp_path, redis_url=None, prefix="x", api_token="t" * 32), "0.0.0.0")
    with pytest.raises(UnsafeBind):  # refused before anything is bound
        serve(settings, host="0.0.0.0", port=free_port())


SECRET = "sk-live-4f9a1c2e7d"


@pytest.mark.slow
async def test_secrets_never_appear_in_any_response(client: httpx.AsyncClient, services) -> None:
    box = services.box
    sealed_input = box.seal({"prompt": "hi", "api_key": SECRET, "opts": {"password": SECRET}})
    sealed_ctx = box.seal(
        {"skill_configs": {"demo": {"access_token": SECRET}}, "feishu_app_secret": SECRET}
    )
    ciphertexts = re.findall(r'"\$enc": "([^"]+)"', json.dumps([sealed_input, sealed_ctx]))
    assert ciphertexts
    # one stored sealed (as the dispatcher does), one stored in plain text by mistake
    job = await seed_job(
        services,
        status="failed",
        input=sealed_input,
        context=sealed_ctx,
        result={"ok": False, "auth_header": SECRET, "rows": [{"secret": SECRET}]},
        error="upstream refused",
    )
    plain = await seed_job(services, input={"token": SECRET}, context={"Api-Key": SECRET})
    sched = Schedule(name="s", cron="0 9 * * *", steps=[{"skill": "demo"}])
    await seed_rows(services, sched)
    run = ChainRun(schedule_id=sched.id, fire_key="manual:1", fire_at=time.time())
    await seed_rows(services, run)
    await seed_rows(
        services,
        JobAttempt(job_id=job.id, number=1, outcome="failed", error="upstream refused"),
        ChainStep(
            run_id=run.id, idx=0, step_id="a", skill="demo", input={"api_token": SECRET}, output={}
        ),
    )

    bodies = []
    for path in (
        "/api/v1/jobs",
        f"/api/v1/jobs/{job.id}",
        f"/api/v1/jobs/{plain.id}",
        "/api/v1/jobs?q=upstream",
        "/api/v1/queue",
        "/metrics",
        "/api/v1/schedules",
        f"/api/v1/schedules/{sched.id}/runs",
        f"/api/v1/chain-runs/{run.id}",
    ):
        resp = await client.get(path)
        assert resp.status_code == 200, (path, resp.text)
        bodies.append(resp.text)
    text = "\n".join(bodies)
    assert SECRET not in text
    for c in ciphertexts:
        assert c not in text
    assert "$enc" not in text
    detail = json.loads(bodies[1])
    assert detail["input"]["prompt"] == "hi" and detail["input"]["api_key"] == "••••••"
    assert detail["context"]["skill_configs"]["demo"]["access_token"] == "••••••"


@pytest.mark.slow
async def test_skill_output_is_data_never_markup(client: httpx.AsyncClient, services) -> None:
    evil = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    job = await seed_job(services, skill="demo", result={"message": evil}, error=evil)
    resp = await client.get(f"/api/v1/jobs/{job.id}")
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json()["result"]["message"] == evil  # shown verbatim, as text
    page = await client.get("/")
    for r in (resp, page):
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "inline script in the page"
    assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler in the page"
    js = (STATIC / "app.js").read_text()
    # data reaches the DOM through textContent only
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in js, sink
    for asset in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert asset.startswith(("/static/", "data:")), f"non-local asset {asset}"


@pytest.mark.slow
async def test_artifact_symlink_out_of_workspace_is_refused(
    client: httpx.AsyncClient, services, tmp_path: Path
) -> None:
    root = services.settings.resolved_workspace_root
    root.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "private.txt"
    target.write_text("private")
    link = root / "innocent.txt"
    link.symlink_to(target)
    job = await seed_job(services)
    art = Artifact(job_id=job.id, filename="innocent.txt", local_path=str(link))
    await seed_rows(services, art)
    resp = await client.get(f"/api/v1/jobs/{job.id}/artifacts/{art.id}")
    assert resp.status_code == 403 and "private" not in resp.text


async def _read_events(url: str, headers: dict[str, str], want: int) -> list[tuple[str, dict]]:
    events: list[tuple[str, dict]] = []
    async with (
        httpx.AsyncClient(timeout=10) as http,
        http.stream("GET", url, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = None
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name:
                events.append((name, json.loads(line[6:])))
                if len(events) >= want:
                    return events
    return events


@pytest.mark.slow
async def test_job_event_stream_takes_query_token(services) -> None:
    """Published events are hints: the stream sends each job's stored status and skill,
    and drops events for jobs that do not exist."""
    await seed_job(services, id="j1", status="running", skill="d")
    await seed_job(services, id="j2", status="succeeded", skill="d")
    app = create_app(services.settings, services=services)
    channel = services.settings.key("events:jobs")
    async with LiveServer(app) as live:
        async with httpx.AsyncClient() as http:
            denied = await http.get(f"{live.url}/api/v1/events")
            assert denied.status_code == 401
            denied = await http.get(f"{live.url}/api/v1/events", params={"token": "bad"})
            assert denied.status_code == 401
        reader = asyncio.create_task(
            _read_events(f"{live.url}/api/v1/events?token={TOKEN}", {}, want=2)
        )
        deadline = time.monotonic() + 15
        while await services.redis.publish(channel, "not json") == 0:  # until it subscribed
            assert time.monotonic() < deadline, "the event stream never subscribed"
            await asyncio.sleep(0.05)
        await services.redis.publish(channel, json.dumps({"id": "ghost", "status": "failed"}))
        await services.redis.publish(channel, json.dumps({"status": "no id"}))
        await services.redis.publish(
            channel, json.dumps({"id": "j1", "status": "succeeded", "skill": "x", "x": "<b>"})
        )
        await services.redis.publish(channel, json.dumps({"id": "j2"}))
        events = await asyncio.wait_for(reader, 10)
        # the client went away: the stream's subscription is released
        deadline = time.monotonic() + 15
        while (await services.redis.pubsub_numsub(channel))[0][1] != 0:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert (await services.redis.pubsub_numsub(channel))[0][1] == 0
    assert events == [
        ("job", {"id": "j1", "status": "running", "skill": "d"}),
        ("job", {"id": "j2", "status": "succeeded", "skill": "d"}),
    ]


@pytest.mark.slow
async def test_session_event_stream_pushes_stored_messages(services) -> None:
    from delivery.channels import web

    app = create_app(services.settings, services=services)
    await web.ensure_session(services.sessionmaker, "sess-1", role_id="r1", channel="web")
    async with LiveServer(app) as live:
        reader = asyncio.create_task(
            _read_events(
                f"{live.url}/api/v1/sessions/sess-1/events",
                {"authorization": f"Bearer {TOKEN}"},
                want=1,
            )
        )
        channel = services.settings.key("session", "sess-1")
        deadline = time.monotonic() + 15
        while not (await services.redis.pubsub_numsub(channel))[0][1]:
            assert time.monotonic() < deadline, "the event stream never subscribed"
            await asyncio.sleep(0.05)
        msg = await web.post_message(
            services.sessionmaker, services.redis, services.settings, "sess-1", "done <b>x</b>"
        )
        events = await asyncio.wait_for(reader, 10)
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}) as http:
            listed = (await http.get(f"{live.url}/api/v1/sessions/sess-1/messages")).json()
    assert events == [("message", msg)]
    assert listed["items"] == [msg]


@pytest.mark.slow
async def test_failed_delivery_error_is_listed_verbatim(
    client: httpx.AsyncClient, services
) -> None:
    job = await seed_job(services)
    await seed_rows(
        services,
        Delivery(
            ledger_key="x",
            job_id=job.id,
            recipient="telegram:1",
            channel="telegram",
            status="failed",
            error="<i>chat not found</i>",
        ),
    )
    q = (await client.get("/api/v1/queue")).json()
    assert q["deliveries_failing"]["latest"][0]["error"] == "<i>chat not found</i>"


@pytest.mark.slow
def test_web_without_a_configured_token_generates_one(
    tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str
) -> None:
    """`skilljobs web` with no token configured is not open: it keeps a generated admin
    token (0600) in the data dir, and a loopback caller without it gets 401."""
    import stat

    from tests.helpers.web import WebProcess

    env = {"SKILLJOBS_API_TOKEN": ""}
    with WebProcess(tmp_path, sqlite_url, redis_server_url, redis_prefix, env=env) as proc:
        path = tmp_path / "data" / "api_token"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = path.read_text().strip()
        assert len(token) >= 32
        with proc.client() as c:
            assert c.get("/api/v1/jobs").status_code == 401
            assert c.get("/api/v1/jobs", headers={"x-real-ip": "127.0.0.1"}).status_code == 401
            auth = {"authorization": f"Bearer {token}"}
            assert c.get("/api/v1/jobs", headers=auth).status_code == 200
