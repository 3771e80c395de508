"""What the person receives is what the author meant (C25, C26, C27).

Skills written the way the world writes them (``tests/result_skills``: a top-level PEP 723
script, a script calling ``main()`` bare, argparse sub-commands exporting JSON, a Node ESM
``status --json``, a JSON-array exporter, a 12k-character report, scripts failing with a
warning on stderr or with their errors above the last line, a raising in-process handler,
a script printing host paths) run through the real worker to a web session, Telegram and
Feishu (the local fakes). Every row of data reaches the person (in the text, or in the file
the text names), plain text stays plain, and a failure says the real reason.
"""

from __future__ import annotations

import csv
import io
import json
import runpy
import zipfile
from typing import Any

import pytest

from delivery.channels.web import list_messages
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.helpers.jobs import drain
from tests.helpers.real import job_json
from tests.helpers.settings import TESTS, make_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RESULT_SKILLS = TESTS / "result_skills"
CHAT = "3001"
OPEN_ID = "ou_results"


@pytest.fixture
async def svc(tmp_path, database_url, redis_server_url, redis_prefix, tg, fs):
    tg.known_chats.update(f"30{i:02d}" for i in range(60))
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=database_url,
        skills_path=str(RESULT_SKILLS),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        feishu_app_id=fs.app_id,
        feishu_app_secret=fs.app_secret,
        feishu_api_base=fs.url,
        worker_lease_sec=5.0,
        retry_backoff_sec=0.05,
    )
    services = await Services.open(s)
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


def base(**extra: Any) -> dict[str, Any]:
    return {"role_id": "r1", "org_id": "o1", **extra}


def tg_ctx(chat: str) -> dict[str, Any]:
    return base(channel="telegram", actor_key=chat)


def fs_ctx(open_id: str) -> dict[str, Any]:
    return base(channel="feishu", actor_key=open_id)


def web_ctx(session: str) -> dict[str, Any]:
    return base(channel="web", session_id=session, external_id=f"orgdeleg:{session}")


async def run_everywhere(svc: Services, skill: str, inp: dict[str, Any], n: int) -> dict[str, Any]:
    """``skill`` once to each channel (chat ``30<n>``, Feishu ``ou_results<n>``, session
    ``s-<skill>``); what each received, and the Telegram job."""
    chat, oid, session = f"30{n:02d}", f"{OPEN_ID}{n}", f"s-{skill}"
    ids = []
    for ctx in (tg_ctx(chat), fs_ctx(oid), web_ctx(session)):
        res = await Dispatcher(svc).dispatch(skill, inp, ctx)
        assert res.status_code == 202, res.body
        ids.append(res.body["job_id"])
    await drain(svc)
    return {"chat": chat, "oid": oid, "session": session, "ids": ids}


def tg_texts(tg: Any, chat: str) -> list[str]:
    return [m.get("text") or m.get("caption") or "" for m in tg.sent if m["chat_id"] == chat]


def tg_files(tg: Any, chat: str) -> dict[str, bytes]:
    return {
        m["filename"]: m["content"] for m in tg.sent if m["chat_id"] == chat and "filename" in m
    }


def fs_texts(fs: Any, oid: str) -> list[str]:
    out = []
    for m in fs.sent:
        if m["receive_id"] != oid:
            continue
        if m["msg_type"] == "text":
            out.append(m["content"]["text"])
        elif m["msg_type"] == "interactive":
            out.append(json.dumps(m["content"], ensure_ascii=False))
    return out


def fs_files(fs: Any, oid: str) -> dict[str, bytes]:
    out = {}
    for m in fs.sent:
        if m["receive_id"] == oid and m["msg_type"] == "file":
            _, name, data = fs.files[m["content"]["file_key"]]
            out[name] = data
    return out


async def web_messages(svc: Services, session: str) -> list[dict[str, Any]]:
    return list(await list_messages(svc.sessionmaker, session))


def web_files(messages: list[dict[str, Any]]) -> dict[str, bytes]:
    from pathlib import Path

    out = {}
    for m in messages:
        for a in m.get("attachments") or []:
            out[a["filename"]] = Path(a["local_path"]).read_bytes()
    return out


