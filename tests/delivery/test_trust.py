"""Trust: no file, secret or message reaches someone it should not.

Through the real worker (real Redis, SQLite and PostgreSQL), the fake Telegram server,
Apprise to loopback sinks and the real dashboard app: backfill is scoped to the run, third-
party jobs without a session get one workspace per person, sending is confined to the
caller's workspace and allow-lists, logs carry no credential, and file links are signed.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from delivery.artifacts import BACKFILL_MAX_FILES, CAP_REASON, collect
from delivery.channels.web import ensure_session, list_messages
from jobs.context import job_segment, job_workspace, recipient_segment
from jobs.links import FILE_KIND, LinkError, file_link, file_link_key, sign, verify
from jobs.queue import store
from jobs.queue.dispatcher import Dispatcher
from jobs.runscope import begin
from tests.helpers.jobs import dispatch, drain
from tests.helpers.net import LoopbackServer, Reply

TG_A = {"channel": "telegram", "actor_key": "1001", "role_id": "r1", "org_id": "o1"}
TG_B = {"channel": "telegram", "actor_key": "1002", "role_id": "r1", "org_id": "o1"}
WEB = {"channel": "web", "session_id": "s-web", "role_id": "r1", "org_id": "o1"}


async def dispatch_web(svc: Any, inp: dict[str, Any]) -> str:
    """A background job of the web session ``s-web`` (an ``orgdeleg:`` session: queued)."""
    res = await Dispatcher(svc).dispatch("ws_tool", inp, WEB, external_id="orgdeleg:s-web")
    assert res.status_code == 202, res.body
    return str(res.body["job_id"])


async def result_of(svc: Any, job_id: str) -> dict[str, Any]:
    job = await store.get_job(svc.sessionmaker, job_id)
    assert job.status == "succeeded", (job.status, job.error)
    return dict(svc.box.unseal(job.result))


def load_handler(name: str) -> Any:
    import importlib.util

    from tests.helpers.settings import ROOT

    spec = importlib.util.spec_from_file_location(
        f"trust_{name}", ROOT / "skills" / name / "handler.py"
    )
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def sent_to(tg: Any, chat: str) -> list[tuple[str, str]]:
    return [
        (m["method"], m.get("filename") or m.get("text", ""))
        for m in tg.sent
        if m["chat_id"] == chat
    ]


# --- per-recipient workspaces, run-scoped backfill ---------------------------------------


def test_recipient_segment_is_one_safe_path_segment() -> None:
    class J:
        role_id, session_id, channel, external_id = "r1", "", "telegram", ""
        actor_key = "../../etc/x\0y"

    seg = job_segment(J)
    assert seg == recipient_segment("telegram", J.actor_key) and "/" not in seg and "\0" not in seg
    assert seg.startswith("telegram-") and job_workspace("/ws", J) == Path("/ws/r1") / seg
    J.actor_key = "1002"
    assert job_segment(J) != seg
    J.session_id = "chat-7"
    assert job_segment(J) == "chat-7"
    J.session_id, J.channel = "", "web"
    assert job_segment(J) == "shared"  # the sync-line rule stays for sessionless web jobs


@pytest.mark.slow
async def test_two_telegram_users_never_get_each_others_file(trust, tg) -> None:
    """User A's report is never backfilled into B's text-only answer, overlapping or not."""
    a = await dispatch(
        trust, "ws_tool", {"write": {"report_51.csv": "a,1\n"}, "sleep_after": 0.6}, TG_A
    )
    b = await dispatch(trust, "ws_tool", {"message": "B text", "sleep_before": 0.2}, TG_B)
    await drain(trust)  # both run at once in one worker
    b2 = await dispatch(trust, "ws_tool", {"message": "B again"}, TG_B)
    await drain(trust)
    assert sent_to(tg, "1001") == [("sendDocument", "report_51.csv")]
    assert sent_to(tg, "1002") == [("sendMessage", "B text"), ("sendMessage", "B again")]
    ws_a, ws_b = [Path((await result_of(trust, j))["workspace"]) for j in (a, b)]
    assert (
        ws_a != ws_b and ws_a.parent == ws_b.parent == trust.settings.resolved_workspace_root / "r1"
    )
    assert (await result_of(trust, b2))["workspace"] == str(ws_b)


@pytest.mark.slow
async def test_one_web_session_three_jobs_each_delivers_its_own_files(trust, tg) -> None:
    await ensure_session(trust.sessionmaker, "s-web", role_id="r1", org_id="o1", channel="web")
    for inp in (
        {"write": {"first.csv": "1\n"}, "message": "one"},
        {"message": "two"},
        {"write": {"third.csv": "3\n"}, "message": "three"},
    ):
        await dispatch_web(trust, inp)
        await drain(trust)
    msgs = await list_messages(trust.sessionmaker, "s-web")
    assert [(m["text"], [a["filename"] for a in m["attachments"]]) for m in msgs] == [
        ("one", ["first.csv"]),
        ("two", []),
        ("three", ["third.csv"]),
    ]


@pytest.mark.slow
async def test_overlapping_runs_of_one_workspace_attribute_new_files_to_neither(trust) -> None:
    await ensure_session(trust.sessionmaker, "s-web", role_id="r1", org_id="o1", channel="web")
    first = await dispatch_web(
        trust, {"sleep_before": 0.3, "write": {"who.csv": "?\n"}, "sleep_after": 0.3}
    )
    second = await dispatch_web(trust, {"message": "text only", "sleep_after": 0.9})
    await drain(trust)
    msgs = await list_messages(trust.sessionmaker, "s-web")
    assert all(m["attachments"] == [] for m in msgs) and len(msgs) == 2
    for job_id, other in ((first, second), (second, first)):
        (warning,) = (await result_of(trust, job_id))["artifact_problems"]
        assert warning["path"] == "who.csv" and warning["field"] == "backfill"
        assert other in warning["reason"] and "another run" in warning["reason"]


@pytest.mark.slow
async def test_symlink_and_declared_paths_outside_are_refused(trust, tg) -> None:
    jobs = []
    for inp in (
        {"symlink": {"passwd.txt": "/etc/passwd"}},
        {"declare": "/etc/passwd"},
        {"declare": "../../x"},
    ):
        jobs.append(await dispatch(trust, "ws_tool", inp, TG_A))
        await drain(trust)
    assert [m["method"] for m in tg.sent] == ["sendMessage"] * 3  # no file went anywhere
    reasons = []
    for job_id in jobs:
        (problem,) = (await result_of(trust, job_id))["artifact_problems"]
        reasons.append(problem["reason"])
    assert reasons[0] == "symlink passwd.txt resolves outside the workspace"
    assert reasons[1] == "/etc/passwd resolves outside the workspace"
    assert reasons[2] == "../../x resolves outside the workspace"


def _markers(ws: Path) -> list[str]:
    """The run markers of ``ws`` (not the spare files kept for the next episode)."""
    from jobs.runscope import RUNS_DIR

    return sorted(n for n in os.listdir(ws / RUNS_DIR) if not n.startswith("s-"))


def test_run_markers_overlap_and_are_forgotten(tmp_path: Path) -> None:
    from jobs.runscope import RUNS_DIR, STALE_NS

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "old.csv").write_text("before")
    a = begin(ws, "job-a")
    (ws / "early.csv").write_text("only a was running")
    time.sleep(0.1)  # (well before b: a rival is taken to start 20 ms early, MTIME_SLACK_NS)
    b = begin(ws, "job-b")
    (ws / "shared.csv").write_text("a or b?")
    changes_a = a.finish()
    assert changes_a.mine == ("early.csv",) and changes_a.ambiguous == {"shared.csv": ("job_b",)}
    changes_b = b.finish()  # a ended meanwhile, but overlapped b's run
    assert changes_b.mine == () and changes_b.ambiguous == {"shared.csv": ("job_a",)}
    assert _markers(ws) == []  # nobody alive needs them any more
    # a dead worker's open marker does not make every later run ambiguous
    dead = time.time_ns() - STALE_NS - 1
    (ws / RUNS_DIR / f"o-{dead}-deadbeef-job_dead").touch()
    c = begin(ws, "job-c")
    (ws / "late.csv").write_text("c")
    assert c.finish().mine == ("late.csv",) and _markers(ws) == []


def test_a_file_whose_coarse_mtime_predates_a_rivals_start_is_nobodys(tmp_path: Path) -> None:
    """File times come from the kernel's coarse clock, a tick behind the clock that dates
    runs: a file written just after b started may carry a time from just before. It must
    not be a's alone (it may be b's)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    a = begin(ws, "job-a")
    time.sleep(0.1)
    before_b = time.time_ns()
    b = begin(ws, "job-b")
    shared = ws / "shared.csv"
    shared.write_text("written by b just after it started")
    os.utime(shared, ns=(before_b - 3_000_000, before_b - 3_000_000))  # a tick behind
    assert a.finish().ambiguous == {"shared.csv": ("job_b",)}
    assert b.finish().ambiguous == {"shared.csv": ("job_a",)}


