"""Custody of third-party sends on both backends, against the fake platforms: a request
whose answer was lost is ``unknown`` and never sent again blindly (Telegram), or sent again
under the same key where the platform drops repeats (Feishu ``uuid``); a row found
``sending`` whose worker died is ``unknown``; receipts; generations fence stale workers."""

from __future__ import annotations

import time
from dataclasses import replace

import httpx
import pytest

from delivery.channels.base import Courier, Receipt
from delivery.channels.feishu import FeishuChannel
from delivery.channels.telegram import TelegramChannel
from delivery.errors import DeliveryOutcomeUnknown
from delivery.ledger import (
    UNKNOWN_DIED,
    Parcel,
    begin_send,
    claim,
    deliver_once,
    get,
    ledger_key,
    mark_sent,
)
from jobs.models import Delivery, Worker


@pytest.fixture
async def quick_http():
    # answers held back by the fakes (lose_answers) outlast this read timeout
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=0.5)) as client:
        yield client


@pytest.mark.slow
async def test_lost_answer_on_telegram_is_unknown_and_never_sent_twice(
    sessionmaker, tg, quick_http
) -> None:
    ch = TelegramChannel(quick_http, tg.token, api_base=tg.url)
    tg.lose_delay = 1.5
    tg.lose_answers["/sendMessage"] = 1
    key = ledger_key("j1", "telegram:1001", "text")

    async def send() -> Receipt:
        return await ch.send_text("1001", "the report is ready")

    parcel = Parcel(key)
    courier = Courier("telegram:1001", "w#1", channel="telegram", job_id="j1", backoff=0.01)
    first = await deliver_once(sessionmaker, send, courier, parcel)
    assert first["status"] == "unknown" and "timed out" in first["error"]
    assert len(tg.calls(f"/bot{tg.token}/sendMessage")) == 1  # not repeated
    # a re-run of the job (another claim) does not send it again either
    again = await deliver_once(sessionmaker, send, replace(courier, owner="w#2"), parcel)
    assert again["status"] == "unknown" and again.get("duplicate")
    assert len(tg.calls(f"/bot{tg.token}/sendMessage")) == 1
    row = await get(sessionmaker, key)
    assert row is not None and row.status == "unknown" and row.tries == 1


@pytest.mark.slow
async def test_lost_answer_on_feishu_is_sent_again_with_the_same_uuid(
    sessionmaker, fs, quick_http
) -> None:
    ch = FeishuChannel(quick_http, fs.app_id, fs.app_secret, api_base=fs.url)
    fs.lose_delay = 1.5
    fs.lose_answers["/open-apis/im/v1/messages"] = 1
    key = ledger_key("j1", "feishu:ou_a", "text")

    async def send() -> Receipt:
        return await ch.send_text("ou_a", "the report is ready")

    out = await deliver_once(
        sessionmaker,
        send,
        Courier("feishu:ou_a", "w#1", channel="feishu", backoff=0.01),
        Parcel(key, dedup=ch.dedups_for("ou_a")),
    )
    assert out["status"] == "sent", out
    calls = fs.calls("/open-apis/im/v1/messages")
    assert len(calls) == 2  # repeated once …
    uuids = {c.json["uuid"] for c in calls}
    assert len(uuids) == 1 and len(next(iter(uuids))) <= 50  # … with the same uuid
    assert len(fs.sent) == 1  # … and the person got one message
    row = await get(sessionmaker, key)
    assert row is not None and row.message_id == fs.sent[0]["message_id"] and row.verified


async def _dead_worker(sessionmaker, worker_id: str) -> None:
    async with sessionmaker() as s:
        s.add(Worker(id=worker_id, host="h", pid=1, last_heartbeat=time.time() - 3600))
        await s.commit()