async def test_a_json_array_export_arrives_whole_on_every_channel(svc, tg, fs) -> None:
    got = await run_everywhere(svc, "recipe_box", {"_subcommand": "export", "format": "json"}, 1)
    want = runpy.run_path(str(RESULT_SKILLS / "recipe_box" / "recipes.py"))["RECIPES"]

    (text,) = tg_texts(tg, got["chat"])
    # a table of the records' fields, and the file holding all of them, named in the text
    assert "title       | url | servings" in text and "Quick Pasta | " in text
    assert "recipe_box-result.json" in text
    assert json.loads(tg_files(tg, got["chat"])["recipe_box-result.json"]) == want

    assert json.loads(fs_files(fs, got["oid"])["recipe_box-result.json"]) == want
    assert any("Tomato Soup" in t for t in fs_texts(fs, got["oid"]))

    msgs = await web_messages(svc, got["session"])
    assert "| Quick Pasta |" in msgs[0]["text"]
    assert json.loads(web_files(msgs)["recipe_box-result.json"]) == want


async def test_flat_records_come_as_a_table_and_a_csv(svc, tg, fs) -> None:
    got = await run_everywhere(svc, "csv_export", {}, 2)
    (text,) = tg_texts(tg, got["chat"])
    assert "customer 1 " in text and "… 10 more" in text  # 20 rows shown, the rest counted
    rows = list(
        csv.DictReader(io.StringIO(tg_files(tg, got["chat"])["csv_export-result.csv"].decode()))
    )
    assert len(rows) == 30 and rows[29] == {
        "id": "30",
        "customer": "customer 30",
        "total": "105.0",
        "paid": "true",
    }
    assert "csv_export-result.csv" in fs_files(fs, got["oid"])
    msgs = await web_messages(svc, got["session"])
    assert "csv_export-result.csv" in web_files(msgs)


async def test_nested_counts_are_shown_or_sent(svc, tg, fs) -> None:
    got = await run_everywhere(svc, "cards_status", {}, 3)
    (text,) = tg_texts(tg, got["chat"])
    # the counts the command exists to show are in the text itself
    assert "counts:\n  due: 7\n  new: 12" in text
    # the 13 intervals do not all fit: the whole result goes as a file
    data = json.loads(tg_files(tg, got["chat"])["cards_status-result.json"])
    assert data["intervals"]["leeches"] == 1 and data["counts"]["due"] == 7
    assert "cards_status-result.json" in fs_files(fs, got["oid"])


async def test_plain_text_stays_plain(svc, tg, fs) -> None:
    got = await run_everywhere(svc, "plain_report", {"store": "east"}, 4)
    printed = (
        "Inventory report\n================\n1. Check the *north* shelf\n"
        "1. Count the [spare] parts\n    indented note: keep_this_indentation\n"
        '# not a heading\n<at user_id="all">everyone</at> & <b>not bold</b>\nStore: east'
    )
    (sent,) = [m for m in tg.sent if m["chat_id"] == got["chat"]]
    assert sent["text"] == printed and "parse_mode" not in sent
    # a Feishu text message would read <at user_id="all"> as a mention of everyone
    safe = printed.replace("<at", "<\u200bat").replace("</at", "<\u200b/at")
    assert fs_texts(fs, got["oid"]) == [safe]
    msgs = await web_messages(svc, got["session"])
    assert [m["text"] for m in msgs] == [printed]


async def test_a_bare_main_script_runs_as_a_process_and_keeps_its_output(svc, tg) -> None:
    import os

    got = await run_everywhere(svc, "bare_main", {"name": "Ada", "worker_pid": os.getpid()}, 5)
    (text,) = tg_texts(tg, got["chat"])
    assert text == "Hello Ada, from pid-separate process: True\nargv0: greet.py"


