"""Channel adapters against local fake servers speaking the real API shapes."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest

from delivery.channels.base import (
    DeliveryPermanentError,
    DeliveryTransientError,
    Receipt,
)
from delivery.channels.dingtalk import DingTalkChannel
from delivery.channels.feishu import FeishuChannel, receive_id_type
from delivery.channels.registry import build_channels
from delivery.channels.telegram import TelegramChannel, split_markdown_images
from delivery.channels.web import WebChannel, ensure_session, list_messages, listen, post_message
from delivery.channels.wecom import WeComChannel
from jobs.media import media_kind
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.server import Response
from tests.fakes.telegram import rate_limited
from tests.fakes.wecom import FakeWeCom
from tests.helpers.settings import make_settings

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=10.0) as client:
        yield client


@pytest.fixture
def files(tmp_path):
    png = tmp_path / "chart.png"
    png.write_bytes(PNG)
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(b"%PDF-1.4 " + os.urandom(2048))
    mp3 = tmp_path / "voice.mp3"
    mp3.write_bytes(os.urandom(1024))
    return {"png": str(png), "pdf": str(pdf), "mp3": str(mp3), "pdf_bytes": pdf.read_bytes()}


def sparse(path, size: int) -> str:
    with open(path, "wb") as fh:
        fh.truncate(size)
    return str(path)


# --- Telegram ---------------------------------------------------------------------------


async def test_telegram_text_and_photo_with_caption(tg, http, files) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    mid = await ch.send_text("1001", "hello")
    assert mid == Receipt.of("1") and mid.message_id == "1"
    await ch.send_image("1001", files["png"], caption="your chart")
    photo = tg.sent[-1]
    assert photo["method"] == "sendPhoto"
    assert photo["content"] == PNG and photo["filename"] == "chart.png"
    assert photo["caption"] == "your chart"


async def test_telegram_media_methods(tg, http, files) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    await ch.send_file("1001", files["pdf"])
    await ch.send_audio("1001", files["mp3"])
    assert [s["method"] for s in tg.sent] == ["sendDocument", "sendAudio"]
    assert tg.sent[0]["content"] == files["pdf_bytes"]
    assert "caption" not in tg.sent[0]


@pytest.mark.slow
async def test_telegram_size_limits(tg, http, tmp_path) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    big_photo = sparse(tmp_path / "big.png", 11 * 1024 * 1024)
    await ch.send_image("1001", big_photo)
    assert tg.sent[-1]["method"] == "sendDocument"
    assert len(tg.sent[-1]["content"]) == 11 * 1024 * 1024
    huge = sparse(tmp_path / "huge.mp4", 51 * 1024 * 1024)
    with pytest.raises(DeliveryPermanentError, match="file too large for telegram"):
        await ch.send_video("1001", huge)
    assert len(tg.sent) == 1


async def test_telegram_errors_are_translated(tg, http) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    with pytest.raises(DeliveryPermanentError, match="chat not found"):
        await ch.send_text("999", "x")
    tg.fail_next(f"/bot{tg.token}/sendMessage", rate_limited(7))
    with pytest.raises(DeliveryTransientError) as ei:
        await ch.send_text("1001", "x")
    assert ei.value.retry_after == 7
    tg.fail_next(f"/bot{tg.token}/sendMessage", Response(502, "bad gateway"))
    with pytest.raises(DeliveryTransientError, match="502"):
        await ch.send_text("1001", "x")
    bad = TelegramChannel(http, "123:WRONG", api_base=tg.url)
    with pytest.raises(DeliveryPermanentError, match="Unauthorized") as ei2:
        await bad.send_text("1001", "x")
    assert "WRONG" not in str(ei2.value)


async def test_telegram_unreachable_is_transient(http) -> None:
    ch = TelegramChannel(http, "1:x", api_base="http://127.0.0.1:9")
    with pytest.raises(DeliveryTransientError, match="connection failed"):
        await ch.send_text("1001", "x")


async def test_telegram_turns_markdown_images_into_photos(tg, http) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    text = "Report ready\n![chart](https://cdn.example.com/a.png)\nsee ![a](https://cdn.example.com/a.png)"
    await ch.send_text("1001", text)
    assert [s["method"] for s in tg.sent] == ["sendMessage", "sendPhoto"]
    assert "![" not in tg.sent[0]["text"] and "Report ready" in tg.sent[0]["text"]
    assert tg.sent[1]["url"] == "https://cdn.example.com/a.png"
    assert split_markdown_images("plain") == ("plain", [])
    # only public https images become photos; the rest stays text as written
    local = "![x](http://10.0.0.1/a.png) ![y](https://127.0.0.1/b.png)"
    assert split_markdown_images(local) == (local, [])


@pytest.mark.slow
async def test_telegram_long_text_is_split_and_long_caption_sent_after(tg, http, files) -> None:
    ch = TelegramChannel(http, tg.token, api_base=tg.url)
    await ch.send_text("1001", ("line\n" * 2000).strip())
    assert len(tg.sent) == 3 and all(len(s["text"]) <= 4096 for s in tg.sent)
    tg.sent.clear()
    await ch.send_image("1001", files["png"], caption="c" * 2000)
    assert tg.sent[0]["method"] == "sendPhoto" and "caption" not in tg.sent[0]
    assert tg.sent[1]["text"] == "c" * 2000


# --- Feishu -----------------------------------------------------------------------------


def feishu(http, fs) -> FeishuChannel:
    return FeishuChannel(http, fs.app_id, fs.app_secret, api_base=fs.url)


@pytest.mark.slow
async def test_feishu_token_cached_and_receive_id_types(fs, http) -> None:
    ch = feishu(http, fs)
    for contact in ("ou_a", "on_b", "oc_c", "u123", "a@b.com"):
        await ch.send_text(contact, "hi")
    assert [s["receive_id_type"] for s in fs.sent] == [
        "open_id",
        "union_id",
        "chat_id",
        "user_id",
        "email",
    ]
    assert fs.sent[0]["content"] == {"text": "hi"}
    assert len(fs.calls("/open-apis/auth/v3/tenant_access_token/internal")) == 1
    assert receive_id_type("ou_x") == "open_id"


@pytest.mark.slow
async def test_feishu_token_refreshed_when_revoked_or_expired(fs, http) -> None:
    ch = feishu(http, fs)
    await ch.send_text("ou_a", "1")
    fs.revoke_tokens()
    await ch.send_text("ou_a", "2")
    assert len(fs.sent) == 2
    assert len(fs.calls("/open-apis/auth/v3/tenant_access_token/internal")) == 2
    fs.token_ttl = 60  # within the refresh margin: never reused
    ch.tokens.invalidate()  # (the process's shared token too)
    ch2 = feishu(http, fs)
    await ch2.send_text("ou_a", "3")
    await ch2.send_text("ou_a", "4")
    assert ch2.tokens.fetches == 2


@pytest.mark.slow
async def test_adapters_of_one_app_share_its_token_in_the_process(fs, wc, http) -> None:
    """The send_message skill builds its adapters for each call: they use the token the
    process already has (WeCom limits gettoken calls), and one refresh serves all."""
    for i in range(3):
        await feishu(http, fs).send_text("ou_a", f"call {i}")
        await wecom(http, wc).send_text("zhangsan", f"call {i}")
    assert len(fs.calls("/open-apis/auth/v3/tenant_access_token/internal")) == 1
    assert len(wc.calls("/cgi-bin/gettoken")) == 1
    fs.revoke_tokens()
    await feishu(http, fs).send_text("ou_a", "after a revocation")
    await feishu(http, fs).send_text("ou_a", "and again")
    assert len(fs.calls("/open-apis/auth/v3/tenant_access_token/internal")) == 2
    other = FeishuChannel(http, "cli_other", fs.app_secret, api_base=fs.url)
    with pytest.raises(DeliveryPermanentError):  # another app: never this app's token
        await other.send_text("ou_a", "x")
    assert len(fs.sent) == 5


@pytest.mark.slow
async def test_feishu_uploads(fs, http, files) -> None:
    ch = feishu(http, fs)
    await ch.send_image("ou_a", files["png"])
    await ch.send_file("ou_a", files["pdf"])
    img, doc = fs.sent
    assert img["msg_type"] == "image" and fs.images[img["content"]["image_key"]] == PNG
    assert doc["msg_type"] == "file"
    ftype, name, content = fs.files[doc["content"]["file_key"]]
    assert (ftype, name) == ("pdf", "report.pdf")
    assert content == files["pdf_bytes"]


async def test_feishu_body_errors(fs, http) -> None:
    ch = feishu(http, fs)
    with pytest.raises(DeliveryPermanentError, match="NO availability"):
        await ch.send_text("ou_blocked", "x")
    bad = FeishuChannel(http, fs.app_id, "wrong", api_base=fs.url)
    with pytest.raises(DeliveryPermanentError, match="app secret invalid"):
        await bad.send_text("ou_a", "x")
    fs.fail_next("/open-apis/im/v1/messages", Response(503, {"code": 1, "msg": "busy"}))
    with pytest.raises(DeliveryTransientError):
        await ch.send_text("ou_a", "x")


# --- WeCom ------------------------------------------------------------------------------


@pytest.fixture
def wc():
    with FakeWeCom() as server:
        yield server


def wecom(http, wc) -> WeComChannel:
    return WeComChannel(http, wc.corp_id, wc.corp_secret, str(wc.agent_id), api_base=wc.url)


@pytest.mark.slow
async def test_wecom_text_image_and_audio_as_file(wc, http, files) -> None:
    ch = wecom(http, wc)
    await ch.send_text("zhangsan", "done")
    await ch.send_image("zhangsan", files["png"])
    await ch.send_audio("zhangsan", files["mp3"])  # not AMR → file
    assert [s["msgtype"] for s in wc.sent] == ["text", "image", "file"]
    assert wc.sent[0]["text"] == {"content": "done"}
    assert wc.media[wc.sent[1]["image"]["media_id"]] == ("image", "chart.png", PNG)
    assert wc.media[wc.sent[2]["file"]["media_id"]][0] == "file"
    assert len(wc.calls("/cgi-bin/gettoken")) == 1


@pytest.mark.slow
async def test_wecom_expired_token_and_errors(wc, http) -> None:
    ch = wecom(http, wc)
    await ch.send_text("zhangsan", "1")
    wc.expire_tokens()
    await ch.send_text("zhangsan", "2")
    assert len(wc.calls("/cgi-bin/gettoken")) == 2 and len(wc.sent) == 2
    with pytest.raises(DeliveryPermanentError, match="81013"):
        await ch.send_text("nobody", "x")
    wc.fail_next(
        "/cgi-bin/message/send",
        Response(200, {"errcode": 45009, "errmsg": "api freq out of limit"}),
    )
    with pytest.raises(DeliveryTransientError, match="45009"):
        await ch.send_text("zhangsan", "x")


# --- DingTalk ---------------------------------------------------------------------------


@pytest.fixture
def dt():
    with FakeDingTalk() as server:
        yield server


def dingtalk(http, dt) -> DingTalkChannel:
    return DingTalkChannel(
        http, dt.app_key, dt.app_secret, dt.robot_code, api_base=dt.url, oapi_base=dt.oapi.url
    )


@pytest.mark.slow
async def test_dingtalk_text_and_file(dt, http, files) -> None:
    ch = dingtalk(http, dt)
    await ch.send_text("user001", "hello")
    await ch.send_file("user001", files["pdf"])
    await ch.send_image("user001", files["png"])
    text, doc, img = dt.sent
    assert (text["msgKey"], text["msgParam"]) == ("sampleText", {"content": "hello"})
    assert doc["msgKey"] == "sampleFile" and doc["msgParam"]["fileName"] == "report.pdf"
    assert dt.oapi.media[doc["msgParam"]["mediaId"]][2] == files["pdf_bytes"]
    assert img["msgKey"] == "sampleImageMsg"
    assert dt.oapi.media[img["msgParam"]["photoURL"]][2] == PNG
    assert len(dt.calls("/v1.0/oauth2/accessToken")) == 1
    assert len(dt.oapi.calls("/gettoken")) == 1


@pytest.mark.slow
async def test_dingtalk_errors_and_token_refresh(dt, http) -> None:
    ch = dingtalk(http, dt)
    with pytest.raises(DeliveryPermanentError, match="unknown user"):
        await ch.send_text("ghost", "x")
    dt.throttled.add("user002")
    with pytest.raises(DeliveryTransientError, match="rate limited"):
        await ch.send_text("user002", "x")
    dt.valid_tokens.clear()
    await ch.send_text("user001", "after refresh")
    assert dt.sent[-1]["msgParam"] == {"content": "after refresh"}
    assert len(dt.calls("/v1.0/oauth2/accessToken")) == 2
    bad = DingTalkChannel(
        http, dt.app_key, "nope", dt.robot_code, api_base=dt.url, oapi_base=dt.oapi.url
    )
    with pytest.raises(DeliveryPermanentError, match="clientSecret"):
        await bad.send_text("user001", "x")


# --- web --------------------------------------------------------------------------------


async def subscribed(redis, settings, session_id: str) -> None:
    """Wait until someone listens on the session's live channel (a push before that is lost)."""
    channel = settings.key("session", session_id)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if (await redis.pubsub_numsub(channel))[0][1] > 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"nobody subscribed to {channel}")


