"""send_message and the built-in notify / send_message skills, against fake channel servers
and a real database + Redis for web sessions."""

from __future__ import annotations

import importlib.util
import json
import os

import httpx
import pytest

from delivery.channels.registry import build_channels
from delivery.channels.web import ensure_session, list_messages
from delivery.send_message import parse_recipients, send_message
from tests.fakes.sink import FakeSink
from tests.fakes.telegram import rate_limited
from tests.helpers.settings import make_settings

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(512)


@pytest.fixture
def chart(tmp_path):
    p = tmp_path / "chart.png"
    p.write_bytes(PNG)
    return p


@pytest.fixture
async def channels(tmp_path, tg, fs, sessionmaker, redis, redis_prefix, redis_server_url):
    s = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        feishu_app_id=fs.app_id,
        feishu_app_secret=fs.app_secret,
        feishu_api_base=fs.url,
    )
    async with httpx.AsyncClient(timeout=10) as http:
        yield build_channels(s, http, sessionmaker=sessionmaker, redis=redis)


def test_parse_recipients_four_forms() -> None:
    found, bad = parse_recipients(
        [
            "feishu:ou_a",
            {"channel": "telegram", "contact": "1001"},
            "ou_b",
            "feishu:ou_a",
            "web:sess:with:colons",
            42,
        ],
        channel="feishu",
    )
    assert found == [
        ("feishu", "ou_a"),
        ("telegram", "1001"),
        ("feishu", "ou_b"),
        ("web", "sess:with:colons"),
    ]
    assert bad == [{"target": "42", "error": "a recipient must be a string or an object"}]
    found, bad = parse_recipients("ou_x")
    assert found == [] and "names no channel" in bad[0]["error"]


@pytest.mark.slow
async def test_every_form_reaches_its_channel(channels, tg, fs) -> None:
    r = await send_message(channels, to="feishu:ou_a", text="one")
    assert r == {
        "ok": True,
        "sent": ["feishu:ou_a"],
        "failed": [],
        "message": "sent to 1 recipient(s)",
    }
    r = await send_message(channels, to="ou_b", channel="feishu", text="two")
    r2 = await send_message(channels, to={"channel": "telegram", "contact": "1001"}, text="three")
    r3 = await send_message(channels, to=["feishu:oc_group", "telegram:1002"], text="four")
    assert r["ok"] and r2["ok"] and r3["ok"]
    assert [(m["receive_id"], m["content"]["text"]) for m in fs.sent] == [
        ("ou_a", "one"),
        ("ou_b", "two"),
        ("oc_group", "four"),
    ]
    assert [(m["chat_id"], m["text"]) for m in tg.sent] == [("1001", "three"), ("1002", "four")]


@pytest.mark.slow
async def test_partial_failure_unknown_and_unconfigured_channels(channels, tg) -> None:
    r = await send_message(
        channels, to=["telegram:1001", "wecom:zhangsan", "sms:123", "telegram:555"], text="hi"
    )
    assert r["ok"] is False and r["sent"] == ["telegram:1001"]
    errors = {f["target"]: f["error"] for f in r["failed"]}
    assert errors["wecom:zhangsan"] == "channel 'wecom' is not configured"
    assert errors["sms:123"].startswith("unknown channel 'sms'")
    assert "chat not found" in errors["telegram:555"]
    assert len(tg.sent) == 1


@pytest.mark.slow
async def test_attachments_caption_vs_separate_text(channels, tg, fs, chart) -> None:
    r = await send_message(
        channels,
        to=["telegram:1001", "feishu:ou_a"],
        text="your chart",
        attachments=[str(chart)],
        workspace=chart.parent,
    )
    assert r["ok"], r
    (photo,) = tg.sent
    assert photo["method"] == "sendPhoto" and photo["caption"] == "your chart"
    assert photo["content"] == PNG
    assert [m["msg_type"] for m in fs.sent] == ["text", "image"]  # no captions on Feishu
    assert fs.images[fs.sent[1]["content"]["image_key"]] == PNG


@pytest.mark.slow
async def test_attachment_rules(channels, tg, tmp_path, chart) -> None:
    r = await send_message(channels, to="telegram:1001", text="x", attachments=[str(chart)])
    assert "the caller has no workspace" in r["failed"][0]["error"]
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "in.png").write_bytes(PNG)
    r = await send_message(channels, to="telegram:1001", attachments=["in.png"], workspace=ws)
    assert r["ok"] and tg.sent[-1]["content"] == PNG
    r = await send_message(channels, to="telegram:1001", attachments=[str(chart)], workspace=ws)
    assert "outside the workspace" in r["failed"][0]["error"]
    r = await send_message(channels, to="telegram:1001", text="  ")
    assert "nothing to send" in r["failed"][0]["error"]