def test_run_scope_of_a_job_without_a_role(tmp_path: Path) -> None:
    """No workspace for the skill, yet older downloads in its results folder are not this
    run's files."""
    from jobs.context import job_results_dir
    from jobs.runscope import begin_run
    from tests.helpers.settings import make_settings

    class J:
        id, skill, role_id, session_id = "j1", "s", "", ""
        channel, actor_key, external_id = "telegram", "1001", ""

    settings = make_settings(tmp_path, redis_url=None, prefix="p")
    results = job_results_dir(settings.resolved_workspace_root, J)
    results.mkdir(parents=True)
    (results / "old.png").write_bytes(b"x")
    ctx: dict[str, Any] = {}
    scope = begin_run(settings, J, ctx)
    (results / "new.png").write_bytes(b"y")
    assert "workspace_dir" not in ctx and scope.finish().mine == ("new.png",)


@pytest.mark.slow
def test_backfill_caps_files_and_bytes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    scope = begin(ws, "j1")
    for i in range(BACKFILL_MAX_FILES + 5):
        (ws / f"f{i:02d}.csv").write_text(str(i))
    problems: list[dict[str, Any]] = []
    arts = collect({"ok": True}, ws, problems, scope.finish())
    assert len(arts) == BACKFILL_MAX_FILES
    assert [p["path"] for p in problems] == [f"f{i:02d}.csv" for i in range(20, 25)]
    assert {p["reason"] for p in problems} == {CAP_REASON}
    big = tmp_path / "big"
    big.mkdir()
    scope = begin(big, "j2")
    for name in ("a.bin", "b.bin"):
        with open(big / name, "wb") as fh:
            fh.truncate(120 * 1024 * 1024)  # sparse: no 240 MB written
    problems = []
    arts = collect({"ok": True}, big, problems, scope.finish())
    assert [a.filename for a in arts] == ["a.bin"]
    assert problems == [{"path": str(big / "b.bin"), "field": "backfill", "reason": CAP_REASON}]


