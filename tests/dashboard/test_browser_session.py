"""The page's browser session: ``POST /api/v1/session`` with the token sets an HttpOnly,
SameSite=Strict cookie every request of that browser then carries; a changed token or a
forged cookie grants nothing; ``DELETE`` signs out."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

from dashboard.app import create_app
from tests.helpers.dashboard import TOKEN

pytestmark = pytest.mark.integration
READ = "read-only-token-for-the-cookie-test-0123"


def _anonymous(services) -> httpx.AsyncClient:
    app = create_app(services.settings, services=services)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


@pytest.mark.slow
async def test_cookie_signs_every_request_in(services) -> None:
    async with _anonymous(services) as c:
        assert (await c.get("/api/v1/me")).status_code == 401
        signed = await c.post(
            "/api/v1/session",
            headers={"authorization": f"Bearer {TOKEN}", "x-requested-with": "t"},
        )
        assert signed.status_code == 200, signed.text
        assert signed.json()["kind"] == "admin"
        header = signed.headers["set-cookie"].lower()
        assert "httponly" in header and "samesite=strict" in header and "max-age" not in header
        assert TOKEN.lower() not in header
        me = await c.get("/api/v1/me")  # the cookie alone
        assert me.status_code == 200 and me.json()["can_change"] is True
        # an action with the cookie: the guard's same-origin rules still apply
        assert (await c.post("/api/v1/skills/nope/pause", json={})).status_code == 404
        out = await c.request("DELETE", "/api/v1/session", headers={"x-requested-with": "t"})
        assert out.status_code == 200
        c.cookies.clear()
        assert (await c.get("/api/v1/me")).status_code == 401


@pytest.mark.slow
async def test_read_token_session_and_revocation(services) -> None:
    services.settings.api_read_token = SecretStr(READ)
    async with _anonymous(services) as c:
        signed = await c.post(
            "/api/v1/session", headers={"authorization": f"Bearer {READ}", "x-requested-with": "t"}
        )
        assert signed.status_code == 200 and signed.json()["kind"] == "read"
        assert (await c.get("/api/v1/me")).json()["can_change"] is False
        assert (await c.post("/api/v1/skills/x/pause", json={})).status_code == 403
        # the token changes: the cookie made from the old one grants nothing
        services.settings.api_read_token = SecretStr(READ + "-rotated")
        assert (await c.get("/api/v1/me")).status_code == 401
    async with _anonymous(services) as c:
        c.cookies.set("skilljobs_session", "sjb1.eyJrIjoiYWRtaW4ifQ.forged")
        assert (await c.get("/api/v1/me")).status_code == 401
        bad = await c.post("/api/v1/session", headers={"authorization": "Bearer wrong"})
        assert bad.status_code == 401


@pytest.mark.slow
async def test_me_names_the_configured_language(client, services) -> None:
    got = (await client.get("/api/v1/session")).json()
    assert got["language"] is None and got["browser_session"] is False  # a bearer token
    services.settings.language = "zh"
    assert (await client.get("/api/v1/session")).json()["language"] == "zh"
