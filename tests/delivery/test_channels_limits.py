"""The platforms' documented rules, on each channel, against fakes that enforce them: text
and caption limits, media sizes and formats with their fallbacks (the next kind, then a
link), video and voice details, token expiry in the middle of a batch, group chats and
replies, and errors that say what to fix."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from delivery.channels.base import DeliveryPermanentError, Receipt
from delivery.channels.dingtalk import DingTalkChannel
from delivery.channels.feishu import FeishuChannel
from delivery.channels.limits import (
    parse_target,
    split_text,
    utf8_len,
    utf16_len,
)
from delivery.channels.probe import MediaProbe
from delivery.channels.telegram import TelegramChannel
from delivery.channels.wecom import WeComChannel
from delivery.send_message import send_message
from tests.fakes.dingtalk import GROUP as DT_GROUP
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.feishu import GROUP as FS_GROUP
from tests.fakes.server import Response
from tests.fakes.telegram import GROUP as TG_GROUP
from tests.fakes.wecom import FakeWeCom
from tests.helpers.media import clip, need_ffmpeg, png, sparse, tone

MB = 1024 * 1024
NO_FFMPEG = MediaProbe(ffprobe=None, ffmpeg=None)


def link_for(path: str) -> str:
    return f"https://files.example.com/f/{Path(path).name}?sig=abc"


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=30.0) as client:
        yield client


@pytest.fixture
def wc():
    with FakeWeCom() as server:
        yield server


@pytest.fixture
def dt():
    with FakeDingTalk() as server:
        yield server


def telegram(http, tg, **kw) -> TelegramChannel:
    return TelegramChannel(http, tg.token, api_base=tg.url, **kw)


def feishu(http, fs, **kw) -> FeishuChannel:
    return FeishuChannel(http, fs.app_id, fs.app_secret, api_base=fs.url, **kw)


def wecom(http, wc, **kw) -> WeComChannel:
    return WeComChannel(http, wc.corp_id, wc.corp_secret, str(wc.agent_id), api_base=wc.url, **kw)


def dingtalk(http, dt, **kw) -> DingTalkChannel:
    return DingTalkChannel(
        http, dt.app_key, dt.app_secret, dt.robot_code, api_base=dt.url, oapi_base=dt.oapi.url, **kw
    )


# --- pure rules ---------------------------------------------------------------------------


def test_text_is_split_on_paragraphs_then_lines_then_words_in_order() -> None:
    paragraphs = ["alpha " * 30, "beta\n" * 40, "gamma" * 100]
    text = "\n\n".join(p.strip() for p in paragraphs)
    pieces = split_text(text, 120)
    assert all(len(p) <= 120 for p in pieces)
    assert pieces[0].startswith("alpha") and pieces[-1].endswith("gamma")
    # nothing lost, nothing reordered: only the breaks the cuts fell on are gone
    assert "".join(pieces).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace(
        "\n", ""
    )
    assert split_text("short", 10) == ["short"]
    assert split_text("a\n\nb", 1) == ["a", "b"]
    assert split_text("   ", 10) == []
    # the unit is the platform's: Telegram counts UTF-16 code units, WeCom UTF-8 bytes
    emoji = "😀" * 3000
    assert all(utf16_len(p) <= 4096 for p in split_text(emoji, 4096, utf16_len))
    assert len(split_text(emoji, 4096, utf16_len)) == 2
    assert all(utf8_len(p) <= 2048 for p in split_text("销售" * 2000, 2048, utf8_len))


def test_contacts_name_groups_and_replies() -> None:
    assert parse_target("ou_x") == parse_target(" ou_x ")
    t = parse_target("chat:oc_1#om_9")
    assert (t.id, t.chat, t.reply_to) == ("oc_1", True, "om_9")
    assert parse_target("-100123#5", reply_to="7").reply_to == "7"  # explicit wins
    assert parse_target("a@b.com").reply_to is None


# --- Telegram -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_telegram_over_limit_photo_goes_as_document_and_file_as_link(tg, http, tmp_path):
    ch = telegram(http, tg, link_for=link_for)
    receipt = await ch.send_image("1001", sparse(tmp_path / "big.png", 11 * MB), caption="hi")
    assert isinstance(receipt, Receipt) and receipt.sent_as == "file"
    assert "10.0 MB limit" in receipt.note
    assert tg.sent[-1]["method"] == "sendDocument" and tg.sent[-1]["caption"] == "hi"
    huge = sparse(tmp_path / "huge.pdf", 51 * MB)
    receipt = await ch.send_file("1001", huge, caption="the report")
    assert receipt.sent_as == "link"
    text = tg.sent[-1]["text"]
    assert text.startswith("the report\n\n") and "huge.pdf (51.0 MB) is too large" in text
    assert text.endswith(link_for(huge))
    without_links = telegram(http, tg)
    with pytest.raises(DeliveryPermanentError, match=r"file too large for telegram.*no download"):
        await without_links.send_file("1001", huge)


async def test_telegram_formats_it_does_not_play_go_as_documents(tg, http, tmp_path):
    ch = telegram(http, tg)
    for name, send in (
        ("a.gif", ch.send_image),
        ("v.webm", ch.send_video),
        ("s.ogg", ch.send_audio),
    ):
        (tmp_path / name).write_bytes(os.urandom(64))
        receipt = await send("1001", str(tmp_path / name))
        assert receipt.sent_as == "file" and "is not one of" in receipt.note
    assert [s["method"] for s in tg.sent] == ["sendDocument"] * 3


@pytest.mark.parametrize("probe", [None, NO_FFMPEG], ids=["ffprobe", "no-ffprobe"])
async def test_telegram_photo_outside_its_bounds_goes_as_document(tg, http, tmp_path, probe):
    """With ffprobe the adapter sees it first; without it Telegram says so and the photo
    still arrives, as a document."""
    if probe is None:
        need_ffmpeg()
    ch = telegram(http, tg, probe=probe or MediaProbe())
    strip = tmp_path / "strip.png"
    strip.write_bytes(png(10, 400))  # ratio 1:40
    receipt = await ch.send_image("1001", str(strip))
    assert receipt.sent_as == "file"
    assert [s["method"] for s in tg.sent] == ["sendDocument"]
    assert tg.sent[0]["content"] == strip.read_bytes()
    square = tmp_path / "square.png"
    square.write_bytes(png(40, 40))
    assert (await ch.send_image("1001", str(square))).sent_as == "image"


async def test_telegram_upload_refused_as_too_large_goes_as_the_next_kind(tg, http, tmp_path):
    ch = telegram(http, tg, probe=NO_FFMPEG)
    video = tmp_path / "clip.mp4"
    video.write_bytes(os.urandom(2048))
    tg.fail_next(
        f"/bot{tg.token}/sendVideo", Response(413, "<html>Request Entity Too Large</html>")
    )
    receipt = await ch.send_video("1001", str(video), caption="clip")
    assert receipt.sent_as == "file" and "413" in receipt.note
    assert [(s["method"], s.get("caption")) for s in tg.sent] == [("sendDocument", "clip")]


@pytest.mark.slow
async def test_telegram_long_caption_moves_to_text_and_long_text_splits(tg, http, files_png):
    ch = telegram(http, tg)
    await ch.send_image("1001", files_png, caption="😀" * 600)  # 1200 UTF-16 units
    assert "caption" not in tg.sent[0] and tg.sent[1]["text"] == "😀" * 600
    tg.sent.clear()
    para = "word " * 500
    await ch.send_text("1001", "\n\n".join([para.strip()] * 6))
    assert len(tg.sent) >= 2 and all(utf16_len(s["text"]) <= 4096 for s in tg.sent)
    assert all(s["text"].startswith("word") for s in tg.sent)  # cut between paragraphs


@pytest.mark.slow
async def test_telegram_video_carries_duration_size_and_thumbnail(tg, http, tmp_path):
    video = clip(tmp_path / "clip.mp4", seconds=2)
    await telegram(http, tg).send_video("1001", video)
    (sent,) = tg.sent
    assert sent["method"] == "sendVideo" and sent["duration"] == "2"
    assert (sent["width"], sent["height"]) == ("160", "120")
    assert sent["thumbnail"][:2] == b"\xff\xd8"  # a JPEG


@pytest.mark.slow
async def test_telegram_groups_replies_and_migrated_groups(tg, http):
    ch = telegram(http, tg)
    await ch.send_text(TG_GROUP, "to the group")
    asked = tg.receive(TG_GROUP)
    await ch.send_text(f"chat:{TG_GROUP}#{asked}", "answer")
    await ch.send_text(TG_GROUP, "answer 2", reply_to=str(asked))
    await ch.send_text(TG_GROUP, "to a message gone", reply_to="999999")  # still sent
    assert [(s["chat_id"], s.get("reply_to")) for s in tg.sent] == [
        (TG_GROUP, None),
        (TG_GROUP, asked),
        (TG_GROUP, asked),
        (TG_GROUP, None),
    ]
    await ch.send_text("-42", "the group became a supergroup")
    assert tg.sent[-1]["chat_id"] == tg.migrated["-42"]


@pytest.mark.parametrize(
    ("chat", "fix"),
    [
        ("1003", "blocked the bot"),
        ("1004", "press Start"),
        ("-1009", "add it to the group again"),
        ("-1008", "a group admin must allow it"),
        ("777", "check the chat id"),
    ],
)
async def test_telegram_errors_say_what_to_fix(tg, http, chat, fix):
    with pytest.raises(DeliveryPermanentError, match=fix) as ei:
        await telegram(http, tg).send_text(chat, "x")
    assert "HTTP 4" not in ei.value.reason


@pytest.fixture
def files_png(tmp_path) -> str:
    p = tmp_path / "chart.png"
    p.write_bytes(png(64, 48))
    return str(p)


# --- Feishu -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_feishu_over_limit_image_goes_as_file_and_file_as_link(fs, http, tmp_path):
    ch = feishu(http, fs, link_for=link_for)
    receipt = await ch.send_image("ou_a", sparse(tmp_path / "big.png", 11 * MB))
    assert receipt.sent_as == "file"
    assert fs.sent[-1]["msg_type"] == "file"
    assert fs.files[fs.sent[-1]["content"]["file_key"]][:2] == ("stream", "big.png")
    huge = sparse(tmp_path / "huge.zip", 31 * MB)
    assert (await ch.send_file("ou_a", huge)).sent_as == "link"
    assert fs.sent[-1]["msg_type"] == "text" and link_for(huge) in fs.sent[-1]["content"]["text"]
    with pytest.raises(DeliveryPermanentError, match="file too large for feishu"):
        await feishu(http, fs).send_file("ou_a", huge)


@pytest.mark.parametrize("probe", [None, NO_FFMPEG], ids=["ffprobe", "no-ffprobe"])
@pytest.mark.slow
async def test_feishu_picture_over_its_resolution_goes_as_file(fs, http, tmp_path, probe):
    """上传图片: at most 12000 × 12000 px (GIFs 2000 × 2000), bigger ones as files. With
    ffprobe the adapter sees it before uploading; without it the upload's refusal does."""
    if probe is None:
        need_ffmpeg()
    ch = feishu(http, fs, probe=probe or MediaProbe())
    wide = tmp_path / "wide.png"
    wide.write_bytes(png(12001, 4))
    receipt = await ch.send_image("ou_a", str(wide))
    assert receipt.sent_as == "file" and "12000" in receipt.note
    gif = tmp_path / "big.gif"
    gif.write_bytes(b"GIF89a" + (2400).to_bytes(2, "little") + (10).to_bytes(2, "little"))
    assert (await ch.send_image("ou_a", str(gif))).sent_as == "file"
    assert [s["msg_type"] for s in fs.sent] == ["file", "file"]
    assert fs.files[fs.sent[0]["content"]["file_key"]][1] == "wide.png"
    ok = tmp_path / "ok.png"
    ok.write_bytes(png(3000, 20))
    assert (await ch.send_image("ou_a", str(ok))).sent_as == "image"