async def test_a_long_report_is_split_then_sent_as_a_document(svc, tg, fs) -> None:
    got = await run_everywhere(svc, "long_report", {}, 6)
    texts = tg_texts(tg, got["chat"])
    assert 1 <= len(texts) <= 4 and all(len(t) <= 4096 for t in texts)
    assert "kept with the job" not in "".join(texts)
    # every row reaches the chat: in consecutive messages, the rest in a document
    doc = tg_files(tg, got["chat"]).get("long_report-output.txt", b"").decode()
    if doc:
        assert doc.count("product number") == 150 and "long_report-output.txt" in texts[-1]
    else:
        assert "".join(texts).count("product number") == 150
    assert (doc or texts[-1]).rstrip().endswith("END OF REPORT")
    # the columns stay aligned in a monospace block
    first = next(m for m in tg.sent if m["chat_id"] == got["chat"])
    assert first.get("parse_mode") == "HTML" and first["html"].startswith("<pre>")
    assert "1      product number 1 of the catalogue" in first["text"]
    joined = "".join(fs_texts(fs, got["oid"]))
    assert joined.count("product number") == 150
    msgs = await web_messages(svc, got["session"])
    assert sum(m["text"].count("product number") for m in msgs) == 150


async def test_a_report_past_a_few_messages_goes_as_a_document(svc, tg) -> None:
    got = await run_everywhere(svc, "long_report", {"rows": 400}, 11)
    texts = tg_texts(tg, got["chat"])
    assert len(texts) <= 4 and "long_report-output.txt" in texts[-1]
    doc = tg_files(tg, got["chat"])["long_report-output.txt"].decode()
    assert doc.count("product number") == 400 and doc.rstrip().endswith("END OF REPORT")


async def test_the_real_reason_of_a_failure(svc, tg, fs) -> None:
    got = await run_everywhere(svc, "pdf_reader", {}, 7)
    (text,) = tg_texts(tg, got["chat"])
    assert text == (
        "Sorry, pdf_reader could not finish: Opening scan.pdf (3 pages)\n"
        "Detected image-based PDF, use --vision mode instead."
    )
    job = await job_json(svc, got["ids"][0])
    assert "DeprecationWarning" in job["result"]["stderr_tail"]  # kept for the operator
    assert fs_texts(fs, got["oid"]) == [text]

    got = await run_everywhere(svc, "skill_packager_v2", {}, 8)
    (text,) = tg_texts(tg, got["chat"])
    assert "ERROR: SKILL.md frontmatter has no 'description'" in text
    assert "ERROR: name 'Demo' must be lowercase" in text
    assert "Please fix the validation errors before packaging" in text
    assert "Validating skill" not in text


async def test_a_raising_handler_keeps_its_traceback_and_prints(svc, tg) -> None:
    got = await run_everywhere(svc, "raising_tool", {"account": "zz"}, 9)
    (text,) = tg_texts(tg, got["chat"])
    assert text == "Sorry, raising_tool could not finish: account 'zz' is not in the ledger."
    job = await job_json(svc, got["ids"][0])
    assert job["result"]["stdout_tail"] == "loading the ledger for zz"
    assert "Traceback (most recent call last)" in job["result"]["stderr_tail"]
    from tests.helpers.jobs import job_and_attempts

    _, attempts = await job_and_attempts(svc, got["ids"][0])
    assert "ValueError: account 'zz' is not in the ledger" in (attempts[-1].stderr_tail or "")
    assert "loading the ledger for zz" in (attempts[-1].stdout_tail or "")


async def test_host_paths_become_names_and_the_file_comes_along(svc, tg) -> None:
    got = await run_everywhere(svc, "page_saver", {}, 10)
    texts = tg_texts(tg, got["chat"])
    joined = "\n".join(texts)
    assert "Read …/scan.pdf\nSaved page 1 as page_1.txt" in joined
    assert "/srv/" not in joined and str(svc.settings.resolved_workspace_root) not in joined
    assert tg_files(tg, got["chat"])["page_1.txt"] == b"page one\n"


async def test_a_materialized_url_field_is_not_repeated_as_text(
    tmp_path, database_url, redis_server_url, redis_prefix, fs
) -> None:
    from tests.fakes.sink import FakeFiles
    from tests.helpers.net import PNG

    with FakeFiles() as cdn:
        cdn.files["/chart.png"] = (PNG, "image/png")
        s = make_settings(
            tmp_path,
            redis_url=redis_server_url,
            prefix=redis_prefix,
            database_url=database_url,
            skills_path=str(RESULT_SKILLS),
            feishu_app_id=fs.app_id,
            feishu_app_secret=fs.app_secret,
            feishu_api_base=fs.url,
            fetch_allow_hosts=f"127.0.0.1:{cdn.port}",
        )
        svc = await Services.open(s)
        try:
            url = cdn.url + "/chart.png"
            res = await Dispatcher(svc).dispatch("chart_link", {"url": url}, fs_ctx("ou_chart"))
            assert res.status_code == 202, res.body
            await drain(svc)
        finally:
            await svc.close()
    sent = [m for m in fs.sent if m["receive_id"] == "ou_chart"]
    assert [m["msg_type"] for m in sent] == ["text", "image"]
    assert sent[0]["content"]["text"] == "title: Weekly orders"  # no "image_url: http://…"


