"""The outbound tags of a result act on its delivery and never reach a person as text:
[[reply_to_current]] / [[reply_to:<id>]] answer a message, [[audio_as_voice]] sends OGG/Opus
as a Telegram voice note (another format as audio, the reason in the receipt's note); the
router records each item's receipt (message id, note, kind it went as)."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from delivery.pipeline import postprocess
from jobs.crypto import SecretBox, load_or_create_key
from jobs.models import Delivery, Job
from jobs.services import Services
from jobs.skill import SkillRegistry
from tests.helpers.settings import make_settings


@pytest.fixture
async def services(tmp_path, engine, sessionmaker, redis, redis_prefix, redis_server_url, tg):
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
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


async def make_job(services, **extra) -> Job:
    values = {
        "skill": "clip",
        "role_id": "r1",
        "session_id": "s1",
        "channel": "telegram",
        "actor_key": "1001",
        "lease_owner": "w1",
        "lease_token": 1,
        "status": "running",
    }
    values.update(extra)
    job = Job(**values)
    async with services.sessionmaker() as s:
        s.add(job)
        await s.commit()
    (services.settings.resolved_workspace_root / "r1" / "s1").mkdir(parents=True, exist_ok=True)
    return job


async def rows(services) -> list[Delivery]:
    async with services.sessionmaker() as s:
        return list((await s.execute(select(Delivery).order_by(Delivery.id))).scalars())


@pytest.mark.slow
async def test_reply_to_current_answers_the_originating_message(services, tg) -> None:
    asked = tg.receive("1001")
    job = await make_job(services, context={"message_id": str(asked)})
    result = {"message": "[[reply_to_current]] Here is your report."}
    post = await postprocess(services, job, result, fence=always)
    assert post.deliveries[0]["status"] == "sent"
    (msg,) = tg.sent
    assert msg["text"] == "Here is your report." and msg["reply_to"] == asked
    (row,) = await rows(services)
    assert row.message_id == str(msg["message_id"]) and row.verified is True


@pytest.mark.slow
async def test_reply_to_an_explicit_message(services, tg) -> None:
    earlier = tg.receive("1001")
    job = await make_job(services)
    await postprocess(services, job, {"message": f"Done [[reply_to:{earlier}]]"}, fence=always)
    (msg,) = tg.sent
    assert msg["text"] == "Done" and msg["reply_to"] == earlier


@pytest.mark.slow
async def test_audio_as_voice_sends_ogg_as_a_voice_note(services, tg) -> None:
    job = await make_job(services)
    ws = services.settings.resolved_workspace_root / "r1" / "s1"
    (ws / "note.ogg").write_bytes(b"OggS" + bytes(512))
    result = {"message": "Listen [[audio_as_voice]]", "filename": "note.ogg", "media": "audio"}
    post = await postprocess(services, job, result, fence=always)
    assert [d["status"] for d in post.deliveries] == ["sent"]
    (msg,) = tg.sent
    assert msg["method"] == "sendVoice" and msg["caption"] == "Listen"
    (row,) = await rows(services)
    assert row.kind == "voice" and row.sent_as == "voice" and not row.note


@pytest.mark.slow
async def test_audio_as_voice_with_mp3_goes_as_audio_with_a_note(services, tg) -> None:
    job = await make_job(services)
    ws = services.settings.resolved_workspace_root / "r1" / "s1"
    (ws / "song.mp3").write_bytes(b"ID3" + bytes(512))
    result = {"message": "[[audio_as_voice]]", "filename": "song.mp3"}
    await postprocess(services, job, result, fence=always)
    (msg,) = tg.sent
    assert msg["method"] == "sendAudio"
    assert "[[" not in str(msg.get("caption") or "")
    (row,) = await rows(services)
    assert row.sent_as == "audio" and row.note and "voice note" in row.note


@pytest.mark.slow
async def test_web_messages_record_their_id_and_keep_embeds(services, sessionmaker) -> None:
    from delivery.channels.web import ensure_session, list_messages

    await ensure_session(sessionmaker, "s1", "r1", "", "web", "")
    job = await make_job(services, channel="web", actor_key="")
    result = {"message": 'Status [embed ref="cv_1" title="Status" /] [[reply_to_current]]'}
    post = await postprocess(services, job, result, fence=always)
    assert post.deliveries[0]["status"] == "sent"
    (msg,) = await list_messages(sessionmaker, "s1")
    assert msg["text"] == 'Status [embed ref="cv_1" title="Status" /]'
    (row,) = await rows(services)
    assert row.message_id == str(msg["id"]) and row.verified is True


async def test_send_message_never_sends_a_tag_as_text(tg) -> None:
    from delivery.channels.telegram import TelegramChannel
    from delivery.send_message import send_message

    async with httpx.AsyncClient(timeout=10) as http:
        channels = {"telegram": TelegramChannel(http, tg.token, api_base=tg.url)}
        out = await send_message(
            channels,
            to="telegram:1001",
            text='Ticket closed [[audio_as_voice]] [embed ref="cv_1" /]',
        )
    assert out["ok"] is True
    assert [m["text"] for m in tg.sent] == ["Ticket closed"]


@pytest.mark.slow
async def test_audio_as_voice_converts_mp3_to_ogg_opus_with_ffmpeg(services, tg) -> None:
    """A real MP3 (made by ffmpeg) with [[audio_as_voice]]: converted to OGG/Opus and sent
    as a Telegram voice note; the delivery's note says it was converted."""
    from delivery.audio import FOLDER
    from tests.helpers.media import tone

    job = await make_job(services)
    ws = services.settings.resolved_workspace_root / "r1" / "s1"
    tone(ws / "speech.mp3", seconds=1.5)
    result = {"message": "Your summary [[audio_as_voice]]", "filename": "speech.mp3"}
    post = await postprocess(services, job, result, fence=always)
    assert [d["status"] for d in post.deliveries] == ["sent"]
    (msg,) = tg.sent
    assert msg["method"] == "sendVoice" and msg["caption"] == "Your summary"
    assert msg["content"][:4] == b"OggS" and b"OpusHead" in msg["content"][:200]
    (row,) = await rows(services)
    assert row.sent_as == "voice" and "converted from .mp3 to OGG/Opus with ffmpeg" in row.note
    assert list((ws / FOLDER).glob("speech.*.ogg"))  # kept beside it, hidden from backfill
