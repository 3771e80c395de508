"""Real skills, real results: what a skill prints reaches the person who asked.

Every skill of ``tests/real_skills`` runs for real (shell, Python CLI, argparse, a
``sys.argv`` script, in-process handlers, Node) on the sync line, and in the background
to a Telegram chat (the local fake Bot API) and to an orgdeleg web session, through a
real arq worker. Nothing of our own code is mocked.
"""

from __future__ import annotations

import pytest

from tests.helpers.real import (
    CORPUS,
    REAL_SKILLS,
    background,
    chat_texts,
    job_json,
    orgdeleg_ctx,
    session_texts,
    sync_answer,
    tg_ctx,
    web_ctx,
)

STANDUP = (
    "Stand-up notes for team core\n"
    "- merged: retry budget for transient failures\n"
    "- merged: dashboard filters by skill\n"
    "- in review: Feishu card rendering"
)
STANDUP_TG = STANDUP  # printed text stays as printed: its "- " lines are not a Markdown list
FRAMES = "clip: clip.mp4\nfps: 24\nduration_sec: 10\nframes: 240\nkeyframes: 0, 120, 239"


async def run_corpus(svc, tg) -> dict[str, dict]:
    """Each corpus skill once to Telegram and once to a web session, in one worker drain:
    ``{skill: {"tg": [texts], "web": [texts], "job": job JSON, "web_job": job JSON}}``."""
    runs, where = [], []
    for i, (skill, inp) in enumerate(CORPUS.items()):
        chat, session = f"20{i:02d}", f"s-{skill}"
        runs += [(skill, inp, tg_ctx(chat)), (skill, inp, orgdeleg_ctx(session))]
        where.append((skill, chat, session))
    ids, _ = await background(svc, runs)
    out: dict[str, dict] = {}
    for n, (skill, chat, session) in enumerate(where):
        out[skill] = {
            "tg": chat_texts(tg, chat),
            "web": await session_texts(svc, session),
            "job": await job_json(svc, ids[2 * n]),
            "web_job": await job_json(svc, ids[2 * n + 1]),
        }
    return out


@pytest.mark.slow
async def test_every_real_skill_reaches_telegram_and_the_web_session(
    database_url, real_services, tg
) -> None:
    got = await run_corpus(real_services, tg)
    for skill, seen in got.items():
        for text in seen["tg"] + seen["web"]:
            assert text and text != f"{skill} finished.", (skill, text)
        assert len(seen["tg"]) == 1 and len(seen["web"]) == 1, (skill, seen)

    # text-printing shell CLI: its stdout is the message, as printed (C25)
    assert got["standup_notes"]["web"] == [STANDUP]
    assert got["standup_notes"]["tg"] == [STANDUP_TG]
    assert got["standup_notes"]["job"]["status"] == "succeeded"

    # stdout error + exit 1: the reason is the stdout line, both tails kept on the job
    job = got["dupe_finder"]["job"]
    assert job["status"] == "failed"
    assert "Error: folder not found: nope" in job["error"] and "no stderr" not in job["error"]
    assert job["result"]["user_message"] == "Error: folder not found: nope"
    assert "Scanning nope ..." in job["result"]["stdout_tail"]
    assert job["result"]["stderr_tail"] == ""
    want = "Sorry, dupe_finder could not finish: Error: folder not found: nope."
    assert got["dupe_finder"]["tg"] == [want] == got["dupe_finder"]["web"]

    # argparse CLI
    assert got["flashcards"]["web"][0].startswith("3 cards due in spanish:\n  * spanish card 1")
    assert got["flashcards"]["tg"][0].startswith("3 cards due in spanish:\n  * spanish card 1")
    (plain,) = [m for m in tg.sent if m.get("text") == got["flashcards"]["tg"][0]]
    assert "parse_mode" not in plain

    # a sys.argv script runs as a subprocess: it never sees the host's argv
    report = got["sysinfo_report"]["tg"][0]
    assert report.startswith("System report\npython: ") and "argv: (none)" in report
    assert "cwd is the skill folder: False" in report
    assert not (REAL_SKILLS / "sysinfo_report" / "sysinfo.log").exists()

    # JSON without a message: a readable rendering, secret-looking names are data (C12)
    costs = got["model_costs"]["tg"][0]
    assert "total_usd: 33.0" in costs and "period:\n  from: 2026-11-01\n  to: 2026-11-30" in costs
    # an array of records as a table (Telegram: aligned columns in a <pre>), nothing elided
    assert "models (4):\n\nmodel         | calls | usd\n" in costs
    assert "deepseek-chat | 90    | 0.3" in costs
    assert "schema_keys: model, calls, usd" in costs and "primary_key: model" in costs
    assert "| claude-sonnet | 800 | 12.1 |" in got["model_costs"]["web"][0]
    result = got["model_costs"]["job"]["result"]
    assert result["schema_keys"] == ["model", "calls", "usd"] and result["primary_key"] == "model"

    # display_md + message: appended as Markdown on the web, as HTML on Telegram (the table
    # in a <pre> of aligned columns)
    (web,) = got["bench_table"]["web"]
    assert web.startswith("2 benchmarks aggregated, no regressions.\n\n## Benchmarks\n\n| case |")
    assert "| render 1 MB | **3.1** | 4.0 |" in web
    (tg_text,) = got["bench_table"]["tg"]
    assert tg_text.startswith("2 benchmarks aggregated, no regressions.\n\nBenchmarks\n\ncase ")
    assert "**" not in tg_text and "|---|" not in tg_text
    assert "render 1 MB |    3.1 |    4.0\n" in tg_text
    (sent,) = [m for m in tg.sent if m.get("text") == tg_text]
    assert sent["parse_mode"] == "HTML" and "<b>Benchmarks</b>" in sent["html"]
    assert [e["type"] for e in sent["entities"]] == ["bold", "pre"]

    # partial result: a line in the text, a flag on the job record
    crawl = got["site_crawl"]
    want_first = "⚠ Partial result: stopped after 50 of 120 pages (page budget reached)"
    assert crawl["tg"][0].splitlines()[0] == want_first
    # the author's message is what the person reads (the pages are for the caller)
    assert crawl["tg"][0].endswith("Crawled 50 pages.")
    assert not [m for m in tg.sent if m.get("filename")]
    assert crawl["web"][0].splitlines()[0] == want_first
    assert crawl["job"]["partial"] is True and crawl["web_job"]["partial"] is True
    assert got["standup_notes"]["job"]["partial"] is False

    # Node script printing JSON without a message
    assert got["clip_frames"]["tg"] == [FRAMES] == got["clip_frames"]["web"]


