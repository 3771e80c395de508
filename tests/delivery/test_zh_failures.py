"""Person-facing failure texts in Chinese, end to end: a real worker runs a raising skill, a
skill that overruns its wall clock and one that is not configured, and delivers to the fake
Telegram with ``SKILLJOBS_LANGUAGE=zh``; no word of ours in English reaches the person."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobs.services import Services
from tests.helpers.jobs import dispatch, drain
from tests.helpers.real import chat_texts, tg_ctx
from tests.helpers.settings import make_settings

pytestmark = pytest.mark.integration

SKILLS = {
    "flaky_job": (
        "async: true\n",
        "def main(data, ctx):\n"
        "    raise ValueError('upstream answered 502 for report ' + str(data.get('n', 0)))\n",
    ),
    "slow_report": (
        "async: true\ntimeout_sec: 1\n",
        "import time\n\n\ndef main(data, ctx):\n    time.sleep(30)\n    return {'message': 'done'}\n",
    ),
    "weather_push": (
        "async: true\nmetadata:\n  openclaw:\n    requires:\n      env: [WEATHER_API_KEY]\n",
        "def main(data, ctx):\n    return {'message': 'sunny'}\n",
    ),
}

#: an ASCII word: what may remain is the skill's own text, names, ids and numbers
WORD = re.compile(r"[A-Za-z]{2,}")


def write_skills(root: Path) -> Path:
    for name, (front, code) in SKILLS.items():
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: A test skill that fails.\n{front}---\n# {name}\n",
            encoding="utf-8",
        )
        (folder / "handler.py").write_text(code, encoding="utf-8")
    return root


def english_words(text: str, allowed: str) -> list[str]:
    """The ASCII words of ``text`` that are not in ``allowed`` (skill names, its message)."""
    ok = set(WORD.findall(allowed))
    return [w for w in WORD.findall(text) if w not in ok]


@pytest.fixture
async def zh_services(tmp_path, sqlite_url, redis_server_url, redis_prefix, tg):  # type: ignore[no-untyped-def]
    tg.known_chats.update({"3001", "3002", "3003"})
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        skills_path=str(write_skills(tmp_path / "skills")),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        language="zh",
        worker_lease_sec=5.0,
        retry_backoff_sec=0.05,
    )
    svc = await Services.open(s)
    yield svc
    if svc.redis is not None:
        keys = [k async for k in svc.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await svc.redis.delete(*keys)
    await svc.close()


async def test_failures_reach_the_person_in_chinese_only(zh_services, tg) -> None:
    await dispatch(zh_services, "flaky_job", {"n": 7}, tg_ctx("3001"))
    await dispatch(zh_services, "slow_report", {}, tg_ctx("3002"))
    await dispatch(zh_services, "weather_push", {}, tg_ctx("3003"))
    await drain(zh_services)
    raised, timed_out, unset = (chat_texts(tg, c) for c in ("3001", "3002", "3003"))
    print(raised, timed_out, unset)
    assert len(raised) == len(timed_out) == len(unset) == 1
    assert raised[0].startswith("抱歉，flaky_job 未能完成：")
    assert "upstream answered 502 for report 7" in raised[0]
    assert english_words(raised[0], "flaky_job upstream answered for report") == []
    assert timed_out[0].startswith("抱歉，slow_report 未能完成：")
    assert english_words(timed_out[0], "slow_report") == []
    assert unset[0].startswith("抱歉，weather_push 尚未配置")
    assert english_words(unset[0], "weather_push WEATHER_API_KEY") == []