@pytest.mark.slow
async def test_feishu_video_is_media_with_cover_and_duration(fs, http, tmp_path):
    video = clip(tmp_path / "clip.mp4", seconds=2)
    receipt = await feishu(http, fs).send_video("ou_a", video)
    assert receipt.sent_as == "video"
    (sent,) = fs.sent
    assert sent["msg_type"] == "media"
    key = sent["content"]["file_key"]
    assert fs.files[key][0] == "mp4" and fs.durations[key] == "2000"
    assert fs.images[sent["content"]["image_key"]][:2] == b"\xff\xd8"


async def test_feishu_video_without_ffmpeg_goes_as_file_and_says_why(fs, http, tmp_path):
    video = tmp_path / "clip.mp4"
    video.write_bytes(os.urandom(4096))
    receipt = await feishu(http, fs, probe=NO_FFMPEG).send_video("ou_a", str(video))
    assert receipt.sent_as == "file" and "ffmpeg" in receipt.note
    assert [s["msg_type"] for s in fs.sent] == ["file"]


@pytest.mark.slow
async def test_feishu_audio_is_opus_else_a_file(fs, http, tmp_path):
    ch = feishu(http, fs)
    voice = tone(tmp_path / "note.opus")
    await ch.send_audio("ou_a", voice)
    mp3 = tone(tmp_path / "song.mp3")
    converted = await ch.send_audio("ou_a", mp3)  # ffmpeg makes the Opus the API wants
    no_ffmpeg = feishu(http, fs, probe=MediaProbe(None, None))
    as_file = await no_ffmpeg.send_audio("ou_a", mp3)
    assert [s["msg_type"] for s in fs.sent] == ["audio", "audio", "file"]
    assert 1500 < int(fs.durations[fs.sent[0]["content"]["file_key"]]) < 2500
    assert "converted from .mp3 to Opus" in converted.note
    assert "ffmpeg not installed" in as_file.note