# --- confined sending ---------------------------------------------------------------------


@pytest.fixture
async def sink() -> Any:
    srv = await LoopbackServer().start()
    srv.routes["/hook"] = Reply(200, b'{"ok": true}', {"content-type": "application/json"})
    yield srv
    await srv.close()


@pytest.mark.slow
async def test_notify_from_a_skill_cannot_mail_out_host_files(trust, sink, monkeypatch) -> None:
    monkeypatch.setenv(
        "SKILLJOBS_NOTIFY_TARGETS", json.dumps({"ops": f"json://127.0.0.1:{sink.port}/hook"})
    )
    monkeypatch.setenv("SKILLJOBS_FETCH_ALLOW_HOSTS", "127.0.0.1")
    key_file = trust.settings.data_dir / "secret.key"
    key_file.write_text(trust.settings.secret_key.get_secret_value())
    bare = f"json://127.0.0.1:{sink.port}/hook"
    attempts = [
        ({"message": "k", "target": "ops"}, "secret_key"),
        ({"message": "h", "target": "ops"}, "hostname"),
        ({"message": "b", "target": bare}, None),
    ]
    ids = [
        await dispatch(trust, "ws_tool", {"notify": n, "notify_attach": a}, TG_A)
        for n, a in attempts
    ]
    await drain(trust)
    assert sink.connections == 0  # nothing reached the sink
    errors = []
    for job_id in ids:
        out = (await result_of(trust, job_id))["notify"]
        out = out["output"] if isinstance(out.get("output"), dict) else out  # call_skill's wrap
        assert out["ok"] is False and not out.get("sent")
        # refused by call_skill's input check already, or by notify's own rule
        errors.append(out["failed"][0]["error"] if "failed" in out else out["error"])
    assert "outside" in errors[0] and "secret.key" in errors[0]
    assert "outside" in errors[1] and "/etc/hostname" in errors[1]
    assert errors[2].startswith("bare Apprise URL refused")
    # notify's own rule, whoever calls it: each target failed with the reason
    handler = load_handler("notify")
    ctx = {"workspace_dir": str(trust.settings.resolved_workspace_root / "r1" / "x")}
    Path(ctx["workspace_dir"]).mkdir(parents=True)
    for attach in ([str(key_file)], ["/etc/hostname"], ["../../../secret.key"]):
        out = await handler.execute({"message": "m", "target": "ops", "attach": attach}, ctx)
        (failed,) = out["failed"]
        assert failed["error"].startswith("attachment refused:"), failed
        assert failed["error"].endswith("resolves outside the workspace")
    out = await handler.execute({"message": "m", "target": "ops", "attach": ["r.txt"]}, {})
    assert out["failed"][0]["error"].startswith("attachments refused: the caller has no workspace")
    assert sink.connections == 0
    # the positive control: the same alias with a workspace file does reach the sink
    ok = await dispatch(
        trust,
        "ws_tool",
        {"write": {"r.txt": "x"}, "notify": {"message": "m", "target": "ops", "attach": ["r.txt"]}},
        TG_A,
    )
    await drain(trust)
    assert (await result_of(trust, ok))["notify"]["ok"] is True and sink.connections >= 1


