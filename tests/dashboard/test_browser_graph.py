"""The chain-run page draws the graph of a run (needs, for_each) with each node's state, in
headless Chromium against a real app, worker, Redis and SQLite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dashboard.app import create_app
from jobs.services import Services
from tests.chains.test_graph import DOUBLE, JOIN, LIST, NAP, _graph, _run
from tests.dashboard.test_browser import CHROMIUM, CHROMIUM_ARGS, _need_chromium
from tests.helpers.chains import write_skill
from tests.helpers.dashboard import LiveServer
from tests.helpers.inprocess import TOKEN, api, running_worker
from tests.helpers.settings import JOB_SKILLS, make_settings

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
async def svc(tmp_path: Path, redis_server_url: str, redis_prefix: str, sqlite_url: str):
    root = tmp_path / "graph_skills"
    for name, body in (("g_list", LIST), ("g_nap", NAP), ("g_double", DOUBLE), ("g_join", JOIN)):
        write_skill(root, name, body)
    s = await Services.open(
        make_settings(
            tmp_path,
            redis_url=redis_server_url,
            prefix=redis_prefix,
            database_url=sqlite_url,
            skills_path=os.pathsep.join([str(JOB_SKILLS), str(root)]),
            api_token=TOKEN,
        )
    )
    yield s
    assert s.redis is not None
    keys = [k async for k in s.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
    if keys:
        await s.redis.delete(*keys)
    await s.close()


async def test_chain_run_page_draws_the_graph(svc: Services, tmp_path: Path):
    _need_chromium()
    from playwright.async_api import async_playwright

    async with api(svc) as c, running_worker(svc):
        run = await _run(c, _graph("graph-page", tmp_path / "calls.log"), svc)
    assert run["status"] == "succeeded"
    async with LiveServer(create_app(svc.settings, services=svc)) as live, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1360, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            await page.goto(f"{live.url}/?token={TOKEN}#/chain-runs/{run['id']}")
            await page.wait_for_selector(
                "#chain-graph g.node[data-step=join][data-status=succeeded]"
            )
            nodes = await page.eval_on_selector_all(
                "#chain-graph g.node", "els => els.map(e => [e.dataset.step, e.dataset.status])"
            )
            assert sorted(nodes) == sorted(
                [[s, "succeeded"] for s in ("list", "a", "b", "each", "join")]
            )
            edges = await page.eval_on_selector_all(
                "#chain-graph path.edge", "els => els.map(e => [e.dataset.from, e.dataset.to])"
            )
            assert sorted(map(tuple, edges)) == sorted(
                [
                    ("list", "a"),
                    ("list", "b"),
                    ("list", "each"),
                    ("a", "join"),
                    ("b", "join"),
                    ("each", "join"),
                ]
            )
            each = await page.text_content("#chain-graph g.node[data-step=each]") or ""
            assert "3/3 items" in each
            # columns by depth: list, then a/b/each side by side, then join
            xs = await page.eval_on_selector_all(
                "#chain-graph g.node",
                "els => Object.fromEntries(els.map(e => [e.dataset.step, e.getBBox().x + "
                "e.transform.baseVal[0].matrix.e]))",
            )
            assert xs["list"] < xs["a"] == xs["b"] == xs["each"] < xs["join"]
            await page.screenshot(path=str(tmp_path / "dashboard-chain-graph.png"))
            assert errors == []
        finally:
            await browser.close()
