"""Trust at every door: what a chat user, a model, a local process or a Redis writer can
send through the real web app and worker (SQLite and PostgreSQL) reaches nothing it should
not — host files through rendered command lines, unvetted Apprise URLs, the API without a
token, recipients chosen by Redis — and results never vanish."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from dashboard.app import create_app
from jobs.queue import store
from tests.helpers.jobs import drain
from tests.helpers.net import LoopbackServer, Reply
from tests.helpers.settings import ADMIN_AUTH

pytestmark = pytest.mark.integration

TG_A = {"channel": "telegram", "actor_key": "1001", "role_id": "r1", "org_id": "o1"}
TG_B = {"channel": "telegram", "actor_key": "1002", "role_id": "r1", "org_id": "o1"}


def api(svc: Any, **headers: str) -> httpx.AsyncClient:
    app = create_app(svc.settings, services=svc)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={**ADMIN_AUTH, **headers},
    )


async def run(svc: Any, skill: str, inp: Any, ctx: dict[str, Any]) -> dict[str, Any]:
    """Dispatch through the web app; the answer (sync line) or the finished job's result
    (background line, drained by a real worker)."""
    async with api(svc) as c:
        res = await c.post("/api/v1/dispatch", json={"skill": skill, "input": inp, "context": ctx})
    assert res.status_code in (200, 202), res.text
    body = res.json()
    if res.status_code == 200:
        return dict(body)
    await drain(svc)
    job = await store.get_job(svc.sessionmaker, body["job_id"])
    if job.result is not None:
        return dict(svc.box.unseal(job.result))
    return {"ok": False, "error": job.error, "status": job.status}


# --- 1. arguments are checked as rendered -----------------------------------------------


@pytest.mark.slow
async def test_cli_arguments_cannot_name_host_files(trust) -> None:
    secret = trust.settings.data_dir / "secret.key"
    secret.write_text("top-secret-key-material")
    attempts = [
        {"file=" + str(secret): True},  # one argv item: --file=<path>
        {"filePath": str(secret)},
        {"file-path": str(secret)},
        {"inputFile": str(secret)},
        {"fil": str(secret)},  # argparse takes --fil for --file
        {"text": "a\n1\n", "column": ["a", "--file=" + str(secret)]},
        {"-f": str(secret)},
    ]
    for inp in attempts:
        out = await run(trust, "csv_stats", inp, TG_A)
        text = json.dumps(out)
        assert out.get("ok") is False, (inp, out)
        assert "top-secret" not in text, inp
        assert out.get("error_type") == "recoverable", (inp, out)
        key = next(iter(inp)) if len(inp) == 1 else "column"
        assert key in out["error"], (inp, out)
    # the positive control: a workspace file by any spelling is read
    ok = await run(trust, "csv_stats", {"text": "a,b\n1,2\n3,4\n"}, TG_A)
    assert ok.get("ok") is not False and "2" in json.dumps(ok), ok


# --- 2. notify vets what Apprise will use -----------------------------------------------


@pytest.fixture
async def sinks() -> Any:
    servers = [await LoopbackServer().start() for _ in range(2)]
    for srv in servers:
        srv.routes["/hook"] = Reply(200, b'{"ok": true}', {"content-type": "application/json"})
    yield servers
    for srv in servers:
        await srv.close()


@pytest.mark.slow
async def test_notify_refuses_a_second_url_riding_along(trust, sinks, monkeypatch) -> None:
    allowed, other = sinks
    good = f"json://127.0.0.1:{allowed.port}/hook"
    monkeypatch.setenv("SKILLJOBS_NOTIFY_ALLOW_URLS", f"json://127.0.0.1:{allowed.port}")
    monkeypatch.setenv("SKILLJOBS_FETCH_ALLOW_HOSTS", "127.0.0.1")
    riders = [
        f"{good}, json://user:hunter2pw@127.0.0.1:{other.port}/hook",
        f"{good} json://user:hunter2pw@127.0.0.1:{other.port}/hook",
        f"{good};json://user:hunter2pw@127.0.0.1:{other.port}/hook",
        f"{good}\njson://user:hunter2pw@127.0.0.1:{other.port}/hook",
        [good, f"json://user:hunter2pw@127.0.0.1:{other.port}/hook"],
        f"no-such-alias json://user:hunter2pw@127.0.0.1:{other.port}/hook",
    ]
    for target in riders:
        out = await run(trust, "notify", {"message": "hi", "target": target}, TG_A)
        assert out.get("ok") is False, (target, out)
        assert "hunter2pw" not in json.dumps(out), out
    assert other.connections == 0 and allowed.connections == 0  # the whole call refused
    ok = await run(trust, "notify", {"message": "hi", "target": good}, TG_A)
    assert ok.get("ok") is True, ok
    assert allowed.connections >= 1 and other.connections == 0


# --- 3. no tokenless admin ----------------------------------------------------------------


@pytest.mark.slow
async def test_no_token_is_401_and_read_token_reads(trust) -> None:
    from pydantic import SecretStr

    trust.settings.api_read_token = SecretStr("read-only-token-0123456789abcdef0123")
    app = create_app(trust.settings, services=trust)
    put = "/api/v1/roles/r1/skills/echo/config"
    for headers in ({}, {"x-forwarded-for": "127.0.0.1"}):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=headers
        ) as c:
            assert (await c.get("/api/v1/jobs")).status_code == 401
            assert (await c.put(put, json={"k": "v"})).status_code == 401
    async with api(trust, authorization="Bearer read-only-token-0123456789abcdef0123") as c:
        assert (await c.get("/api/v1/jobs")).status_code == 200
        assert (await c.put(put, json={"k": "v"})).status_code == 403
    async with api(trust) as c:
        assert (await c.put(put, json={"k": "v"})).status_code == 200


# --- 4. Redis decides nothing about recipients ---------------------------------------------


@pytest.mark.slow
async def test_a_forged_outbox_queue_entry_does_not_choose_the_recipient(trust, tg) -> None:
    """A parked delivery for chat A whose id a Redis writer pushed under chat B's queue is
    not sent to B; it reaches A, as its ledger row says."""
    from delivery.ledger import PARKED
    from delivery.outbox import Outbox
    from jobs.models import Delivery

    async with trust.sessionmaker() as s:
        row = Delivery(
            ledger_key="forged:telegram:1001:1",
            recipient="telegram:1001",
            channel="telegram",
            kind="text",
            item="t",
            status="pending",
            claimed_by=PARKED,
            content={"text": "victim's report"},
            created_at=0.0,
            updated_at=0.0,
        )
        s.add(row)
        await s.commit()
        row_id = row.id
    ob = Outbox(trust, "w-test")
    await trust.redis.rpush(ob.queue_key("telegram:1002"), row_id)
    await trust.redis.zadd(ob.due_key, {"telegram:1002": 0})
    await ob.settle(10)
    assert not [m for m in tg.sent if m["chat_id"] == "1002"]
    async with trust.sessionmaker() as s:
        assert (await s.get(Delivery, row_id)).status == "pending"  # not recorded as sent
    assert await ob.sweep() == 1  # back under its own recipient
    await ob.settle(10)
    assert [m.get("text") for m in tg.sent if m["chat_id"] == "1001"] == ["victim's report"]
    async with trust.sessionmaker() as s:
        got = await s.get(Delivery, row_id)
        assert got.status == "sent" and got.recipient == "telegram:1001"


# --- 6. results never vanish, text is always valid -------------------------------------------


@pytest.mark.slow
async def test_a_lone_surrogate_in_a_result_is_delivered_as_replacement(trust, tg) -> None:
    """A Node skill cutting an emoji in half: the job succeeds with U+FFFD in place of the
    half, records that it did, and the person gets the text."""
    async with api(trust) as c:
        res = await c.post(
            "/api/v1/dispatch",
            json={
                "skill": "emoji_cut",
                "input": {"title": "abc \U0001f600 def", "max": 5},
                "context": TG_A,
            },
        )
    assert res.status_code == 202, res.text
    await drain(trust)
    job = await store.get_job(trust.sessionmaker, res.json()["job_id"])
    assert job.status == "succeeded", (job.status, job.error)
    result = trust.box.unseal(job.result)
    assert result["title"] == "abc \ufffd", result
    texts = [m.get("text", "") for m in tg.sent if m["chat_id"] == "1001"]
    assert any("abc \ufffd" in t for t in texts), tg.sent


@pytest.mark.slow
async def test_bad_text_and_untyped_ids_are_4xx_naming_the_field(trust) -> None:
    def body(inp: Any, ctx: dict[str, Any]) -> bytes:
        return json.dumps({"skill": "emoji_cut", "input": inp, "context": ctx}).encode()

    cases = [
        (body({}, {**TG_A, "actor_key": {"a": 1}}), 422, "actor_key"),
        (body({}, {**TG_A, "actor_key": ["1001"]}), 422, "actor_key"),
        (body({}, {**TG_A, "actor_key": "10\x0001"}), 400, "actor_key"),
        (body({}, {**TG_A, "role_id": "r" * 200}), 422, "role_id"),
        (body({}, {**TG_A, "session_id": "s\ud800"}), 400, "session_id"),
        (body({}, {**TG_A, "actor_name": "Ann\x00"}), 400, "actor_name"),
    ]
    async with api(trust, **{"content-type": "application/json"}) as c:
        for raw, status, field in cases:
            res = await c.post("/api/v1/dispatch", content=raw)
            assert res.status_code == status, (raw[:120], res.text)
            assert field in res.json()["error"], res.text
        for url in ("/api/v1/jobs/a%00b", "/api/v1/jobs?status=%00", "/api/v1/jobs/%ED%A0%80"):
            res = await c.get(url)
            assert res.status_code == 400, (url, res.text)
            assert "NUL" in res.json()["error"] or "UTF-8" in res.json()["error"], res.text
        # an integer chat id is its text; a lone surrogate in the input becomes U+FFFD
        res = await c.post(
            "/api/v1/dispatch", content=body({"title": "hi \ud83d"}, {**TG_A, "actor_key": 1001})
        )
        assert res.status_code == 202, res.text
        assert res.json()["text_replaced"] == ["input.title"]
    await drain(trust)
    job = await store.get_job(trust.sessionmaker, res.json()["job_id"])
    assert job.status == "succeeded" and job.actor_key == "1001", (job.status, job.error)
    assert trust.box.unseal(job.result)["title"] == "hi \ufffd"


# --- 7. idempotency keys are scoped to the caller ------------------------------------------


@pytest.mark.slow
async def test_the_same_idempotency_key_from_two_callers_makes_two_jobs(trust, tg) -> None:
    async with api(trust) as c:
        ids = []
        for ctx in (TG_A, TG_B, TG_A):
            res = await c.post(
                "/api/v1/dispatch",
                json={"skill": "emoji_cut", "input": {"title": "report"}, "context": ctx},
                headers={"Idempotency-Key": "daily-report"},
            )
            assert res.status_code == 202, res.text
            ids.append(res.json()["job_id"])
        other_role = await c.post(
            "/api/v1/dispatch",
            json={
                "skill": "emoji_cut",
                "input": {"title": "report"},
                "context": {**TG_A, "role_id": "r2"},
                "idempotency_key": "daily-report",
            },
        )
    assert ids[0] != ids[1] and ids[0] == ids[2]  # A's retry is A's job
    assert other_role.json()["job_id"] not in ids
    await drain(trust)
    for chat in ("1001", "1002"):
        assert [m for m in tg.sent if m["chat_id"] == chat], chat  # both ran and were told


# --- 9. echoed secrets are masked; file links carry no path -------------------------------


@pytest.mark.slow
async def test_credentials_echoed_by_a_skill_are_masked_in_its_result(trust, tg) -> None:
    secrets = {
        "api_key": "sk-live-4f9a8b7c6d5e",
        "password": "hunter2",
        "Authorization": "Bearer abc.def.ghi-123",
        "nested": {"accessToken": "tok-99887766"},
    }
    out = await run(
        trust,
        "emoji_cut",
        {"title": f"key {secrets['api_key']}", "max": 99, **secrets, "keywords": "cats dogs"},
        TG_A,
    )
    text = json.dumps(out)
    for value in ("sk-live-4f9a8b7c6d5e", "hunter2", "abc.def.ghi-123", "tok-99887766"):
        assert value not in text, out
    assert out["echo"]["keywords"] == "cats dogs"  # data, not a secret
    assert out["echo"]["password"] == "••••••"
    sent = json.dumps(
        [m.get("text") for m in tg.sent if m["chat_id"] == "1001"], ensure_ascii=False
    )
    assert "sk-live-4f9a8b7c6d5e" not in sent and "key ••••••" in sent


# --- 5. the sync line isolates people --------------------------------------------------------


@pytest.mark.slow
async def test_sync_line_gives_each_person_a_workspace_and_vets_files(trust) -> None:
    a = await run(trust, "ws_sync", {"write": {"a-private.txt": "A's data"}}, TG_A)
    assert "a-private.txt" in a["listing"], a
    b = await run(trust, "ws_sync", {}, TG_B)
    assert "a-private.txt" not in b["listing"], b  # not user A's workspace
    secret = trust.settings.data_dir / "secret.key"
    secret.write_text("k")
    out = await run(
        trust,
        "ws_sync",
        {
            "symlink": {"key.txt": str(secret)},
            "declare": "key.txt",
            "leak": True,
            "also": ["a-private.txt"],
        },
        TG_A,
    )
    assert "local_path" not in out, out
    assert out.get("files") == ["a-private.txt"], out
    assert {r["field"] for r in out["refused_files"]} == {"local_path", "files[0]"}
    assert str(trust.settings.data_dir) not in json.dumps(out)


# --- 8. send_message for skills written to the seed ------------------------------------------


@pytest.mark.slow
async def test_send_message_wait_answers_parked_sends_as_sent(trust, tg) -> None:
    """Under the chat's rate limit later sends are parked (``queued`` with delivery ids);
    with ``wait: true`` the call returns once they went out, and lists them in ``sent``."""
    tg.enforce_rates = True
    tg.known_chats.add("7301")
    to = "telegram:7301"
    ctx = {**TG_A, "role_id": "r-send"}
    plain = await run(trust, "send_burst", {"to": to, "count": 4, "prefix": "plain"}, ctx)
    parked = [a for a in plain["answers"] if a.get("queued")]
    assert parked, plain  # without wait: handed over, not yet sent
    for a in parked:
        assert a["ok"] is True and a["sent"] == [] and a["queued"][0]["delivery_ids"]
    waited = await run(
        trust, "send_burst", {"to": to, "count": 3, "prefix": "waited", "wait": True}, ctx
    )
    assert waited["message"] == "waited: 3 of 3 confirmed sent", waited
    assert all(a["sent"] == [to] and not a.get("queued") for a in waited["answers"])
    texts = [m["text"] for m in tg.sent if m["chat_id"] == "7301"]
    assert [t for t in texts if t.startswith("waited")] == ["waited 1", "waited 2", "waited 3"]
    assert tg.too_many == 0