@pytest.mark.parametrize("dedup", [False, True])
async def test_row_found_sending_after_its_worker_died(sessionmaker, dedup: bool) -> None:
    """Killed between claim and record: the next claimant finds ``sending``. Unknown (not
    sent again) — except where the platform drops repeats: sent again under the same key."""
    await _dead_worker(sessionmaker, "dead")
    key = ledger_key("j1", "x:1", "text")
    row = await claim(sessionmaker, key, recipient="x:1", owner="dead#1", job_id="j1")
    assert row is not None and await begin_send(sessionmaker, key, "dead#1", row.generation)
    sends = []

    async def send() -> Receipt:
        sends.append(1)
        return Receipt.of("m1")

    out = await deliver_once(
        sessionmaker, send, Courier("x:1", "w#2", dead_after=5), Parcel(key, dedup=dedup)
    )
    got = await get(sessionmaker, key)
    assert got is not None
    if dedup:
        assert out["status"] == "sent" and sends == [1] and got.status == "sent"
    else:
        assert out["status"] == "unknown" and sends == [] and got.status == "unknown"
        assert got.error == UNKNOWN_DIED


async def test_receipts_message_id_note_kind_and_unverified(sessionmaker) -> None:
    async def with_id() -> Receipt:
        note = "not as a video: 60.0 MB is over the 50.0 MB limit"
        return Receipt.of("42", sent_as="file", note=note)

    async def without_id() -> Receipt:
        return Receipt()

    await deliver_once(sessionmaker, with_id, Courier("telegram:1", "w#1"), Parcel("k1"))
    await deliver_once(sessionmaker, without_id, Courier("telegram:1", "w#1"), Parcel("k2"))
    one, two = await get(sessionmaker, "k1"), await get(sessionmaker, "k2")
    assert one is not None and two is not None
    assert (one.status, one.message_id, one.verified, one.sent_as) == ("sent", "42", True, "file")
    assert one.note is not None and "50.0 MB" in one.note
    assert (two.status, two.message_id, two.verified) == ("sent", None, False)


async def test_a_stale_generation_never_records(sessionmaker) -> None:
    row = await claim(sessionmaker, "kg", recipient="x:1", owner="old#1")
    assert row is not None and row.generation == 0
    async with sessionmaker() as s:  # an operator's resend started generation 1
        got = await s.get(Delivery, row.id)
        assert got is not None
        got.generation, got.status = 1, "pending"
        await s.commit()
    assert not await begin_send(sessionmaker, "kg", "old#1", 0)
    assert not await mark_sent(sessionmaker, "kg", "old#1", receipt=Receipt.of("9"), generation=0)
    fresh = await get(sessionmaker, "kg")
    assert fresh is not None and fresh.status == "pending" and fresh.message_id is None


@pytest.mark.slow
async def test_outcome_unknown_is_not_retried_on_plain_channels(sessionmaker) -> None:
    calls = []

    async def send() -> Receipt:
        calls.append(1)
        raise DeliveryOutcomeUnknown("read timed out")

    out = await deliver_once(sessionmaker, send, Courier("x:1", "w#1"), Parcel("ku"))
    assert out["status"] == "unknown" and calls == [1]


async def test_connect_errors_are_retried_not_unknown(sessionmaker, quick_http) -> None:
    ch = TelegramChannel(quick_http, "1:x", api_base="http://127.0.0.1:9")

    async def send() -> Receipt:
        return await ch.send_text("1001", "hi")

    out = await deliver_once(
        sessionmaker, send, Courier("telegram:1001", "w#1", backoff=0.01), Parcel("kc")
    )
    assert out["status"] == "failed" and "gave up after 3 tries" in out["error"]


@pytest.mark.slow
async def test_a_lost_upload_answer_is_retried_not_unknown(
    sessionmaker, fs, quick_http, tmp_path
) -> None:
    """An upload (or a token request) shows nothing to anyone: its lost answer is retried."""
    png = tmp_path / "chart.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    ch = FeishuChannel(quick_http, fs.app_id, fs.app_secret, api_base=fs.url)
    fs.lose_delay = 1.5
    fs.lose_answers["/open-apis/im/v1/images"] = 1

    async def send() -> Receipt:
        return await ch.send_image("ou_a", str(png))

    out = await deliver_once(
        sessionmaker, send, Courier("feishu:ou_a", "w#1", backoff=0.01), Parcel("kup")
    )
    assert out["status"] == "sent", out
    assert len(fs.calls("/open-apis/im/v1/images")) == 2 and len(fs.sent) == 1
