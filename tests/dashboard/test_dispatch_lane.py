"""The dispatch lane: valid dispatch bodies are answered before the router, exactly as the
route answers them; everything else still reaches the route."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select

from dashboard.app import create_app
from dashboard.dispatch_lane import DispatchLane
from jobs.catalog.loader import load_registry
from jobs.models import Job
from tests.helpers.dashboard import TOKEN

CTX = {"channel": "telegram", "actor_key": "12345", "role_id": "r1", "session_id": "s1"}
JSON = {"content-type": "application/json"}
BODIES: list[tuple[bytes, dict[str, str]]] = [
    (b'{"skill": "sales_report", "input": {"seconds": 0}, "context": %s}', JSON),
    (b'{"skill": "echo", "input": {"message": "hi"}, "context": %s}', JSON),
    (
        b'{"skill": "echo", "input": {"message": "hi"}, "context": %s}',
        {"content-type": "application/vnd.chat+json"},
    ),
    (b'{"skill": "nope", "context": %s}', JSON),
    (b'{"skill": "echo", "input": [1], "context": %s}', JSON),
    (b'{"skill": "", "context": %s}', JSON),
    (b'{"skill": "echo", "priority": 12, "context": %s}', JSON),
    (b'["skill", %s]', JSON),
    (b'{"skill": "echo", "context": %s', JSON),  # not JSON
    (b'{"skill": "echo", "context": %s}', {"content-type": "text/plain+json"}),
]


@pytest.fixture(autouse=True)
def _skills(services) -> None:
    services.registry = load_registry(services.settings.skill_dirs)


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}", "x-requested-with": "test"},
    )


def _without_lane(app: FastAPI) -> FastAPI:
    app.user_middleware = [m for m in app.user_middleware if m.cls is not DispatchLane]
    return app


def _comparable(resp: httpx.Response) -> tuple[int, Any, str]:
    body = resp.json()
    if isinstance(body, dict) and "job_id" in body:
        body["job_id"] = bool(body["job_id"])
    return resp.status_code, body, resp.headers["content-type"]


@pytest.mark.slow
async def test_the_lane_answers_as_the_route(services) -> None:
    ctx = repr(CTX).replace("'", '"').encode()
    lane = create_app(services.settings, services=services)
    route = _without_lane(create_app(services.settings, services=services))
    async with _client(lane) as a, _client(route) as b:
        for raw, headers in BODIES:
            body = raw.replace(b"%s", ctx)
            got = await a.post("/api/v1/dispatch", content=body, headers=headers)
            want = await b.post("/api/v1/dispatch", content=body, headers=headers)
            assert _comparable(got) == _comparable(want), body
            assert got.headers["x-content-type-options"] == "nosniff"  # still wrapped
    async with services.sessionmaker() as s:
        jobs = (await s.scalars(select(Job).where(Job.skill == "sales_report"))).all()
    assert len(jobs) == 2 and all(j.status == "queued" for j in jobs)


@pytest.mark.slow
async def test_only_valid_bodies_take_the_lane(services) -> None:
    app = create_app(services.settings, services=services)
    app.router.routes.clear()  # nothing but the middleware answers
    async with _client(app) as c:
        ok = await c.post(
            "/api/v1/dispatch",
            json={"skill": "sales_report", "input": {"seconds": 0}, "context": CTX},
        )
        assert ok.status_code == 202 and ok.json()["job_id"]
        # Refused fields, other bodies and callers without a token go on to the router
        # (which here has no routes).
        invalid = await c.post("/api/v1/dispatch", json={"skill": "", "context": CTX})
        assert invalid.status_code == 404
        listed = await c.post("/api/v1/dispatch", json=["skill"])
        assert listed.status_code == 404
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as anon:
        refused = await anon.post("/api/v1/dispatch", json={"skill": "echo", "context": CTX})
        assert refused.status_code == 401