async def test_host_naming_apprise_urls_pass_the_outbound_policy(tmp_path, sink) -> None:
    from delivery.notify import notify
    from tests.helpers.settings import make_settings

    url = f"json://127.0.0.1:{sink.port}/hook"

    async def public(host: str, port: int) -> list[str]:
        return ["93.184.215.14"]

    async def private(host: str, port: int) -> list[str]:
        return ["10.1.2.3"]

    s = make_settings(
        tmp_path,
        redis_url=None,
        prefix="p",
        notify_targets=json.dumps({"ops": url}),
        notify_allow_urls=f"json://127.0.0.1:{sink.port},jsons://hooks.example.org",
    )
    r = await notify(s, "x", target="ops", workspace=None)
    assert r["failed"][0]["error"] == "refused by the outbound policy: scheme http is not allowed"
    r = await notify(s, "x", target=url, workspace=None)  # allow-listed as a bare URL, still http
    assert r["failed"][0]["error"].startswith("refused by the outbound policy")
    r = await notify(s, "x", target="jsons://hooks.example.org/h", workspace=None, resolver=private)
    assert r["failed"][0]["error"] == "refused by the outbound policy: private address 10.1.2.3"
    from delivery.notify import outbound_refusal

    assert await outbound_refusal("jsons://hooks.example.org/h", [], public) is None
    assert await outbound_refusal("tgram://123456:ABCDEF/1001", []) is None  # fixed endpoint
    assert sink.connections == 0


@pytest.mark.slow
async def test_chat_line_send_message_reaches_only_the_callers_origin(
    trust, tg, monkeypatch, tmp_path
) -> None:
    from delivery.channels.registry import channels_for
    from delivery.send_message import Sender, send_message

    await ensure_session(trust.sessionmaker, "s-other", role_id="r2", org_id="o2", channel="web")
    await ensure_session(trust.sessionmaker, "s-mine", role_id="r1", org_id="o1", channel="web")
    chans = channels_for(trust)
    me = Sender(role_id="r1", org_id="o1", channel="telegram", actor_key="1001", direct=True)
    r = await send_message(
        chans,
        to=["telegram:1001", "telegram:1002"],
        text="hi",
        sender=me,
        sessionmaker=trust.sessionmaker,
    )
    assert r["sent"] == ["telegram:1001"] and r["failed"][0]["target"] == "telegram:1002"
    assert "only your own chat" in r["failed"][0]["error"]
    allowed = replace(me, allow=("telegram:*", "web:s-*"))
    r = await send_message(
        chans,
        to=["telegram:1002", "web:s-other", "web:s-mine"],
        text="hi",
        sender=allowed,
        sessionmaker=trust.sessionmaker,
    )
    assert sorted(r["sent"]) == ["telegram:1002", "web:s-mine"]
    assert r["failed"] == [
        {
            "target": "web:s-other",
            "error": "refused: that chat session belongs to another role or organization",
        }
    ]
    assert [m["chat_id"] for m in tg.sent] == ["1001", "1002"]
    # the skill: the chat line's own call is direct; SKILLJOBS_SEND_ALLOW widens it
    from jobs.execution.executor import Executor

    ex = Executor(
        settings=trust.settings,
        registry=trust.registry,
        sessionmaker=trust.sessionmaker,
        box=trust.box,
    )
    try:
        ctx = {**TG_A, "chat_mode": True}
        out = await ex.run("send_message", {"to": "telegram:1002", "message": "x"}, ctx)
        assert out["ok"] is False and "only your own chat" in out["failed"][0]["error"]
        monkeypatch.setenv("SKILLJOBS_SEND_ALLOW", json.dumps({"r1": ["telegram:1002"]}))
        out = await ex.run("send_message", {"to": "telegram:1002", "message": "y"}, ctx)
        assert out["ok"] is True, out
    finally:
        await ex.aclose()


