"""The dashboard's limits card in headless Chromium against a real app, Redis and database:
a limit set from the page is what the API says, the tokens show, unset removes it, and a
read-only token sees no form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from dashboard.app import create_app
from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, _need_chromium
from tests.helpers.dashboard import TOKEN, LiveServer
from tests.helpers.settings import make_settings

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(180)]

READ_TOKEN = "limits-read-token-3f0a9c1d2e4b5a6c7d8e9f00"


@pytest.fixture
def env_settings(tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str):  # type: ignore[no-untyped-def]
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        api_token=TOKEN,
        limits={"org:*": 20},
    )
    s.api_read_token = SecretStr(READ_TOKEN)
    return s


@pytest.fixture
async def live(env_settings: Any, redis: Any) -> AsyncIterator[LiveServer]:
    async with LiveServer(create_app(env_settings)) as server:
        yield server


async def test_limits_card_sets_shows_and_unsets(live: LiveServer) -> None:
    _need_chromium()
    from playwright.async_api import async_playwright

    auth = {"authorization": f"Bearer {TOKEN}"}
    async with (
        httpx.AsyncClient(base_url=live.url, headers=auth, timeout=30) as http,
        async_playwright() as pw,
    ):
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            ctx = await browser.new_context(viewport={"width": 1360, "height": 900})
            page = await ctx.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("dialog", lambda d: d.accept())
            await page.goto(f"{live.url}/?token={TOKEN}#/workers")
            await page.wait_for_selector("#limits tbody tr[data-limit-key='org:*']")
            assert "SKILLJOBS_LIMITS" in (await page.text_content("#limits tbody") or "")
            await page.fill("#limit-form [name=key]", "skill:image_gen")
            await page.fill("#limit-form [name=rate]", "2/10s")
            await page.fill("#limit-form [name=concurrency]", "3")
            await page.click("#limit-form button[type=submit]")
            row = "#limits tbody tr[data-limit-key='skill:image_gen']"
            await page.wait_for_selector(row)
            text = await page.text_content(row) or ""
            assert "2/10s" in text and "3" in text and "set by admin" in text
            items = {i["key"]: i for i in (await http.get("/api/v1/limits")).json()["items"]}
            assert (items["skill:image_gen"]["rate"], items["skill:image_gen"]["concurrency"]) == (
                "2/10s",
                3,
            )
            await page.click(f"{row} button")
            await page.wait_for_selector(row, state="detached")
            keys = [i["key"] for i in (await http.get("/api/v1/limits")).json()["items"]]
            assert keys == ["org:*"]
            assert errors == []
            # the read-only token: the card, no form, no actions
            ro = await browser.new_context(viewport={"width": 1360, "height": 900})
            rpage = await ro.new_page()
            await rpage.goto(f"{live.url}/?token={READ_TOKEN}#/workers")
            await rpage.wait_for_selector("#limits tbody tr[data-limit-key='org:*']")
            assert not await rpage.is_visible("#limit-form")
        finally:
            await browser.close()
