"""Post-processing end to end: a finished job's result and files reach its origin once."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from sqlalchemy import select

from delivery.channels.web import ensure_session, list_messages
from delivery.pipeline import postprocess
from delivery.router import failure_text, origin_of
from jobs.crypto import SecretBox, load_or_create_key
from jobs.models import Artifact, Delivery, Job
from jobs.services import Services
from jobs.skill import SkillRegistry
from tests.fakes.sink import FakeFiles
from tests.helpers.settings import FAKE_SKILLS, make_settings

PDF = b"%PDF-1.4\n" + os.urandom(3000)
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + os.urandom(600)


@pytest.fixture
def cdn():
    with FakeFiles() as server:
        yield server


@pytest.fixture
async def services(
    tmp_path, engine, sessionmaker, redis, redis_prefix, redis_server_url, tg, fs, cdn
):
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        feishu_app_id=fs.app_id,
        feishu_app_secret=fs.app_secret,
        feishu_api_base=fs.url,
        fetch_allow_hosts=f"127.0.0.1:{cdn.port}",
    )
    svc = Services(
        settings=s,
        engine=engine,
        sessionmaker=sessionmaker,
        box=SecretBox(load_or_create_key(tmp_path, None)),
        registry=SkillRegistry(),
        redis=redis,
        http=httpx.AsyncClient(timeout=10),
    )
    yield svc
    await svc.http.aclose()


async def always() -> bool:
    return True


async def never() -> bool:
    return False


async def make_job(services, **origin) -> Job:
    values = {
        "skill": "sales_report",
        "role_id": "r1",
        "session_id": "s1",
        "channel": "telegram",
        "actor_key": "1001",
        "lease_owner": "w1",
        "lease_token": 1,
        "status": "running",
    }
    values.update(origin)
    job = Job(**values)
    async with services.sessionmaker() as s:
        s.add(job)
        await s.commit()
    ws = services.settings.resolved_workspace_root / job.role_id / (job.session_id or "shared")
    ws.mkdir(parents=True, exist_ok=True)
    return job


def workspace(services, job):
    return services.settings.resolved_workspace_root / job.role_id / (job.session_id or "shared")


async def ledger_rows(services):
    async with services.sessionmaker() as s:
        return (await s.execute(select(Delivery).order_by(Delivery.id))).scalars().all()


@pytest.mark.slow
async def test_file_artifact_to_telegram_once(services, tg) -> None:
    job = await make_job(services)
    (workspace(services, job) / "report.pdf").write_bytes(PDF)
    result = {"message": "Your sales report", "filename": "report.pdf"}
    post = await postprocess(services, job, result, fence=always)
    assert post.deliveries == [
        {"recipient": "telegram:1001", "kind": "file", "status": "sent", "error": None}
    ]
    (doc,) = tg.sent
    assert doc["method"] == "sendDocument" and doc["content"] == PDF
    assert doc["caption"] == "Your sales report" and doc["filename"] == "report.pdf"
    assert post.result["ok"] is True
    assert post.result["local_path"].endswith("report.pdf")
    async with services.sessionmaker() as s:
        (art,) = (await s.execute(select(Artifact))).scalars().all()
    assert (art.filename, art.media, art.size) == ("report.pdf", "file", len(PDF))
    # a re-run of the job (new attempt) sends nothing twice and keeps one artifact row
    job.lease_owner, job.lease_token = "w2", 2
    again = await postprocess(services, job, result, fence=always)
    assert len(tg.sent) == 1
    assert again.deliveries[0]["status"] == "sent"
    async with services.sessionmaker() as s:
        assert len((await s.execute(select(Artifact))).scalars().all()) == 1
    assert len(await ledger_rows(services)) == 1


@pytest.mark.slow
async def test_fake_success_flip_sends_a_short_failure_text(services, tg) -> None:
    job = await make_job(services)
    (workspace(services, job) / "partial.png").write_bytes(PNG)
    post = await postprocess(
        services,
        job,
        {"success": False, "error": "upstream API is down", "filename": "partial.png"},
        fence=always,
    )
    assert post.result["ok"] is False
    assert [d["kind"] for d in post.deliveries] == ["text"]
    assert tg.sent[0]["text"] == "Sorry, sales_report could not finish: upstream API is down."
    assert post.artifacts == []


def test_failure_text_hides_traces_and_admin_hints() -> None:
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nKeyError: 1'
    # the exception's message, never the trace (C26)
    assert (
        failure_text("s", {"ok": False, "error": trace})
        == "Sorry, s could not finish: KeyError: 1."
    )
    assert failure_text("s", {"ok": False, "error": '  File "x.py", line 1'}) == (
        "Sorry, s could not finish. You can try again in a moment."
    )
    t = failure_text("s", {"ok": False, "error": "quota exceeded, please contact an administrator"})
    assert t == "Sorry, s could not finish: quota exceeded."
    assert "admin" not in t
    t = failure_text("s", {"ok": False, "error_type": "config", "needs_config": ["API_KEY"]})
    assert "missing: API_KEY" in t
    assert len(failure_text("s", {"ok": False, "error": "x" * 5000})) < 700


@pytest.mark.slow
async def test_text_only_and_empty_results(services, tg) -> None:
    job = await make_job(services)
    await postprocess(services, job, {"result": "42 orders today"}, fence=always)
    job2 = await make_job(services)
    await postprocess(services, job2, {"ok": True, "rows": 3}, fence=always)
    job3 = await make_job(services)
    await postprocess(services, job3, {"ok": True}, fence=always)
    # content is rendered, never "finished" (C3); only an empty result gets the fallback
    assert [m["text"] for m in tg.sent] == [
        "42 orders today",
        "rows: 3",
        "sales_report finished.",
    ]


@pytest.mark.slow
async def test_web_and_orgdeleg_sessions_get_stored_messages(services, sessionmaker) -> None:
    await ensure_session(sessionmaker, "s1", "r1", "", "web", "")
    job = await make_job(services, channel="web", actor_key="")
    (workspace(services, job) / "chart.png").write_bytes(PNG)
    post = await postprocess(
        services, job, {"message": "Here", "images": ["chart.png", "chart.png"]}, fence=always
    )
    assert post.deliveries == [
        {"recipient": "web:s1", "kind": "image", "status": "sent", "error": None}
    ]
    (msg,) = await list_messages(sessionmaker, "s1")
    assert msg["text"] == "Here" and msg["job_id"] == job.id
    assert msg["attachments"][0]["filename"] == "chart.png"
    # the message and its ledger row commit together: a re-run stores nothing more
    job.lease_owner, job.lease_token = "w9", 9
    rerun = await postprocess(
        services, job, {"message": "Here", "images": ["chart.png"]}, fence=always
    )
    assert rerun.deliveries[0]["status"] == "sent"
    assert len(await list_messages(sessionmaker, "s1")) == 1
    assert len(await ledger_rows(services)) == 1
    lost = await postprocess(
        services, await make_job(services, channel="web"), {"message": "late"}, fence=never
    )
    assert lost.deliveries == [] and len(await list_messages(sessionmaker, "s1")) == 1
    # orgdeleg: a third-party channel whose session is delegated goes to the session too
    await ensure_session(sessionmaker, "s2", "r1", "", "feishu", "orgdeleg:o1")
    job2 = await make_job(
        services, channel="feishu", session_id="s2", actor_key="ou_x", external_id="orgdeleg:o1"
    )
    post2 = await postprocess(services, job2, {"message": "delegated"}, fence=always)
    assert post2.deliveries[0]["recipient"] == "web:s2"
    assert (await list_messages(sessionmaker, "s2"))[0]["text"] == "delegated"
    # an unknown session is a failed delivery, not a silent success
    job3 = await make_job(services, channel="web", session_id="gone")
    post3 = await postprocess(services, job3, {"message": "x"}, fence=always)
    assert post3.deliveries[0]["status"] == "failed"
    assert "unknown session 'gone'" in post3.deliveries[0]["error"]


@pytest.mark.slow
async def test_undeliverable_origins_are_recorded(services) -> None:
    job = await make_job(services, actor_key="")
    post = await postprocess(services, job, {"message": "x"}, fence=always)
    assert post.deliveries == [
        {
            "recipient": "telegram:",
            "kind": "text",
            "status": "failed",
            "error": "no telegram recipient: the job has no actor_key",
        }
    ]
    job2 = await make_job(services, channel="wecom", actor_key="zhangsan")
    post2 = await postprocess(services, job2, {"message": "x"}, fence=always)
    assert post2.deliveries[0]["error"] == "channel 'wecom' is not configured"
    assert origin_of(job2).recipient == "wecom:zhangsan"
    assert len(await ledger_rows(services)) == 2


@pytest.mark.slow
async def test_lost_lease_sends_and_stores_nothing(services, tg) -> None:
    job = await make_job(services)
    (workspace(services, job) / "report.pdf").write_bytes(PDF)
    post = await postprocess(services, job, {"message": "m", "filename": "report.pdf"}, fence=never)
    assert post.deliveries == [] and tg.sent == []
    async with services.sessionmaker() as s:
        assert (await s.execute(select(Artifact))).scalars().all() == []


@pytest.mark.slow
async def test_feishu_text_first_then_media(services, fs) -> None:
    job = await make_job(services, channel="feishu", actor_key="ou_abc")
    ws = workspace(services, job)
    (ws / "a.png").write_bytes(PNG)
    (ws / "b.pdf").write_bytes(PDF)
    post = await postprocess(
        services,
        job,
        {"message": "two files", "images": ["a.png"], "files": ["b.pdf"]},
        fence=always,
    )
    assert [d["kind"] for d in post.deliveries] == ["text", "image", "file"]
    assert all(d["status"] == "sent" for d in post.deliveries)
    assert [m["msg_type"] for m in fs.sent] == ["text", "image", "file"]
    assert fs.files[fs.sent[2]["content"]["file_key"]][2] == PDF


@pytest.mark.slow
async def test_remote_image_materialized_and_sent_once(services, tg, cdn) -> None:
    cdn.files["/pic.png"] = (PNG, "image/png")
    url = f"http://127.0.0.1:{cdn.port}/pic.png"
    job = await make_job(services)
    post = await postprocess(
        services, job, {"message": f"Chart:\n![chart]({url})", "image_url": url}, fence=always
    )
    assert [f["status"] for f in post.fetches] == ["downloaded"]
    assert [d["kind"] for d in post.deliveries] == ["image"]
    (photo,) = tg.sent  # the Markdown image is the same URL: not sent a second time
    assert photo["method"] == "sendPhoto" and photo["content"] == PNG
    assert photo["caption"] == "Chart:"


@pytest.mark.slow
async def test_too_big_media_failure_keeps_the_text(services, tg) -> None:
    job = await make_job(services)
    huge = workspace(services, job) / "huge.mp4"
    huge.write_bytes(b"")
    os.truncate(huge, 51 * 1024 * 1024)
    post = await postprocess(
        services, job, {"message": "video ready", "filename": "huge.mp4"}, fence=always
    )
    assert [(d["kind"], d["status"]) for d in post.deliveries] == [
        ("video", "failed"),
        ("text", "sent"),
    ]
    assert "file too large for telegram" in post.deliveries[0]["error"]
    assert tg.sent[0]["text"] == "video ready"


# --- through the real worker ------------------------------------------------------------


@pytest.mark.slow
async def test_worker_delivers_a_background_result_to_telegram(
    tmp_path, database_url, redis_server_url, redis_prefix, tg
) -> None:
    from jobs.queue.dispatcher import Dispatcher
    from jobs.queue.worker import build_worker

    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(FAKE_SKILLS),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
    )
    svc = await Services.open(s)
    try:
        origin = {
            "channel": "telegram",
            "actor_key": "1001",
            "role_id": "r1",
            "session_id": "chat-7",
            "org_id": "o1",
        }
        res = await Dispatcher(svc).dispatch("bg_report", {"message": "Sales for Monday"}, origin)
        assert res.status_code == 202, res.body
        job_id = res.body["job_id"]
        w = build_worker(svc, burst=True, handle_signals=False, scheduler=False)
        try:
            await asyncio.wait_for(w.async_run(), 60)
        finally:
            await w.close()
        (doc,) = tg.sent
        assert doc["method"] == "sendDocument" and doc["chat_id"] == "1001"
        assert doc["filename"] == "report.csv" and doc["content"] == b"day,sales\nmon,10\n"
        assert doc["caption"] == "Sales for Monday"
        async with svc.sessionmaker() as sess:
            job = await sess.get(Job, job_id)
            rows = (
                (await sess.execute(select(Delivery).where(Delivery.job_id == job_id)))
                .scalars()
                .all()
            )
        assert job is not None and job.status == "succeeded"
        assert [(r.recipient, r.kind, r.status) for r in rows] == [
            ("telegram:1001", "file", "sent")
        ]
    finally:
        if svc.redis is not None:
            keys = [k async for k in svc.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
            if keys:
                await svc.redis.delete(*keys)
        await svc.close()


def test_job_text_precedence() -> None:
    from delivery.render import render

    def job_text(result: dict) -> str:
        return render(result, fallback=False)

    assert job_text({"message": "m", "result": "r", "text": "t"}) == "m"
    assert job_text({"result": 42}) == "42"
    assert job_text({"result": {"rows": []}, "text": " t "}) == "t"
    assert job_text({"output": "printed\n"}) == "printed"
    assert job_text({"display_md": "# md"}) == "md"  # plain-text channel
    assert render({"display_md": "# md"}, rich=True) == "# md"
    assert job_text({"ok": True}) == ""


def test_long_text_is_cut_for_chat() -> None:
    from delivery.render import TEXT_CAP, render

    text = render({"message": "x" * (TEXT_CAP + 500)})
    assert text.startswith("x" * (TEXT_CAP - 100)) and len(text) <= TEXT_CAP
    assert "cut here" in text and "kept with the job" not in text
    assert render({"message": "short"}) == "short"


def test_wecom_text_chunks_respect_its_byte_limit() -> None:
    from delivery.channels.wecom import byte_chunks

    text = "销售报告" * 400 + "done"  # 3-byte characters
    chunks = byte_chunks(text, 2000)
    assert "".join(chunks) == text
    assert all(len(c.encode()) <= 2000 for c in chunks) and len(chunks) == 3


def test_results_are_looked_for_where_the_skill_ran(tmp_path) -> None:
    """Post-processing uses the executor's workspace rule: ids are single path segments,
    so an odd role or session id neither splits the directory nor escapes the root."""
    from types import SimpleNamespace

    from delivery.router import workspace_of
    from jobs.context import workspace_dir

    settings = SimpleNamespace(resolved_workspace_root=tmp_path)
    root = tmp_path.resolve()
    for role, session in [("r1", "s1"), ("team/a", "../up"), ("r1", None), ("..", "s")]:
        job = SimpleNamespace(role_id=role, session_id=session)
        expected = workspace_dir(tmp_path, role, session)
        got = workspace_of(settings, job)
        assert got == (expected or tmp_path / "s")
        assert got.resolve().is_relative_to(root)
    roleless = workspace_of(settings, SimpleNamespace(role_id="", session_id="../x"))
    assert roleless.parent == tmp_path and roleless.name.startswith(".._x-")
    assert roleless.resolve().is_relative_to(root)