@pytest.mark.slow
async def test_web_post_list_and_live_push(sessionmaker, redis, settings, files) -> None:
    await ensure_session(sessionmaker, "s1", "r1", "o1", "web", "")
    await ensure_session(sessionmaker, "s1", "other", "", "", "")  # idempotent
    received: list[dict] = []

    async def consume() -> None:
        async for msg in listen(redis, settings, "s1"):
            received.append(msg)
            if len(received) == 2:
                return

    task = asyncio.create_task(consume())
    await subscribed(redis, settings, "s1")
    stored = await post_message(sessionmaker, redis, settings, "s1", "first", [], job_id="j1")
    web = WebChannel(sessionmaker, redis, settings).for_job("j2")
    await web.send_image("s1", files["png"], caption="look")
    await asyncio.wait_for(task, 10)
    assert received[0] == stored
    assert (
        received[1]["text"] == "look" and received[1]["attachments"][0]["filename"] == "chart.png"
    )
    items = await list_messages(sessionmaker, "s1")
    assert [m["text"] for m in items] == ["first", "look"]
    assert set(items[0]) >= {"id", "text", "attachments", "created_at"}
    assert items == received
    assert [m["text"] for m in await list_messages(sessionmaker, "s1", limit=1)] == ["look"]


async def test_web_unknown_session_is_a_failure(sessionmaker, redis, settings) -> None:
    with pytest.raises(DeliveryPermanentError, match="unknown session 'nope'"):
        await post_message(sessionmaker, redis, settings, "nope", "hi", [])
    assert await list_messages(sessionmaker, "nope") == []
    with pytest.raises(DeliveryPermanentError, match="not configured"):
        await WebChannel(None, None, settings).send_text("s", "x")