@pytest.mark.slow
async def test_sync_answers_of_the_same_skills(real_services) -> None:
    svc = real_services
    ctx = web_ctx("s-sync")
    notes = await sync_answer(svc, "standup_notes", {"team": "core"}, ctx)
    assert notes["ok"] is True and notes["output"].strip() == STANDUP

    dupes = await sync_answer(svc, "dupe_finder", {"folder": "nope"}, ctx)
    assert dupes["ok"] is False and dupes["user_message"] == "Error: folder not found: nope"
    assert dupes["exit_code"] == 1

    bad = await sync_answer(svc, "flashcards", {}, ctx)  # --deck missing: argparse exits 2
    assert bad["ok"] is False and bad["exit_code"] == 2
    assert bad["user_message"] == "srs: error: the following arguments are required: --deck"
    assert "usage: srs" in bad["stderr_tail"]

    frames = await sync_answer(svc, "clip_frames", {"duration_sec": 2, "fps": 30}, ctx)
    assert frames == {
        "ok": True,
        "clip": "clip.mp4",
        "fps": 30,
        "duration_sec": 2,
        "frames": 60,
        "keyframes": [0, 30, 59],
    }
    crawl = await sync_answer(svc, "site_crawl", {"budget": 3}, ctx)
    assert crawl["completed"] is False and crawl["pages"] == [f"/docs/page-{i}" for i in range(3)]


@pytest.mark.slow
async def test_argparse_failure_reaches_telegram_as_its_error_line(real_services, tg) -> None:
    ids, _ = await background(real_services, [("flashcards", {}, tg_ctx("2039"))])
    assert chat_texts(tg, "2039") == [
        "Sorry, flashcards could not finish: srs: error: the following arguments are "
        "required: --deck."
    ]
    job = await job_json(real_services, ids[0])
    assert job["status"] == "failed" and "usage: srs" in job["result"]["stderr_tail"]


@pytest.mark.slow
async def test_a_skill_md_only_folder_is_listed_and_refused_with_a_hint(real_services) -> None:
    from jobs.queue.dispatcher import Dispatcher

    skill = real_services.registry.get("skill_packager")
    assert skill is not None and skill.loaded and skill.skill_type.value == "skill_md"
    assert any("os: darwin" in w for w in skill.warnings)
    assert any("metadata.clawdbot" in w for w in skill.warnings)
    res = await Dispatcher(real_services).dispatch("skill_packager", {}, web_ctx("s-doc"))
    assert res.status_code == 400
    assert "exec: {primary: {entry: scripts/package_skill.py}}" in res.body["error"]


@pytest.mark.parametrize("real_services", ["zh"], indirect=True)
@pytest.mark.slow
async def test_chinese_texts_when_configured(real_services, tg) -> None:
    svc = real_services
    runs = [
        ("dupe_finder", {"folder": "nope"}, tg_ctx("2030")),
        ("site_crawl", {"budget": 5}, tg_ctx("2031")),
        ("model_costs", {}, tg_ctx("2032")),
        ("standup_notes", {}, tg_ctx("2033", locale="en-US")),  # the caller's locale wins
    ]
    _, receipts = await background(svc, runs)
    assert receipts[0]["message"].startswith("这个任务需要一些时间")
    assert receipts[3]["message"].startswith("This will take a while")
    assert chat_texts(tg, "2030") == ["抱歉，dupe_finder 未能完成：Error: folder not found: nope。"]
    assert chat_texts(tg, "2031")[0].splitlines()[0].startswith("⚠ 部分结果：stopped after 5")
    assert "models (4):\n\nmodel         | calls | usd" in chat_texts(tg, "2032")[0]
    assert chat_texts(tg, "2033")[0].startswith("Stand-up notes for team core")


@pytest.mark.slow
async def test_a_context_locale_switches_an_english_deployment_to_chinese(
    real_services, tg
) -> None:
    runs = [("dupe_finder", {"folder": "nope"}, orgdeleg_ctx("s-zh", locale="zh-CN"))]
    _, receipts = await background(real_services, runs)
    assert receipts[0]["message"].startswith("这个任务需要一些时间")
    texts = await session_texts(real_services, "s-zh")
    assert texts == ["抱歉，dupe_finder 未能完成：Error: folder not found: nope。"]
