"""Monotonic counters on /metrics: ``skilljobs_jobs_total{skill,status}`` and
``skilljobs_deliveries_total{channel,status}`` grow as the real worker records outcomes;
``skilljobs_pruned_total`` is a counter; the windowed gauges stay beside them."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from dashboard.app import create_app
from tests.helpers.jobs import dispatch, drain

pytestmark = pytest.mark.integration
TOKEN = "counter-test-token-0123456789"


async def _scrape(services) -> dict[str, dict]:
    services.settings.api_token = SecretStr(TOKEN)
    app = create_app(services.settings, services=services)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={"authorization": f"Bearer {TOKEN}"},
    ) as c:
        resp = await c.get("/metrics")
    assert resp.status_code == 200, resp.text
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = (family.type, s.value)
    return out


@pytest.mark.slow
async def test_counters_count_what_workers_record(services, tmp_path):
    for _ in range(2):
        await dispatch(services, "bg_sleep", {"seconds": 0})
    await dispatch(services, "bg_envfail")
    await drain(services)
    first = await _scrape(services)
    jobs = first["skilljobs_jobs_total"]
    assert jobs[(("skill", "bg_sleep"), ("status", "succeeded"))] == ("counter", 2)
    assert jobs[(("skill", "bg_envfail"), ("status", "failed"))] == ("counter", 1)
    # the jobs came from telegram, which is not configured here: each delivery failed
    deliveries = first["skilljobs_deliveries_total"]
    assert deliveries[(("channel", "telegram"), ("status", "failed"))][0] == "counter"
    failed_before = deliveries[(("channel", "telegram"), ("status", "failed"))][1]
    assert failed_before >= 2
    assert first["skilljobs_pruned_total"] == {} or all(
        t == "counter" for t, _ in first["skilljobs_pruned_total"].values()
    )
    assert "skilljobs_jobs_finished" in first  # the windowed gauge stays

    await dispatch(services, "bg_sleep", {"seconds": 0})
    await drain(services)
    second = await _scrape(services)
    assert second["skilljobs_jobs_total"][(("skill", "bg_sleep"), ("status", "succeeded"))][1] == 3
    again = second["skilljobs_deliveries_total"][(("channel", "telegram"), ("status", "failed"))]
    assert again[1] > failed_before


@pytest.mark.slow
async def test_pruned_total_is_a_counter(services):
    from jobs.models import OpsAction

    async with services.sessionmaker() as s:
        s.add(OpsAction(action="prune", target="retention", actor="pruner", details={"jobs": 3}))
        s.add(OpsAction(action="prune", target="retention", actor="pruner", details={"jobs": 2}))
        await s.commit()
    found = (await _scrape(services))["skilljobs_pruned_total"]
    assert found[(("kind", "jobs"),)] == ("counter", 5)


@pytest.mark.slow
async def test_grafana_dashboard_queries_metrics_we_export(services, repo_root):
    import json
    import re

    await dispatch(services, "bg_sleep", {"seconds": 0})
    await drain(services)
    exported = set(await _scrape(services))
    board = json.loads((repo_root / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert exprs
    for expr in exprs:
        for name in re.findall(r"\bskilljobs_[a-z_]+", expr):
            assert name in exported or name == "skilljobs_pruned_total", (name, expr)