async def test_listen_with_a_url(sessionmaker, redis, redis_server_url, settings) -> None:
    await ensure_session(sessionmaker, "s2")
    gen = listen(redis_server_url, settings, "s2")
    first = asyncio.ensure_future(gen.__anext__())
    await subscribed(redis, settings, "s2")
    await post_message(sessionmaker, redis, settings, "s2", "via url", [])
    assert (await asyncio.wait_for(first, 10))["text"] == "via url"
    await gen.aclose()


# --- wiring -----------------------------------------------------------------------------


def test_build_channels_only_configured(tmp_path, http) -> None:
    s = make_settings(tmp_path, redis_url=None, prefix="p")
    assert set(build_channels(s, http)) == {"web", "web_admin"}
    s = make_settings(
        tmp_path,
        redis_url=None,
        prefix="p",
        telegram_bot_token="1:x",
        feishu_app_id="cli",
        feishu_app_secret="s",
        wecom_corp_id="ww",
        wecom_corp_secret="s",
        dingtalk_app_key="k",
    )
    chans = build_channels(s, http)
    # WeCom lacks its agent id and DingTalk its secret/robot code: not configured
    assert set(chans) == {"web", "web_admin", "telegram", "feishu"}
    assert media_kind("a.MP4") == "video" and media_kind("a.bin", "image") == "image"