@pytest.mark.slow
async def test_transient_error_is_retried(channels, tg) -> None:
    tg.fail_next(f"/bot{tg.token}/sendMessage", rate_limited(0))
    r = await send_message(channels, to="telegram:1001", text="after a 429", backoff=0.01)
    assert r["ok"] and tg.sent[0]["text"] == "after a 429"
    assert len(tg.calls(f"/bot{tg.token}/sendMessage")) == 2


@pytest.mark.slow
async def test_web_session_and_unknown_session(channels, sessionmaker, chart) -> None:
    await ensure_session(sessionmaker, "sess-1", channel="web")
    r = await send_message(
        channels,
        to=["web:sess-1", "web_admin:missing"],
        text="done",
        attachments=[str(chart)],
        workspace=chart.parent,
    )
    assert r["sent"] == ["web:sess-1"]
    assert r["failed"] == [{"target": "web_admin:missing", "error": "unknown session 'missing'"}]
    (msg,) = await list_messages(sessionmaker, "sess-1")
    assert msg["text"] == "done" and msg["attachments"][0]["filename"] == "chart.png"


# --- the built-in skills ----------------------------------------------------------------


def load_handler(repo_root, name: str):
    spec = importlib.util.spec_from_file_location(
        f"skill_{name}", repo_root / "skills" / name / "handler.py"
    )
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_skill_folders_load(repo_root) -> None:
    from jobs.catalog.loader import load_skill

    for name in ("notify", "send_message"):
        skill = load_skill(repo_root / "skills" / name, builtin=True)
        assert skill.error is None, skill.error
        assert skill.category == "channel" and not skill.is_async
        assert skill.input_schema and "required" in skill.input_schema


@pytest.mark.slow
async def test_send_message_skill(repo_root, monkeypatch, tg, sessionmaker, tmp_path) -> None:
    monkeypatch.setenv("SKILLJOBS_TELEGRAM_BOT_TOKEN", tg.token)
    monkeypatch.setenv("SKILLJOBS_TELEGRAM_API_BASE", tg.url)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SKILLJOBS_REDIS_URL", raising=False)
    await ensure_session(sessionmaker, "s9")
    handler = load_handler(repo_root, "send_message")
    # a business caller (not the chat line): recipients from its data
    ctx = {"db_factory": sessionmaker, "workspace_dir": str(tmp_path), "chat_mode": False}
    r = await handler.execute({"to": ["telegram:1001", "web:s9"], "message": "from a skill"}, ctx)
    assert r["ok"] and r["sent"] == ["telegram:1001", "web:s9"]
    assert tg.sent[0]["text"] == "from a skill"
    assert (await list_messages(sessionmaker, "s9"))[0]["text"] == "from a skill"
    r = await handler.execute({"to": "dingtalk:u1", "message": "x"}, ctx)
    assert r["ok"] is False and "not configured" in r["error"]


@pytest.mark.slow
async def test_notify_skill(repo_root, monkeypatch, tmp_path) -> None:
    (tmp_path / "r.txt").write_text("report")
    with FakeSink() as sink:
        monkeypatch.setenv(
            "SKILLJOBS_NOTIFY_TARGETS", json.dumps({"ops": f"json://127.0.0.1:{sink.port}/ops"})
        )
        monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("SKILLJOBS_FETCH_ALLOW_HOSTS", "127.0.0.1")
        handler = load_handler(repo_root, "notify")
        r = await handler.execute(
            {"message": "hi", "target": "ops", "attach": ["r.txt"]},
            {"workspace_dir": str(tmp_path)},
        )
        assert r["ok"], r
        body = sink.calls("/ops")[0].json
        assert body["message"] == "hi" and body["attachments"][0]["filename"] == "r.txt"
        r = await handler.execute({"message": "hi", "target": "nobody"}, {})
        assert r["ok"] is False and "unknown notify target" in r["error"]


@pytest.mark.slow
async def test_skills_reachable_through_call_skill(
    repo_root, monkeypatch, tg, sessionmaker, tmp_path
) -> None:
    """A business skill calls send_message and notify via call_skill on the real executor."""
    import os as _os

    from jobs.catalog.loader import load_registry
    from jobs.crypto import SecretBox, load_or_create_key
    from jobs.execution.executor import Executor

    with FakeSink() as sink:
        monkeypatch.setenv("SKILLJOBS_TELEGRAM_BOT_TOKEN", tg.token)
        monkeypatch.setenv("SKILLJOBS_TELEGRAM_API_BASE", tg.url)
        monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv(
            "SKILLJOBS_NOTIFY_TARGETS", json.dumps({"ops": f"json://127.0.0.1:{sink.port}/ops"})
        )
        monkeypatch.setenv("SKILLJOBS_FETCH_ALLOW_HOSTS", "127.0.0.1")
        monkeypatch.delenv("SKILLJOBS_REDIS_URL", raising=False)
        skills = _os.pathsep.join(
            [str(repo_root / "skills"), str(repo_root / "tests/fakes/skills")]
        )
        settings = make_settings(tmp_path, redis_url=None, prefix="p", skills_path=skills)
        registry = load_registry(settings.skill_dirs)
        ex = Executor(
            settings=settings,
            registry=registry,
            sessionmaker=sessionmaker,
            box=SecretBox(load_or_create_key(tmp_path, None)),
        )
        try:
            ctx = {"role_id": "r1", "session_id": "s1", "channel": "feishu", "actor_key": "ou_now"}
            out = await ex.run(
                "relay", {"message": "ticket 3 fixed", "to": "telegram:1001", "target": "ops"}, ctx
            )
        finally:
            await ex.aclose()
    assert out["send_message"]["sent"] == ["telegram:1001"], out
    assert out["notify"]["ok"] is True, out
    assert tg.sent[0]["text"] == "ticket 3 fixed"
    assert sink.calls("/ops")[0].json["title"] == "relay"


