"""What keeps the dashboard fast on a large job table, on SQLite and PostgreSQL: text
search pages, the partial index of failures (migration 0012) and the shared aggregates'
freshness rule (``dashboard.shared``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import inspect

from dashboard import shared
from tests.helpers.dashboard import seed_job


async def _ids(client: httpx.AsyncClient, **params: Any) -> list[str]:
    out: list[str] = []
    cursor = None
    while True:
        page = {**params, "limit": 2, **({"cursor": cursor} if cursor else {})}
        resp = await client.get("/api/v1/jobs", params=page)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        out += [j["id"] for j in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return out


@pytest.mark.slow
async def test_text_search_pages(client: httpx.AsyncClient, services) -> None:
    """A text search pages newest first with the other fields and the time range
    applied, every page whole; text that matches nothing answers an empty page."""
    now = time.time()
    quota = [
        await seed_job(
            services,
            status="failed" if i % 2 else "timed_out",
            error=f"Quota exceeded ({i})",
            created_at=now - 100 + i,
        )
        for i in range(5)
    ]
    await seed_job(services, status="failed", error="connection reset", created_at=now - 10)
    by_session = await seed_job(services, session_id="sess-77", created_at=now - 5)

    newest_first = [j.id for j in reversed(quota)]
    assert await _ids(client, q="quota") == newest_first
    assert await _ids(client, q="quota", status="failed") == [
        j.id for j in reversed(quota) if j.status == "failed"
    ]
    assert await _ids(client, q="quota", since=now - 98) == newest_first[:3]
    assert await _ids(client, q="quota", until=now - 98) == newest_first[3:]
    assert await _ids(client, q="sess-77") == [by_session.id]
    assert await _ids(client, q="nothing like this") == []
    assert await _ids(client, q="nothing like this", since="1h") == []


@pytest.mark.slow
async def test_failures_have_their_partial_index(services) -> None:
    """Migration 0012 on both backends: the failures' index, limited to failed and timed
    out jobs, and the audit trail's index by action."""

    def read(sync_conn: Any) -> dict[str, Any]:
        insp = inspect(sync_conn)
        return {
            "jobs": {i["name"]: i for i in insp.get_indexes("jobs")},
            "ops": {i["name"]: i for i in insp.get_indexes("ops_actions")},
        }

    async with services.engine.connect() as conn:
        found = await conn.run_sync(read)
    failures = found["jobs"]["ix_jobs_failures_skill"]
    assert failures["column_names"] == ["skill", "status", "created_at"]
    where = str(
        failures.get("dialect_options", {}).get(
            "postgresql_where", failures.get("dialect_options", {}).get("sqlite_where", "")
        )
    )
    assert "failed" in where and "timed_out" in where
    assert found["ops"]["ix_ops_actions_action"]["column_names"] == ["action", "id"]


@pytest.mark.slow
async def test_bulk_dry_run_counts_failures_of_a_skill(client: httpx.AsyncClient, services) -> None:
    """The dry run the failures' index serves counts what the list shows."""
    now = time.time()
    for i, status in enumerate(["failed", "timed_out", "failed", "succeeded", "queued"]):
        await seed_job(services, skill="rare_one", status=status, created_at=now - 50 + i)
    await seed_job(services, skill="other", status="failed", created_at=now - 20)
    body = {"action": "retry", "filter": {"skill": "rare_one"}}
    dry = (await client.post("/api/v1/jobs/bulk", json=body)).json()
    assert dry["matched"] == 3 and dry["dry_run"] is True
    body = {"action": "retry", "filter": {"skill": "rare_one", "status": "failed"}}
    dry = (await client.post("/api/v1/jobs/bulk", json=body)).json()
    listed = await _ids(client, skill="rare_one", status="failed")
    assert dry["matched"] == 2 and sorted(dry["job_ids"]) == sorted(listed)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_shared_answers_follow_the_freshness_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(shared.time, "monotonic", clock)
    box = shared.Shared()
    calls = 0
    gate = asyncio.Event()
    gate.set()

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        return calls

    first = await box.get("k", 10.0, compute)
    assert (first.value, calls, first.max_age_s) == (1, 1, 30.0)
    clock.t += 9.9  # fresh: as it is, nothing recomputed
    assert (await box.get("k", 10.0, compute)).value == 1 and calls == 1
    clock.t += 0.2  # past the refresh: still the old answer, one recompute in background
    gate.clear()
    assert (await box.get("k", 10.0, compute)).value == 1
    assert (await box.get("k", 10.0, compute)).value == 1
    await asyncio.sleep(0)
    assert calls == 2  # one recompute, however many asked
    gate.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert (await box.get("k", 10.0, compute)).value == 2
    clock.t += 31.0  # past max_age: never served; the caller waits for a new one
    assert (await box.get("k", 10.0, compute)).value == 3
    # many callers at once with nothing usable: computed once
    clock.t += 31.0
    got = await asyncio.gather(*(box.get("k", 10.0, compute) for _ in range(4)))
    assert {a.value for a in got} == {4} and calls == 4
    await box.close()


@pytest.mark.slow
async def test_overview_and_charts_say_how_fresh_they_are(client: httpx.AsyncClient) -> None:
    q = (await client.get("/api/v1/queue")).json()
    assert q["summary"]["max_age_s"] > 0 and abs(q["summary"]["as_of"] - time.time()) < 60
    ts = (await client.get("/api/v1/stats/timeseries?window=1h")).json()
    # as_of is read as the computation starts, now inside it: the same moment to the ms or so
    assert abs(ts["as_of"] - ts["now"]) < 1 and ts["max_age_s"] == 15.0