@pytest.mark.slow
async def test_feishu_group_chat_and_replies(fs, http):
    ch = feishu(http, fs)
    await ch.send_text(FS_GROUP, "hello group")
    await ch.send_text(f"chat:{FS_GROUP}", "again")
    asked = fs.receive(FS_GROUP)
    await ch.send_text(f"chat:{FS_GROUP}#{asked}", "the answer")
    await ch.send_text(FS_GROUP, "to a withdrawn message", reply_to="om_gone")
    assert [(s["receive_id_type"], s["receive_id"], s.get("reply_to")) for s in fs.sent] == [
        ("chat_id", FS_GROUP, None),
        ("chat_id", FS_GROUP, None),
        ("chat_id", FS_GROUP, asked),
        ("chat_id", FS_GROUP, None),  # the reply failed: said in the chat instead
    ]
    with pytest.raises(DeliveryPermanentError, match="bot is not in this group chat"):
        await ch.send_text("oc_elsewhere", "x")
    with pytest.raises(DeliveryPermanentError, match="availability range"):
        await ch.send_text("ou_blocked", "x")


@pytest.mark.slow
async def test_feishu_long_text_stays_under_the_request_limit(fs, http):
    line = '"quoted" and \\escaped\\ text ' * 4
    await feishu(http, fs).send_text("ou_a", "\n".join([line] * 4000))  # ~ 0.5 MB escaped
    assert len(fs.sent) > 1 and all(s["msg_type"] == "text" for s in fs.sent)
    assert sum(s["content"]["text"].count("quoted") for s in fs.sent) == 4 * 4000


