"""Audio in the format a channel takes (delivery/audio.py), on real files made by ffmpeg:
an MP3 goes to Feishu's audio message as Opus, a voice note without ffmpeg goes as audio
with the reason in the receipt, and a file ffmpeg cannot read is not sent half-converted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.audio import FOLDER, convert, targets_for
from delivery.channels.feishu import FeishuChannel
from delivery.channels.probe import MediaProbe
from delivery.channels.telegram import TelegramChannel
from tests.helpers.media import need_ffmpeg, tone


def test_targets_follow_what_the_channel_takes() -> None:
    assert [t.suffix for t in targets_for({"ogg", "oga", "opus"})] == ["ogg", "opus", "oga"]
    assert [t.suffix for t in targets_for({"mp3", "m4a"})] == ["mp3", "m4a"]
    assert targets_for({"flac"}) == []


@pytest.mark.slow
async def test_mp3_goes_to_feishu_as_an_opus_audio_message(tmp_path: Path, fs: Any) -> None:
    mp3 = tone(tmp_path / "memo.mp3", seconds=1.2)
    async with httpx.AsyncClient(timeout=10) as http:
        ch = FeishuChannel(http, fs.app_id, fs.app_secret, api_base=fs.url)
        receipt = await ch.send_media("audio", "ou_a", mp3)
    assert receipt.sent_as == "audio"
    assert receipt.note == "converted from .mp3 to Opus with ffmpeg"
    ((ftype, name, body),) = fs.files.values()
    assert ftype == "opus" and name.endswith(".opus") and body[:4] == b"OggS"
    assert [m["msg_type"] for m in fs.sent] == ["audio"]


async def test_without_ffmpeg_a_voice_note_goes_as_audio_and_says_why(
    tmp_path: Path, tg: Any
) -> None:
    mp3 = tone(tmp_path / "memo.mp3", seconds=1.0)
    async with httpx.AsyncClient(timeout=10) as http:
        ch = TelegramChannel(http, tg.token, api_base=tg.url, probe=MediaProbe(None, None))
        receipt = await ch.send_media("voice", "1001", mp3)
    assert receipt.sent_as == "audio"
    assert "not as a voice note" in receipt.note and "ffmpeg not installed" in receipt.note
    (msg,) = tg.sent
    assert msg["method"] == "sendAudio" and msg["filename"] == "memo.mp3"
    assert not (tmp_path / FOLDER).exists() or not any((tmp_path / FOLDER).iterdir())


async def test_a_file_ffmpeg_cannot_read_is_not_converted(tmp_path: Path) -> None:
    need_ffmpeg()
    bad = tmp_path / "broken.mp3"
    bad.write_bytes(b"ID3" + bytes(300))
    probe = MediaProbe()
    out = await convert(probe.ffmpeg, str(bad), {"ogg"})
    assert out.path is None and "ffmpeg could not convert it" in out.reason
    assert not [p for p in (tmp_path / FOLDER).iterdir() if p.suffix == ".ogg"]
