"""After a skill ran, a fault delays its finish and delivery, never fails them: Redis stopped
while results finish, a chat platform answering 500 for a while, a delivery whose worker
died. Real worker, real Redis (a private server, stopped and started on its own port), the
fake Telegram, both databases."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import select

from delivery.ledger import claim, ledger_key
from jobs.cli.embedded import EmbeddedRedis, free_port
from jobs.models import Delivery, Job, Worker
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.worker import build_worker
from jobs.services import Services
from tests.helpers.settings import ADMIN_AUTH

pytestmark = pytest.mark.integration

CHAT = "1001"
ORIGIN = {"channel": "telegram", "actor_key": CHAT, "role_id": "r1", "org_id": "o1"}

WAITING_SKILL = '''\
"""Print the text once the gate file exists (a long computation, as far as the worker knows)."""

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", required=True)
    parser.add_argument("--gate", required=True)
    args = parser.parse_args()
    while not os.path.exists(args.gate):
        time.sleep(0.02)
    print(args.text)


if __name__ == "__main__":
    main()
'''


def _skills(root: Path) -> Path:
    folder = root / "skills" / "wait_say"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: wait_say\ndescription: Prints a text once a gate file exists.\n"
        "async: true\nexec:\n  primary:\n    type: python\n    entry: wait_say.py\n---\n"
    )
    (folder / "wait_say.py").write_text(WAITING_SKILL)
    return root / "skills"


async def _until(check: Any, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {limit}s: {what}")


async def _jobs(svc: Services, ids: list[str]) -> dict[str, Job]:
    async with svc.sessionmaker() as s:
        return {j.id: j for j in (await s.scalars(select(Job).where(Job.id.in_(ids)))).all()}


async def _deliveries(svc: Services) -> list[Delivery]:
    async with svc.sessionmaker() as s:
        return list((await s.scalars(select(Delivery).order_by(Delivery.id))).all())


def _texts(tg: Any) -> Counter[str]:
    return Counter(str(m.get("text")) for m in tg.sent if m.get("chat_id") == CHAT)


@pytest.fixture
def settings(job_settings: Any, tmp_path: Path, tg: Any) -> Any:
    # trusted: the skill waits for a gate file the test holds outside its workspace
    job_settings.skills_path = f"trusted={_skills(tmp_path)}"
    job_settings.telegram_bot_token = SecretStr(tg.token)
    job_settings.telegram_api_base = tg.url
    job_settings.outbox_sweep_sec = 0.5
    job_settings.delivery_retry_base_sec = 0.2
    job_settings.delivery_retry_max_sec = 0.5
    return job_settings


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_redis_stopped_while_results_finish_fails_nothing(
    settings: Any, tmp_path: Path, tg: Any
) -> None:
    """Skills end while Redis is down: their jobs succeed and every result reaches its chat
    exactly once (the outbox's Redis calls are guarded; the database is the record)."""
    port = free_port()
    server = EmbeddedRedis(tmp_path / "r1", port=port, persist=False)
    settings.redis_url = server.start()
    gate = tmp_path / "go"
    svc = await Services.open(settings)
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        d = Dispatcher(svc)
        ids = []
        for n in range(4):
            res = await d.dispatch("wait_say", {"text": f"result {n}", "gate": str(gate)}, ORIGIN)
            assert res.status_code == 202, res.body
            ids.append(res.body["job_id"])

        async def all_running() -> bool:
            return all(j.status == "running" for j in (await _jobs(svc, ids)).values())

        await _until(all_running, 30, "every skill running")
        server.stop()  # Redis away: the skills finish now, their finishing stage meets it
        gate.write_text("go")

        async def all_sent() -> bool:
            rows = await _deliveries(svc)
            return len(rows) >= len(ids) and all(r.status == "sent" for r in rows)

        try:
            await _until(all_sent, 6, "delivered while Redis is down")
        except AssertionError:
            pass  # (parked in the database: sent once Redis is back)
        await asyncio.sleep(1.0)
        server = EmbeddedRedis(tmp_path / "r2", port=port, persist=False)
        server.start()
        await _until(all_sent, 30, "every result delivered")
        jobs = await _jobs(svc, ids)
        assert {j.status for j in jobs.values()} == {"succeeded"}, [j.error for j in jobs.values()]
        assert _texts(tg) == Counter(f"result {n}" for n in range(4))
        assert not task.done()
    finally:
        gate.write_text("go")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()
        await svc.close()
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_chat_outage_is_waited_out_without_a_worker_slot(
    settings: Any, tmp_path: Path, services_for: Any, tg: Any
) -> None:
    """Telegram answers 500 for 3 s: the results wait in the outbox (the jobs succeed at
    once, their slots free) and arrive once each after it recovers."""
    settings.worker_max_jobs = 1  # one slot: a send held in it would stall the second job
    svc = await services_for(settings)
    (tmp_path / "go").write_text("go")
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        tg.outage(3.0)
        d = Dispatcher(svc)
        ids = []
        for n in range(3):
            args = {"text": f"outage {n}", "gate": str(tmp_path / "go")}
            ids.append((await d.dispatch("wait_say", args, ORIGIN)).body["job_id"])

        async def all_done() -> bool:
            return {j.status for j in (await _jobs(svc, ids)).values()} == {"succeeded"}

        await _until(all_done, 20, "jobs finished during the outage")
        assert time.monotonic() < tg.outage_until  # finished while the chat was still down
        pending = [r for r in await _deliveries(svc) if r.status == "pending"]
        # the chat's head waits out the outage; the others queue behind it, in order
        assert pending and any("retrying in the outbox" in (r.error or "") for r in pending)

        async def all_sent() -> bool:
            rows = await _deliveries(svc)
            return len(rows) == 3 and all(r.status == "sent" for r in rows)

        await _until(all_sent, 30, "delivered after the outage")
        assert tg.refused > 0
        assert _texts(tg) == Counter(f"outage {n}" for n in range(3))
        assert any(r.retry_since is not None and r.tries >= 2 for r in await _deliveries(svc))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_outage_past_the_window_fails_with_the_reason_and_resends(
    settings: Any, tmp_path: Path, services_for: Any, tg: Any
) -> None:
    """An outage longer than the channel's window: ``failed`` with the reason, resendable;
    a resend after the platform is back delivers it once."""
    from delivery.custody import resend

    settings.delivery_retry_windows = {"telegram": 1.0}
    svc = await services_for(settings)
    (tmp_path / "go").write_text("go")
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:
        tg.outage(60.0)
        args = {"text": "long outage", "gate": str(tmp_path / "go")}
        job_id = (await Dispatcher(svc).dispatch("wait_say", args, ORIGIN)).body["job_id"]

        async def failed() -> bool:
            rows = await _deliveries(svc)
            return bool(rows) and rows[0].status == "failed"

        await _until(failed, 20, "given up after the window")
        (row,) = await _deliveries(svc)
        assert "gave up after" in (row.error or "") and "HTTP 5" in (row.error or "")
        assert row.tries >= 2 and row.content
        assert (await _jobs(svc, [job_id]))[job_id].status == "succeeded"
        tg.outage_until = 0.0
        out = await resend(svc, row.id, actor="test")
        assert out.ok, out.message
        assert _texts(tg) == Counter({"long outage": 1})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_delivery_of_a_dead_worker_is_redriven_within_10s(
    settings: Any, services_for: Any, tg: Any
) -> None:
    """A ``pending`` delivery whose claimant's worker died (its job over) is sent by another
    worker's outbox sweep within 10 s, once."""
    svc = await services_for(settings)
    job_id = "job-of-a-dead-worker"
    now = time.time()
    async with svc.sessionmaker() as s:
        s.add(Worker(id="gone:1:x", host="h", pid=1, last_heartbeat=now - 60))
        s.add(
            Job(
                id=job_id,
                skill="wait_say",
                status="succeeded",
                channel="telegram",
                actor_key=CHAT,
                role_id="r1",
                created_at=now - 60,
                finished_at=now - 30,
            )
        )
        await s.commit()
    recipient = f"telegram:{CHAT}"
    row = await claim(
        svc.sessionmaker,
        ledger_key(job_id, recipient, "text"),
        recipient=recipient,
        owner="gone:1:x#1",
        channel="telegram",
        job_id=job_id,
        content={"text": "orphaned result"},
    )
    assert row is not None
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    started = time.monotonic()
    try:

        async def sent() -> bool:
            return (await _deliveries(svc))[0].status == "sent"

        await _until(sent, 10, "the orphaned delivery sent")
        print(f"re-driven after {time.monotonic() - started:.1f} s")
        await asyncio.sleep(1.0)  # (a second sweep must not send it again)
        assert _texts(tg) == Counter({"orphaned result": 1})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()


@pytest.fixture
async def services_for() -> Any:
    opened: list[Services] = []

    async def open_(settings: Any) -> Services:
        svc = await Services.open(settings)
        opened.append(svc)
        return svc

    yield open_
    for svc in opened:
        if svc.redis is not None:
            keys = [
                k
                async for k in svc.redis.scan_iter(
                    count=1000, match=f"{svc.settings.redis_prefix}*"
                )
            ]
            if keys:
                await svc.redis.delete(*keys)
        await svc.close()


@pytest.mark.slow
async def test_stuck_pending_deliveries_show_in_the_default_views(
    settings: Any, services_for: Any
) -> None:
    """A delivery still ``pending`` past the bound is in the default deliveries list (with
    what to do), the queue summary and ``/metrics``; an ``unknown`` one says what to do."""
    import httpx

    from dashboard.app import create_app

    settings.delivery_pending_stale_sec = 0.5
    svc = await services_for(settings)
    recipient = f"telegram:{CHAT}"
    for item, owner in (("stuck", "w:1:a#1"), ("unsure", "w:1:a#1")):
        await claim(
            svc.sessionmaker,
            ledger_key("job-x", recipient, item),
            recipient=recipient,
            owner=owner,
            channel="telegram",
            job_id="job-x",
            item=item,
            content={"text": item},
        )
    async with svc.sessionmaker() as s:
        row = await s.scalar(select(Delivery).where(Delivery.item == "unsure"))
        assert row is not None
        row.status = "unknown"
        await s.commit()
    await asyncio.sleep(0.6)
    app = create_app(svc.settings, services=svc)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=ADMIN_AUTH
    ) as c:
        items = (await c.get("/api/v1/deliveries")).json()["items"]
        by_status = {d["status"]: d for d in items}
        assert set(by_status) == {"pending", "unknown"}
        assert "retried by itself" in by_status["pending"]["action"]
        assert "may have arrived" in by_status["unknown"]["action"]
        queue = (await c.get("/api/v1/queue")).json()
        assert queue["deliveries_pending_stale"] == 1
        assert queue["oldest_pending_delivery_age_s"] >= 0.5
        metrics = (await c.get("/metrics")).text
        assert "skilljobs_deliveries_pending_stale 1.0" in metrics


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_unknown_on_a_deduplicating_platform_is_resolved_by_itself(
    settings: Any, services_for: Any, fs: Any
) -> None:
    """Feishu answers nothing in time (its answers lost: the message did land): the
    delivery ends ``unknown``; the outbox repeats it under the same ``uuid``, Feishu drops
    the repeat and answers with the first message, and the row is ``sent`` — one message."""
    import httpx

    from delivery.channels.base import Courier
    from delivery.channels.registry import channels_for
    from delivery.ledger import Parcel, deliver_once

    settings.feishu_app_id = fs.app_id
    settings.feishu_app_secret = SecretStr(fs.app_secret)
    settings.feishu_api_base = fs.url
    svc = await services_for(settings)
    await svc.http.aclose()
    svc.http = httpx.AsyncClient(timeout=0.5)  # a short read timeout: the answers are late
    adapter = channels_for(svc)["feishu"]
    await adapter.send_text("ou_warmup", "token fetched before the answers go missing")
    fs.lose_delay = 1.5
    fs.lose_answers["/open-apis/im/v1/messages"] = 3  # every try of the send below
    recipient = "feishu:ou_x"

    async def send() -> str:
        return await adapter.send_text("ou_x", "a result that did land")

    out = await deliver_once(
        svc.sessionmaker,
        send,
        Courier(recipient, "tester#1", channel="feishu", job_id="job-u", backoff=0.05),
        Parcel(
            ledger_key("job-u", recipient, "text"),
            content={"text": "a result that did land"},
            dedup=True,
        ),
    )
    assert out["status"] == "unknown", out
    w = build_worker(svc, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    try:

        async def sent() -> bool:
            rows = [r for r in await _deliveries(svc) if r.recipient == recipient]
            return rows[0].status == "sent"

        await _until(sent, 20, "the unknown delivery resolved")
        (row,) = [r for r in await _deliveries(svc) if r.recipient == recipient]
        assert row.message_id and row.tries > 3  # the three lost tries, then the repeat
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()
    landed = [m for m in fs.sent if "did land" in str(m)]
    assert len(landed) == 1, landed