async def test_feishu_token_expiring_mid_batch_is_refreshed_once(fs, http):
    ch = feishu(http, fs)
    fs.tokens.expire_after = 6  # the first token serves 6 sends, its successor the other 6
    await asyncio.gather(*(ch.send_text("ou_a", f"m{i}") for i in range(12)))
    assert sorted(s["content"]["text"] for s in fs.sent) == sorted(f"m{i}" for i in range(12))
    assert len(fs.calls("/open-apis/auth/v3/tenant_access_token/internal")) == 2
    assert ch.tokens.fetches == 2


# --- WeCom --------------------------------------------------------------------------------


@pytest.mark.slow
async def test_wecom_limits_per_kind(wc, http, tmp_path):
    ch = wecom(http, wc, link_for=link_for, probe=NO_FFMPEG)
    (tmp_path / "a.gif").write_bytes(os.urandom(64))
    (tmp_path / "v.mp4").write_bytes(os.urandom(64))
    (tmp_path / "s.mp3").write_bytes(os.urandom(64))
    (tmp_path / "tiny.txt").write_bytes(b"abc")
    assert (await ch.send_image("zhangsan", str(tmp_path / "a.gif"))).sent_as == "file"
    assert (await ch.send_video("zhangsan", str(tmp_path / "v.mp4"))).sent_as == "video"
    assert (await ch.send_audio("zhangsan", str(tmp_path / "s.mp3"))).sent_as == "file"
    big_video = sparse(tmp_path / "big.mp4", 11 * MB)
    assert (await ch.send_video("zhangsan", big_video)).sent_as == "file"
    huge = sparse(tmp_path / "huge.mp4", 21 * MB)
    assert (await ch.send_video("zhangsan", huge)).sent_as == "link"
    # a file WeCom cannot take at all (5 bytes or less) also reaches the reader as a link
    assert (await ch.send_file("zhangsan", str(tmp_path / "tiny.txt"))).sent_as == "link"
    assert [s["msgtype"] for s in wc.sent] == ["file", "video", "file", "file", "text", "text"]
    assert wc.sent[1]["video"]["title"] == "v.mp4"