async def test_web_batching_keeps_each_result_separate(sessionmaker, redis, settings) -> None:
    for sid in ("b1", "b2"):
        await ensure_session(sessionmaker, sid)
    web = WebChannel(sessionmaker, redis, settings)
    targets = ["b1", "b2", "ghost"] * 20
    results = await asyncio.gather(
        *(web.for_job(f"j{i}").send_text(sid, f"m{i}") for i, sid in enumerate(targets)),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 20
    assert all(isinstance(e, DeliveryPermanentError) and "ghost" in str(e) for e in errors)
    ids = [int(r.message_id) for r in results if isinstance(r, Receipt)]
    assert len(set(ids)) == 40
    b1 = await list_messages(sessionmaker, "b1")
    assert [m["text"] for m in b1] == [f"m{i}" for i in range(0, 60, 3)]
    assert [m["job_id"] for m in b1] == [f"j{i}" for i in range(0, 60, 3)]


@pytest.mark.slow
async def test_web_ledger_rules_in_one_batch(sessionmaker, redis, settings) -> None:
    """The exactly-once rules of web delivery, as one batch (one statement on PostgreSQL):
    a key already sent is skipped, a pending or failed row is taken over, a key twice in
    the batch is stored once, an unknown session records a failed row."""
    from sqlalchemy import select

    from delivery.channels.web import Outgoing, post_messages
    from delivery.ledger import LedgerEntry
    from jobs.models import Delivery

    await ensure_session(sessionmaker, "L1")
    async with sessionmaker() as s:
        for key, status in (("k-sent", "sent"), ("k-pending", "pending"), ("k-failed", "failed")):
            s.add(Delivery(ledger_key=key, recipient="web:L1", channel="web", status=status))
        await s.commit()

    def out(key: str | None, session: str = "L1", text: str = "") -> Outgoing:
        entry = None if key is None else LedgerEntry(key=key, recipient="web:L1", owner="w9")
        return Outgoing(session, text or f"t-{key}", [], "job-x", entry)

    msgs = [
        out("k-sent"),
        out("k-pending"),
        out("k-new"),
        out("k-new", text="again"),
        out(None, text="no ledger"),
        out("k-ghost", session="ghost"),
        out("k-failed"),
    ]
    res = await post_messages(sessionmaker, redis, settings, msgs)
    assert res[0] is None and res[3] is None  # sent before / twice in the batch
    assert [r["text"] for r in (res[1], res[2], res[4], res[6])] == [  # type: ignore[index]
        "t-k-pending",
        "t-k-new",
        "no ledger",
        "t-k-failed",
    ]
    assert isinstance(res[5], DeliveryPermanentError) and "ghost" in str(res[5])
    stored = await list_messages(sessionmaker, "L1")
    assert [m["text"] for m in stored] == ["t-k-pending", "t-k-new", "no ledger", "t-k-failed"]
    assert [m["id"] for m in stored] == [r["id"] for r in (res[1], res[2], res[4], res[6])]  # type: ignore[index]
    async with sessionmaker() as s:
        rows = {d.ledger_key: d for d in await s.scalars(select(Delivery))}
    assert {k: rows[k].status for k in rows} == {
        "k-sent": "sent",
        "k-pending": "sent",
        "k-failed": "sent",
        "k-new": "sent",
        "k-ghost": "failed",
    }
    assert rows["k-pending"].tries == 1 and rows["k-pending"].claimed_by == "w9"
    assert rows["k-ghost"].error == "unknown session 'ghost'" and rows["k-new"].sent_at
    # the same batch again: everything was delivered, nothing is stored twice
    again = await post_messages(sessionmaker, redis, settings, msgs)
    assert [r for r in again if isinstance(r, dict)] == [again[4]]  # only the ledger-less one
    assert len(await list_messages(sessionmaker, "L1")) == 5


async def test_web_batch_with_a_duplicate_still_pushes_the_rest(sessionmaker, redis, settings):
    """A message skipped as delivered already must not cost the others their live push."""
    from delivery.channels.web import Outgoing, post_messages
    from delivery.ledger import LedgerEntry

    await ensure_session(sessionmaker, "P1")
    entry = LedgerEntry(key="k-once", recipient="web:P1", owner="w1")
    await post_messages(sessionmaker, redis, settings, [Outgoing("P1", "first", [], "j", entry)])
    received: list[dict] = []

    async def consume() -> None:
        async for msg in listen(redis, settings, "P1"):
            received.append(msg)
            return

    task = asyncio.create_task(consume())
    await subscribed(redis, settings, "P1")
    again = Outgoing("P1", "first", [], "j", entry)
    fresh = Outgoing(
        "P1", "fresh", [], "j2", LedgerEntry(key="k-new", recipient="web:P1", owner="w1")
    )
    res = await post_messages(sessionmaker, redis, settings, [again, fresh])
    assert res[0] is None and res[1]["text"] == "fresh"  # type: ignore[index]
    await asyncio.wait_for(task, 10)
    assert received == [res[1]]