@pytest.mark.slow
async def test_own_chat_with_a_message_anchor_is_the_callers_and_replies(channels, tg, fs):
    """From the chat line, ``<contact>#<message id>`` in the caller's own chat (their id or
    the group they talk in) is their own chat, and answers that message; the anchor does not
    open any other chat."""
    from delivery.send_message import Sender

    me = Sender(role_id="r1", org_id="o1", channel="telegram", actor_key="1001", direct=True)
    asked = tg.receive("1001")
    r = await send_message(channels, to=f"telegram:1001#{asked}", text="yes", sender=me)
    assert r["ok"] and r["sent"] == [f"telegram:1001#{asked}"], r
    assert (tg.sent[-1]["chat_id"], tg.sent[-1]["reply_to"]) == ("1001", asked)
    r = await send_message(channels, to=f"telegram:1002#{asked}", text="no", sender=me)
    assert r["sent"] == [] and "only your own chat" in r["failed"][0]["error"]

    # in a group: the group (in any of its forms, with an anchor) is the caller's chat too
    group = "-1001234567890"
    in_group = Sender(
        role_id="r1",
        org_id="o1",
        channel="telegram",
        actor_key="1001",
        direct=True,
        conversation_id=group,
    )
    asked = tg.receive(group)
    to = [f"telegram:chat:{group}#{asked}", f"telegram:{group}", "telegram:-1009#1"]
    r = await send_message(channels, to=to, text="for the group", sender=in_group)
    assert r["sent"] == to[:2] and r["failed"][0]["target"] == "telegram:-1009#1"
    assert sorted((m["chat_id"], m.get("reply_to") or 0) for m in tg.sent[-2:]) == [
        (group, 0),
        (group, asked),
    ]

    feishu_me = Sender(channel="feishu", actor_key="ou_a", direct=True, conversation_id="oc_group1")
    asked_fs = fs.receive("oc_group1")
    r = await send_message(
        channels,
        to=["feishu:ou_a#om_nope", f"feishu:chat:oc_group1#{asked_fs}", "feishu:chat:ou_a"],
        text="answer",
        sender=feishu_me,
    )
    assert r["sent"] == ["feishu:ou_a#om_nope", f"feishu:chat:oc_group1#{asked_fs}"], r
    assert r["failed"][0]["target"] == "feishu:chat:ou_a"  # not a chat of the caller's
    assert sorted((m["receive_id"], m.get("reply_to") or "") for m in fs.sent) == [
        ("oc_group1", asked_fs),
        ("ou_a", ""),  # om_nope is gone: said in the chat instead
    ]


async def test_send_message_skill_from_a_group_reaches_that_group(
    repo_root, monkeypatch, tg, sessionmaker, tmp_path
) -> None:
    monkeypatch.setenv("SKILLJOBS_TELEGRAM_BOT_TOKEN", tg.token)
    monkeypatch.setenv("SKILLJOBS_TELEGRAM_API_BASE", tg.url)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("SKILLJOBS_REDIS_URL", raising=False)
    handler = load_handler(repo_root, "send_message")
    group = "-1001234567890"
    asked = tg.receive(group)
    ctx = {  # the chat line's own call (direct), in a group conversation
        "channel": "telegram",
        "actor_key": "1001",
        "role_id": "r1",
        "conversation_id": group,
        "message_id": str(asked),
        "db_factory": sessionmaker,
        "chat_mode": True,
    }
    r = await handler.execute({"to": f"telegram:{group}#{asked}", "message": "done"}, ctx)
    assert r["ok"], r
    assert (tg.sent[-1]["chat_id"], tg.sent[-1]["reply_to"]) == (group, asked)
    r = await handler.execute({"to": "telegram:-1009", "message": "elsewhere"}, ctx)
    assert r["ok"] is False and "only your own chat" in r["error"]