@pytest.mark.slow
async def test_wecom_text_is_cut_to_2048_bytes(wc, http):
    await wecom(http, wc).send_text("zhangsan", "第一段。" * 300 + "\n\n" + "第二段。" * 300)
    assert len(wc.sent) >= 2
    assert all(len(s["text"]["content"].encode()) <= 2048 for s in wc.sent)
    assert wc.sent[0]["text"]["content"].startswith("第一段")


@pytest.mark.slow
async def test_wecom_group_chat_goes_through_appchat(wc, http, files_png):
    ch = wecom(http, wc)
    await ch.send_text("chat:wrchat1", "to the group")
    await ch.send_image("chat:wrchat1", files_png)
    assert [(s.get("chatid"), s["msgtype"]) for s in wc.sent] == [
        ("wrchat1", "text"),
        ("wrchat1", "image"),
    ]
    with pytest.raises(DeliveryPermanentError, match="chats this app created"):
        await ch.send_text("chat:nochat", "x")
    wc.untrusted_ip = True
    with pytest.raises(DeliveryPermanentError, match="trusted IPs"):
        await ch.send_text("zhangsan", "x")


async def test_wecom_token_expiring_mid_batch_is_refreshed_once(wc, http):
    ch = wecom(http, wc)
    wc.tokens.expire_after = 5
    await asyncio.gather(*(ch.send_text("zhangsan", f"m{i}") for i in range(10)))
    assert sorted(s["text"]["content"] for s in wc.sent) == sorted(f"m{i}" for i in range(10))
    assert len(wc.calls("/cgi-bin/gettoken")) == 2


# --- DingTalk -----------------------------------------------------------------------------


@pytest.mark.slow
async def test_dingtalk_video_carries_duration_and_cover(dt, http, tmp_path):
    video = clip(tmp_path / "clip.mp4", seconds=3)
    receipt = await dingtalk(http, dt).send_video(f"chat:{DT_GROUP}", video)
    assert receipt.sent_as == "video"
    (sent,) = dt.sent
    assert sent["msgKey"] == "sampleVideo" and sent["openConversationId"] == DT_GROUP
    p = sent["msgParam"]
    assert p["duration"] == "3" and p["videoType"] == "mp4"  # seconds
    assert dt.oapi.media[p["videoMediaId"]][0] == "video"
    mtype, _, cover = dt.oapi.media[p["picMediaId"]]
    assert mtype == "image" and cover[:2] == b"\xff\xd8"