async def test_wecom_and_dingtalk_get_every_row(
    tmp_path, database_url, redis_server_url, redis_prefix
) -> None:
    """Smaller messages (WeCom 2,048 bytes, DingTalk 15,000 bytes of msgParam): the 150-row
    report and the recipe export still reach the person whole."""
    from tests.fakes.dingtalk import FakeDingTalk
    from tests.fakes.wecom import FakeWeCom

    with FakeWeCom() as wc, FakeDingTalk() as dt:
        s = make_settings(
            tmp_path,
            redis_url=redis_server_url,
            prefix=redis_prefix,
            database_url=database_url,
            skills_path=str(RESULT_SKILLS),
            wecom_corp_id=wc.corp_id,
            wecom_corp_secret=wc.corp_secret,
            wecom_agent_id=str(wc.agent_id),
            wecom_api_base=wc.url,
            dingtalk_app_key=dt.app_key,
            dingtalk_app_secret=dt.app_secret,
            dingtalk_robot_code=dt.robot_code,
            dingtalk_api_base=dt.url,
            dingtalk_oapi_base=dt.oapi.url,
        )
        for skill in ("long_report", "recipe_box"):
            wc.users.add(f"wc_user_{skill}")
            dt.users.add(f"dt_user_{skill}")
        svc = await Services.open(s)
        try:
            for channel, who in (("wecom", "wc_user"), ("dingtalk", "dt_user")):
                for skill, inp in (
                    ("long_report", {}),
                    ("recipe_box", {"_subcommand": "export", "format": "json"}),
                ):
                    ctx = base(channel=channel, actor_key=f"{who}_{skill}")
                    res = await Dispatcher(svc).dispatch(skill, inp, ctx)
                    assert res.status_code == 202, res.body
            await drain(svc)
        finally:
            await svc.close()

        def wecom(user: str) -> tuple[str, dict[str, bytes]]:
            sent = [m for m in wc.sent if m.get("touser") == user]
            texts = "".join(
                m[m["msgtype"]]["content"] for m in sent if m["msgtype"] in ("text", "markdown")
            )
            files = {
                wc.media[m["file"]["media_id"]][1]: wc.media[m["file"]["media_id"]][2]
                for m in sent
                if m["msgtype"] == "file"
            }
            return texts, files

        def dingtalk(user: str) -> tuple[str, dict[str, bytes]]:
            sent = [m for m in dt.sent if m.get("userId") == user]

            def param(m: dict[str, Any]) -> dict[str, Any]:
                raw = m["msgParam"]
                return raw if isinstance(raw, dict) else json.loads(raw)

            texts = "".join(
                param(m).get("content") or param(m).get("text") or ""
                for m in sent
                if m["msgKey"] in ("sampleText", "sampleMarkdown")
            )
            files = {
                dt.oapi.media[param(m)["mediaId"]][1]: dt.oapi.media[param(m)["mediaId"]][2]
                for m in sent
                if m["msgKey"] == "sampleFile"
            }
            return texts, files

        for read, who in ((wecom, "wc_user"), (dingtalk, "dt_user")):
            texts, files = read(f"{who}_long_report")
            doc = files.get("long_report-output.txt", b"").decode()
            assert (doc or texts).count("product number") == 150, (who, texts[:200], list(files))
            texts, files = read(f"{who}_recipe_box")
            assert "Quick Pasta" in texts
            data = files.get("recipe_box-result.json")
            if data is None:  # DingTalk takes a few formats: others go zipped
                with zipfile.ZipFile(io.BytesIO(files["recipe_box-result.json.zip"])) as z:
                    data = z.read("recipe_box-result.json")
            assert json.loads(data)[1]["title"] == "Tomato Soup"