# --- no credential in any log -------------------------------------------------------------


@pytest.mark.slow
async def test_no_credential_in_the_worker_log(trust, tg) -> None:
    from jobs.catalog.configs import ConfigStore
    from jobs.logs import setup_logging

    role_secret = "sk-role-secret-0f9e8d7c"
    await ConfigStore(trust.sessionmaker, trust.box).set("r1", "ws_tool", "api_key", role_secret)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    out = io.StringIO()
    trust.settings.log_level = "DEBUG"
    setup_logging(trust.settings, stream=out)
    try:
        await dispatch(trust, "ws_tool", {"write": {"r.csv": "1\n"}, "log": "careless:"}, TG_A)
        tg.fail_next(f"/bot{tg.token}/sendDocument", httpx_error_reply())
        await drain(trust)
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
    text = out.getvalue()
    assert "ws_tool" in text and "careless: •••••• bot ••••••" in text  # the skill's own line
    secrets = [tg.token, role_secret, trust.settings.secret_key.get_secret_value()]
    assert [s for s in secrets if s in text] == []
    assert tg.sent and tg.sent[-1]["method"] == "sendDocument"
    assert [s for s in secrets if s in await stored_text(trust)] == []


async def stored_text(svc: Any) -> str:
    """Every row the deployment wrote about jobs and deliveries, as the database returns it."""
    from sqlalchemy import text

    out = []
    async with svc.sessionmaker() as s:
        for table in ("jobs", "job_attempts", "deliveries", "artifacts", "session_messages"):
            for row in (await s.execute(text(f"SELECT * FROM {table}"))).all():
                out.append(json.dumps([str(v) for v in row]))
    return "\n".join(out)


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@pytest.mark.slow
async def test_no_credential_in_a_worker_process_log(trust, tg, tmp_path) -> None:
    """A real ``skilljobs worker`` at DEBUG: its whole log, and every stored row, is free of
    the bot token, the role's secret config and the secret key."""
    import signal
    import subprocess
    import sys

    from jobs.catalog.configs import ConfigStore
    from tests.helpers.settings import ROOT

    role_secret = "sk-role-secret-7a6b5c4d"
    await ConfigStore(trust.sessionmaker, trust.box).set("r1", "ws_tool", "api_key", role_secret)
    job_id = await dispatch(trust, "ws_tool", {"write": {"r.csv": "1\n"}, "log": "careless:"}, TG_A)
    log_path = tmp_path / "worker.log"
    env = {
        k: v for k, v in os.environ.items() if k.startswith("SKILLJOBS_") or k in ("PATH", "HOME")
    }
    env["SKILLJOBS_LOG_LEVEL"] = "DEBUG"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(  # noqa: ASYNC220 (started once; polled below)
            [sys.executable, "-m", "jobs.cli.app", "worker", "--no-scheduler"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(ROOT),
        )
        try:
            deadline = time.monotonic() + 60
            while (await store.get_job(trust.sessionmaker, job_id)).status != "succeeded":
                assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text()
                await asyncio.sleep(0.1)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    text = log_path.read_text()
    assert "ws_tool" in text and "careless: •••••• bot ••••••" in text, text
    secrets = [tg.token, role_secret, trust.settings.secret_key.get_secret_value()]
    assert [s for s in secrets if s in text] == []
    assert [s for s in secrets if s in await stored_text(trust)] == []
    assert [m["method"] for m in tg.sent] == ["sendDocument"]


def httpx_error_reply() -> Any:
    from tests.fakes.server import Response

    return Response(500, {"ok": False, "error_code": 500, "description": "Internal Server Error"})


# --- signed download links ----------------------------------------------------------------


def test_tokens_valid_expired_tampered_and_misused() -> None:
    key = b"k" * 32
    token = sign(key, FILE_KIND, {"p": "/ws/a.csv"}, 60)
    assert verify(key, token, FILE_KIND)["p"] == "/ws/a.csv"
    with pytest.raises(LinkError, match="expired"):
        verify(key, token, FILE_KIND, now=time.time() + 61)
    payload, sig = token.split(".")
    forged = sign(key, FILE_KIND, {"p": "/etc/passwd"}, 60).split(".")[0] + "." + sig
    for bad in (forged, payload + "." + sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB"), "x", ""):
        with pytest.raises(LinkError):
            verify(key, bad, FILE_KIND)
    with pytest.raises(LinkError, match="not for this use"):
        verify(key, sign(key, "session", {"p": "/ws/a.csv"}, 60), FILE_KIND)
    with pytest.raises(LinkError, match="signature"):
        verify(b"other" * 8, token, FILE_KIND)


@pytest.mark.slow
async def test_file_links_of_web_messages(trust) -> None:
    from dashboard.app import create_app

    await ensure_session(trust.sessionmaker, "s-web", role_id="r1", org_id="o1", channel="web")
    for name in ("a.csv", "b.csv"):
        await dispatch_web(trust, {"write": {name: f"{name}\n"}})
        await drain(trust)
    msgs = await list_messages(trust.sessionmaker, "s-web")
    (att_a,), (att_b,) = (m["attachments"] for m in msgs)
    assert att_a["url"].startswith("/files/") and att_a["url"] != att_b["url"]
    key = file_link_key(trust.settings)
    app = create_app(trust.settings, services=trust)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        r = await c.get(att_a["url"])  # no bearer token
        assert r.status_code == 200 and r.content == b"a.csv\n"
        assert "attachment" in r.headers["content-disposition"]
        token = att_a["url"].removeprefix("/files/")
        claims = verify(key, token, FILE_KIND)
        expired = sign(key, FILE_KIND, {k: v for k, v in claims.items() if k not in ("k", "x")}, -5)
        assert (await c.get("/files/" + expired)).status_code == 403
        tampered = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
        assert (await c.get("/files/" + tampered)).status_code == 403
        # a token for b.csv's path but a.csv's job: not that job's artifact
        other = file_link(key, claims["j"], att_b["local_path"], 60)
        assert (await c.get(other)).status_code == 404
        outside = file_link(key, None, "/etc/passwd", 60)
        assert (await c.get(outside)).status_code == 404
        # a path in the readable part is not honoured: the link carries an opaque id
        bare = sign(key, FILE_KIND, {"j": claims["j"], "p": att_a["local_path"]}, 60)
        assert (await c.get("/files/" + bare)).status_code == 403
        assert (await c.get(att_b["url"])).content == b"b.csv\n"


def test_quiet_runs_close_their_marker_and_prune_now_and_then(tmp_path: Path) -> None:
    """A run that changed nothing skips the marker listing; its closed marker still
    counts for runs it overlapped, and every PRUNE_EVERY-th quiet run tidies up."""
    from jobs.runscope import PRUNE_EVERY

    ws = tmp_path / "ws"
    ws.mkdir()
    writer = begin(ws, "job-w")
    quiet = begin(ws, "job-q")
    (ws / "out.csv").write_text("written while both ran")
    assert writer.finish().ambiguous == {"out.csv": ("job_q",)}
    for i in range(PRUNE_EVERY + 1):
        assert begin(ws, f"job-{i}").finish().mine == ()
    quiet.finish()
    assert len(_markers(ws)) <= PRUNE_EVERY + 2
    later = begin(ws, "job-l")
    (ws / "next.csv").write_text("only the later run")
    assert later.finish().mine == ("next.csv",)