@pytest.mark.slow
async def test_dingtalk_video_to_a_person_goes_as_a_file(dt, http, tmp_path):
    """One-to-one robot messages carry images, voice and files, not videos."""
    video = clip(tmp_path / "clip.mp4", seconds=2)
    receipt = await dingtalk(http, dt).send_video("user001", video)
    assert receipt.sent_as == "file" and "groups only" in receipt.note
    (sent,) = dt.sent
    assert (sent["userId"], sent["msgKey"]) == ("user001", "sampleFile")
    assert dt.oapi.media[sent["msgParam"]["mediaId"]][1] == "clip.mp4.zip"


@pytest.mark.slow
async def test_dingtalk_audio_carries_its_duration_in_ms(dt, http, tmp_path):
    voice = tone(tmp_path / "note.mp3", seconds=2)
    await dingtalk(http, dt).send_audio("user001", voice)
    (sent,) = dt.sent
    assert sent["msgKey"] == "sampleAudio"
    assert 1500 < int(sent["msgParam"]["duration"]) < 2500


@pytest.mark.slow
async def test_dingtalk_without_ffmpeg_video_and_voice_go_as_files(dt, http, tmp_path):
    ch = dingtalk(http, dt, probe=NO_FFMPEG)
    (tmp_path / "clip.mp4").write_bytes(os.urandom(4096))
    (tmp_path / "note.mp3").write_bytes(os.urandom(4096))
    video = await ch.send_video(f"chat:{DT_GROUP}", str(tmp_path / "clip.mp4"))
    voice = await ch.send_audio(f"chat:{DT_GROUP}", str(tmp_path / "note.mp3"))
    for r in (video, voice):
        assert r.sent_as == "file" and "ffprobe and ffmpeg not installed" in r.note
    assert [s["msgKey"] for s in dt.sent] == ["sampleFile", "sampleFile"]
    assert [s["msgParam"]["fileName"] for s in dt.sent] == ["clip.mp4.zip", "note.mp3.zip"]


@pytest.mark.slow
async def test_dingtalk_file_formats_and_limits(dt, http, tmp_path):
    ch = dingtalk(http, dt, link_for=link_for)
    csv = tmp_path / "rows.csv"
    csv.write_text("a,b\n1,2\n")
    await ch.send_file("user001", str(csv))
    sent = dt.sent[-1]["msgParam"]
    assert (sent["fileName"], sent["fileType"]) == ("rows.csv.zip", "zip")  # zipped to fit
    assert dt.oapi.media[sent["mediaId"]][1] == "rows.csv.zip"
    assert (await ch.send_image("user001", sparse(tmp_path / "a.png", 19 * MB))).sent_as == "image"
    big = sparse(tmp_path / "big.png", 21 * MB)  # over the image limit: a file, then a link
    assert (await ch.send_image("user001", big)).sent_as == "link"
    huge = sparse(tmp_path / "huge.pdf", 21 * MB)
    assert (await ch.send_file("user001", huge)).sent_as == "link"
    assert dt.sent[-1]["msgKey"] == "sampleText"
    assert link_for(huge) in dt.sent[-1]["msgParam"]["content"]


@pytest.mark.slow
async def test_dingtalk_long_text_stays_under_the_msg_param_limit(dt, http):
    """msgParam ≤ 15,000 bytes (the fake refuses more): a long Chinese text with quotes and
    line breaks, measured as escaped into msgParam, goes in pieces, in order."""
    para = "销售额“同比”增长\n" * 300  # ~ 8 KB of text, more once escaped
    text = "\n\n".join(f"第{i}段 " + para for i in range(4))
    await dingtalk(http, dt).send_text("user001", text)
    pieces = [s["msgParam"]["content"] for s in dt.sent]
    assert len(pieces) > 1 and all(s["msgKey"] == "sampleText" for s in dt.sent)
    joined = "".join(pieces)
    marks = [joined.index(f"第{i}段") for i in range(4)]
    assert marks == sorted(marks) and joined.count("销售额") == 4 * 300  # all of it, in order


@pytest.mark.slow
async def test_dingtalk_group_conversations(dt, http, files_png):
    ch = dingtalk(http, dt)
    await ch.send_text(DT_GROUP, "to the group")
    await ch.send_image(f"chat:{DT_GROUP}", files_png, reply_to="ignored")  # no replies
    assert [(s.get("openConversationId"), s["msgKey"]) for s in dt.sent] == [
        (DT_GROUP, "sampleText"),
        (DT_GROUP, "sampleImageMsg"),
    ]
    with pytest.raises(DeliveryPermanentError, match="robot is not in this group"):
        await ch.send_text("chat:cidNoRobot==", "x")
    dt.permission = False
    with pytest.raises(DeliveryPermanentError, match="qyapi_robot_sendmsg"):
        await ch.send_text("user001", "x")


@pytest.mark.slow
async def test_dingtalk_tokens_expiring_mid_batch_are_refreshed_once(dt, http, files_png):
    ch = dingtalk(http, dt)
    dt.tokens.expire_after = 6  # 12 messages: 6 on the first token, 6 on its successor
    dt.oapi.tokens.expire_after = 2  # 4 uploads: 2 and 2
    await asyncio.gather(
        *(ch.send_text("user001", f"m{i}") for i in range(8)),
        *(ch.send_image("user002", files_png) for _ in range(4)),
    )
    texts = [s["msgParam"]["content"] for s in dt.sent if s["msgKey"] == "sampleText"]
    assert sorted(texts) == sorted(f"m{i}" for i in range(8))
    assert sum(s["msgKey"] == "sampleImageMsg" for s in dt.sent) == 4
    assert len(dt.calls("/v1.0/oauth2/accessToken")) == 2
    assert len(dt.oapi.calls("/gettoken")) == 2


# --- through send_message -----------------------------------------------------------------


@pytest.mark.slow
async def test_send_message_reaches_a_group_and_replies(tg, fs, http):
    channels = {"telegram": telegram(http, tg), "feishu": feishu(http, fs)}
    asked_fs, asked_tg = fs.receive(FS_GROUP), tg.receive(TG_GROUP)
    r = await send_message(
        channels,
        to=[
            f"telegram:{TG_GROUP}",
            f"feishu:chat:{FS_GROUP}#{asked_fs}",
            {"channel": "telegram", "chat": TG_GROUP, "reply_to": asked_tg},
        ],
        text="weekly numbers",
    )
    assert r["ok"], r
    assert sorted(s.get("reply_to") or 0 for s in tg.sent) == [0, asked_tg]
    assert {s["chat_id"] for s in tg.sent} == {TG_GROUP}
    assert (fs.sent[0]["receive_id"], fs.sent[0].get("reply_to")) == (FS_GROUP, asked_fs)


async def test_a_link_comes_with_a_note_in_the_deployments_language(tg, http, tmp_path):
    """Built from the settings, the adapters write the link note in SKILLJOBS_LANGUAGE and
    sign the link under SKILLJOBS_PUBLIC_URL."""
    from delivery.channels.registry import build_channels
    from tests.helpers.settings import make_settings

    s = make_settings(
        tmp_path,
        redis_url=None,
        prefix="p",
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        public_url="https://jobs.example.com",
        language="zh",
    )
    ws = s.resolved_workspace_root / "r1" / "s1"
    ws.mkdir(parents=True)
    huge = sparse(ws / "报表.pdf", 51 * MB)
    receipt = await build_channels(s, http)["telegram"].send_file("1001", huge)
    assert receipt.sent_as == "link"
    text = tg.sent[-1]["text"]
    assert text.startswith("报表.pdf（51.0 MB）太大") and "https://jobs.example.com/files/" in text
