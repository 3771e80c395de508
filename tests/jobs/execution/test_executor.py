"""The shared executor against real skill folders (tests/exec_fixtures)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry, load_skill
from jobs.context import background_context
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.execution.executor import Executor, Outcome
from jobs.skill import Skill, SkillType
from tests.helpers.procs import procs_gone, procs_started, procs_with, unique_sleep
from tests.helpers.settings import EXEC_FIXTURES, make_settings

FIXTURES = EXEC_FIXTURES
KEY = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
CTX = {"role_id": "r1", "session_id": "s1", "org_id": "o1", "channel": "web"}


@pytest.fixture(scope="module")
def registry():  # type: ignore[no-untyped-def]
    reg = load_registry([FIXTURES])
    assert not reg.errors(), reg.errors()
    return reg


def build(tmp_path: Path, sqlite_url: str, registry, **settings_kw):  # type: ignore[no-untyped-def]
    # the fixture skills are the operator's own (trusted): their in-process handlers run
    # inside the worker, the path these tests are about (test_sandbox_inprocess.py runs
    # the same handlers from an untrusted path)
    settings_kw.setdefault("trusted_skills", str(FIXTURES))
    settings = make_settings(tmp_path, redis_url=None, prefix="t", **settings_kw)
    engine = create_engine(sqlite_url)
    ex = Executor(
        settings=settings,
        registry=registry,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(KEY),
    )
    return ex, engine


@pytest.fixture
async def ex(tmp_path: Path, sqlite_url: str, registry):  # type: ignore[no-untyped-def]
    # the loopback fake APIs of the HTTP-skill tests are allow-listed by the outbound policy
    executor, engine = build(tmp_path, sqlite_url, registry, fetch_allow_hosts="127.0.0.1")
    yield executor
    await executor.aclose()
    await engine.dispose()


# --- in-process Python ----------------------------------------------------------------


async def test_noop_outcome(ex: Executor) -> None:
    out = await ex.execute("noop", {}, dict(CTX))
    assert isinstance(out, Outcome)
    assert out.status == "succeeded" and out.result == {"ok": True}
    assert out.error is None and out.exception is None and not out.transient
    assert out.duration_ms >= 0
    assert await ex.run("noop", {}, dict(CTX)) == {"ok": True}


async def test_runtime_context_additions(ex: Executor, tmp_path: Path) -> None:
    ctx = dict(CTX, _meta={"x": 1})
    out = await ex.execute("echo_ctx", {"a": 1}, ctx)
    r = out.result
    assert r["input"] == {"a": 1}
    ws = Path(r["ctx"]["workspace_dir"])
    assert ws == ex.workspace_root / "r1" / "s1" and r["workspace_exists"]
    assert r["live"] == {
        "db": "LazySession",
        "db_factory": "async_sessionmaker",
        "provider": "NoneType",
        "call_skill": "function",
    }
    assert r["call_depth"] == 0
    assert ctx == dict(CTX, _meta={"x": 1})  # the caller's dict is not changed


async def test_workspace_setdefault_and_roleless(ex: Executor, tmp_path: Path) -> None:
    mine = tmp_path / "my-ws"
    r = (await ex.execute("echo_ctx", {}, dict(CTX, workspace_dir=str(mine)))).result
    assert r["ctx"]["workspace_dir"] == str(mine) and mine.is_dir()
    r = (await ex.execute("echo_ctx", {}, {"session_id": "s"})).result
    assert "workspace_dir" not in r["ctx"]
    r = (await ex.execute("echo_ctx", {}, {"role_id": "r2"})).result
    assert r["ctx"]["workspace_dir"].endswith(os.path.join("r2", "shared"))


async def test_background_context_runs_from_json(ex: Executor) -> None:
    bg = background_context(
        dict(CTX, actor_key="ou_1", team_role="owner"), skill="echo_ctx", configs={"style": "brief"}
    )
    stored = json.loads(json.dumps(bg))  # what the job row gives back
    r = (await ex.execute("echo_ctx", {}, stored)).result
    assert r["ctx"]["style"] == "brief" and r["ctx"]["chat_mode"] is True
    assert r["live"]["db"] == "LazySession" and r["live"]["call_skill"] == "function"
    assert "team_role" not in r["ctx"]


async def test_lazy_session_is_usable_and_closed(
    tmp_path: Path,
    sqlite_url: str,
    registry,  # type: ignore[no-untyped-def]
) -> None:
    ex, engine = build(tmp_path, sqlite_url, registry)
    try:
        out = await ex.execute("db_user", {}, dict(CTX))
        assert out.result == {"ok": True, "one": 1, "two": 2, "db": "LazySession"}
        assert engine.pool.checkedout() == 0  # the lazy session was closed after the run
    finally:
        await engine.dispose()


async def test_sync_entry_runs_in_thread_without_db(ex: Executor) -> None:
    r = (await ex.execute("sync_probe", {"x": 1}, dict(CTX))).result
    assert r == {
        "db_is_none": True,
        "has_call_skill": False,
        "in_main_thread": False,
        "got": {"x": 1},
        "ok": True,
    }


async def test_binding_by_positional_count(ex: Executor) -> None:
    assert (await ex.run("zero_args", {}, {})) == {"result": "plain text", "ok": True}
    assert (await ex.run("one_arg", {"n": 5}, {})) == {"result": [5, 2], "ok": True}


@pytest.mark.parametrize(
    ("kind", "exc", "transient"),
    [
        ("value", "ValueError", False),
        ("conn", "ConnectionError", True),
        ("oserror", "OSError", True),
        ("timeout", "TimeoutError", True),
        ("sqlalchemy", "OperationalError", True),
        ("cancel_self", "CancelledError", False),
        ("exit", "KeyboardInterrupt", False),
    ],
)
async def test_entry_raises(ex: Executor, kind: str, exc: str, transient: bool) -> None:
    out = await ex.execute("raiser", {"kind": kind}, dict(CTX))
    assert out.status == "failed" and out.exception == exc and out.transient is transient
    assert out.result["ok"] is False and exc in out.result["error"]
    assert (out.result.get("error_type") == "transient") is transient
    if kind == "value":
        assert out.error == "skill 'raiser' raised ValueError: boom: bad row 7"


async def test_hang_times_out(ex: Executor) -> None:
    t0 = time.monotonic()
    out = await ex.execute("hang", {}, dict(CTX), policy_wall_sec=0.3)
    assert out.status == "timed_out" and out.error == "skill ran over 0.3 s and was stopped"
    assert out.result["ok"] is False and not out.transient
    assert time.monotonic() - t0 < 20  # stopped, not waited out (the skill sleeps 1 h)


@pytest.mark.slow
async def test_skill_ignoring_cancellation_is_abandoned(ex: Executor) -> None:
    out = await ex.execute("stubborn", {}, dict(CTX), policy_wall_sec=0.2)
    assert out.status == "timed_out"


async def test_sync_hang_times_out(ex: Executor) -> None:
    out = await ex.execute("sync_hang", {"sleep": 5}, dict(CTX), policy_wall_sec=0.3)
    assert out.status == "timed_out" and "0.3 s" in (out.error or "")


async def test_declared_wall_beats_policy(ex: Executor) -> None:
    t0 = time.monotonic()
    out = await ex.execute("declared_wall", {}, dict(CTX), policy_wall_sec=20)
    assert out.status == "timed_out" and out.error == "skill ran over 0.3 s and was stopped"
    assert time.monotonic() - t0 < 20  # stopped, not waited out (the script sleeps 30 s)


async def test_garbage_results(ex: Executor) -> None:
    out = await ex.execute("garbage", {}, dict(CTX))
    assert out.status == "failed" and "Thing" in (out.error or "")
    r = await ex.run("garbage", {"kind": "nan"}, dict(CTX))
    assert r["ok"] is True and r["when"] == "2026-01-02" and isinstance(r["value"], str)
    out = await ex.execute("garbage", {"kind": "fake_success"}, dict(CTX))
    assert out.status == "failed" and out.error == "no rows matched"
    r = await ex.run("garbage", {"kind": "huge"}, dict(CTX))
    assert r["ok"] is True and len(r["rows"]) == 20000  # offload is the caller's step


async def test_import_error(ex: Executor) -> None:
    out = await ex.execute("import_error", {}, dict(CTX))
    assert out.status == "failed" and out.error_type == "config"
    assert "cannot be imported: RuntimeError: config file missing at import time" in (
        out.error or ""
    )


async def test_module_cache_follows_file_changes(ex: Executor, tmp_path: Path) -> None:
    folder = tmp_path / "skills" / "changing"
    shutil.copytree(FIXTURES / "noop", folder)
    (folder / "SKILL.md").write_text("---\nname: changing\ndescription: x\n---\n")
    skill = load_skill(folder)
    ex.entries.recheck_sec = 0.0  # look at the file on every run
    assert (await ex.run(skill, {}, {})) == {"ok": True}
    handler = folder / "handler.py"
    handler.write_text("async def execute(input_data, runtime_context):\n    return {'v': 2}\n")
    os.utime(handler, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert (await ex.run(skill, {}, {})) == {"v": 2, "ok": True}


async def test_system_exit_entry_runs_as_cli(ex: Executor) -> None:
    r = await ex.run("exits_cli", {"q": "x"}, dict(CTX))
    assert r == {"ok": True, "ran_as": "cli", "input": {"q": "x"}}


async def test_refusals(ex: Executor, tmp_path: Path) -> None:
    out = await ex.execute("no_such_skill", {}, {})
    assert out.status == "failed" and "unknown skill 'no_such_skill'" in (out.error or "")
    broken = Skill(name="broken", path=tmp_path, error="SKILL.md is missing")
    out = await ex.execute(broken, {}, {})
    assert out.error == "skill 'broken' failed to load: SKILL.md is missing"
    doc = Skill(name="doc", path=tmp_path, skill_type=SkillType.SKILL_MD)
    assert "document" in ((await ex.execute(doc, {}, {})).error or "")
    out = await ex.execute("noop", ["not", "a", "dict"], {})  # type: ignore[arg-type]
    assert out.status == "failed" and "JSON object" in (out.error or "")


async def test_requires_env(ex: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SJT_EXEC_TOKEN", raising=False)
    out = await ex.execute("needs_env", {}, dict(CTX))
    assert out.status == "failed"
    assert out.result["error_type"] == "config" and out.result["needs_config"] == ["SJT_EXEC_TOKEN"]
    assert out.log == ""  # never started
    ctx = dict(CTX, skill_configs={"needs_env": {"SJT_EXEC_TOKEN": "abcd"}})
    assert (await ex.run("needs_env", {}, ctx))["token_len"] == 4
    # the worker's environment is never a skill's configuration
    monkeypatch.setenv("SJT_EXEC_TOKEN", "abcdefg")
    out = await ex.execute("needs_env", {}, dict(CTX))
    assert out.result["needs_config"] == ["SJT_EXEC_TOKEN"]


async def test_requires_bins(ex: Executor) -> None:
    out = await ex.execute("needs_bin", {}, {})
    assert out.status == "failed" and out.result["needs_bins"] == ["sjt-no-such-binary-xyz"]
    assert (await ex.run("needs_bin_container", {}, {}))["ran"] is True


# --- subprocesses -----------------------------------------------------------------------


async def test_python_cli_protocol(ex: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKILLJOBS_SECRET_KEY", "never-in-a-skill")
    ctx = dict(
        CTX,
        _meta={"internal": True},
        actor_key="ou_9",
        other_token="not-this-skill",
        skill_configs={"cli_py": {"api_token": "t-1"}},
        skill_args={"api_token": "t-1"},
        api_token="t-1",
    )
    out = await ex.execute(
        "cli_py",
        {"_subcommand": "sum", "values": [1, 2, 3], "dry_run": True, "label": "a b", "skip": False},
        ctx,
    )
    assert out.status == "succeeded", out.error
    r = out.result
    assert r["argv"] == ["sum", "--values", "1", "2", "3", "--dry-run", "--label", "a b"]
    assert r["total"] == 6 and r["dry_run"] is True and r["label"] == "a b"
    for k in ("db", "db_factory", "call_skill", "provider", "abort_signal", "_meta", "other_token"):
        assert k not in r["ctx_keys"], k
    # the skill sees its own config; echoed back, a credential is masked in the result
    assert r["ctx"]["actor_key"] == "ou_9" and "api_token" in r["ctx_keys"]
    assert r["ctx"]["api_token"] == "••••••"
    assert r["ctx"]["workspace_dir"] == r["workspace"] == r["cwd"]
    assert r["skill_dir"] == str(FIXTURES / "cli_py")
    assert r["input"]["_subcommand"] == "sum"
    assert r["env"] == {}  # no LLM configured, no service settings leaked
    assert "working..." in out.log


async def test_unknown_subcommand(ex: Executor) -> None:
    out = await ex.execute("cli_py", {"_subcommand": "rm"}, dict(CTX))
    assert out.status == "failed" and "unknown subcommand 'rm'" in (out.error or "")


async def test_shell_inline_node(ex: Executor) -> None:
    out = await ex.execute("shell_echo", {"name": "x", "n": 2}, dict(CTX))
    assert out.result == {"ok": True, "args": "--name x --n 2", "input": {"name": "x", "n": 2}}
    assert out.log.strip() == "log line"
    r = await ex.run("inline_echo", {"a": 1}, dict(CTX))
    assert r == {"dir": str(FIXTURES / "inline_echo"), "arg": "--a 1", "ok": True}
    if shutil.which("node"):
        r = await ex.run("node_echo", {"n": 21}, dict(CTX))
        assert r == {"ok": True, "doubled": 42, "role": "r1", "argv": ["--n", "21"]}


async def test_missing_runtime(ex: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("ruby"):
        monkeypatch.setenv("PATH", "/nonexistent")
    out = await ex.execute("ruby_echo", {}, dict(CTX))
    assert out.status == "failed" and "'ruby' runtime is not installed" in (out.error or "")


@pytest.mark.slow
async def test_subprocess_timeout_kills_every_child(ex: Executor) -> None:
    dur = unique_sleep()
    out = await ex.execute("spawner", {"dur": dur}, dict(CTX), policy_wall_sec=1)
    assert out.status == "timed_out" and out.error == "skill ran over 1 s and was stopped"
    assert await procs_gone(dur) == []


@pytest.mark.slow
async def test_children_left_after_exit_are_killed(ex: Executor) -> None:
    dur = unique_sleep()
    out = await ex.execute("spawn_and_exit", {"dur": dur}, dict(CTX))
    assert out.status == "succeeded" and out.result["left"] == "a child behind"
    assert await procs_gone(dur) == []


async def test_cancel_subprocess_kills_group(ex: Executor) -> None:
    dur = unique_sleep()
    task = asyncio.create_task(ex.execute("spawner", {"dur": dur}, dict(CTX)))
    await procs_started(dur, 3)
    assert procs_with(dur)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await procs_gone(dur) == []


async def test_cancel_in_process_stops_skill(ex: Executor) -> None:
    task = asyncio.create_task(ex.execute("hang", {}, dict(CTX)))
    deadline = time.monotonic() + 10  # loading the skill may take a while on a loaded host
    while True:
        running = [t for t in asyncio.all_tasks() if "_contained" in repr(t.get_coro())]
        if running or task.done() or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert len(running) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert running[0].done() and running[0].cancelled()


@pytest.mark.slow
async def test_output_flood(ex: Executor) -> None:
    out = await ex.execute("flood", {}, dict(CTX))
    assert out.status == "failed"
    assert out.error is not None and "printed more than 16 MB on stdout" in out.error


async def test_nonzero_exit(ex: Executor) -> None:
    out = await ex.execute("exit_code", {}, dict(CTX))
    assert out.status == "failed" and out.result["exit_code"] == 3
    assert out.error == "skill 'exit_code' exited with code 3: Traceback: the database said no"
    assert "Traceback" in out.log


async def test_non_utf8_output(ex: Executor) -> None:
    r = await ex.run("nonutf8", {}, dict(CTX))
    assert r["output"].startswith("caf\ufffd \ufffd\ufffd done")


async def test_media_lines(ex: Executor) -> None:
    r = await ex.run("media_line", {}, dict(CTX))
    assert r["media"] == "image" and r["filename"] == "chart.png"
    assert Path(r["local_path"]).read_bytes() == b"PNGDATA"
    assert r["urls"] == ["https://cdn.example.com/clip.mp4"] and r["output"] == "chart ready"


async def test_llm_env_for_subprocess(tmp_path: Path, sqlite_url: str, registry) -> None:  # type: ignore[no-untyped-def]
    ex, engine = build(
        tmp_path,
        sqlite_url,
        registry,
        llm_provider="openai",
        llm_base="http://127.0.0.1:9/",
        llm_key="sk-abc",
        llm_model="m1",
    )
    try:
        r = await ex.run("cli_py", {"_subcommand": "show"}, dict(CTX))
        assert r["env"] == {
            "OPENAI_API_KEY": "••••••",  # the key reached the skill; echoing it back is masked
            "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
            "MYINC_LLM_KEY": "••••••",
            "MYINC_LLM_BASE": "http://127.0.0.1:9/v1",
            "MYINC_LLM_MODEL": "m1",
        }
        assert "provider" not in r["ctx_keys"]
    finally:
        await ex.aclose()
        await engine.dispose()


# --- HTTP skills ------------------------------------------------------------------------


async def test_http_skill(ex: Executor) -> None:
    from tests.exec_fixtures.fake_api import FakeAPI, Running

    async with Running(FakeAPI()) as api:
        ctx = dict(CTX, skill_configs={"http_get": {"api_token": api.key, "base": api.url}})
        r = await ex.run("http_get", {"item_id": "a b?x", "lang": "en"}, ctx)
        assert r == {"id": "a b?x", "query": {"lang": "en"}, "ok": True}  # quoted in the path
        bad = dict(CTX, skill_configs={"http_get": {"api_token": "wrong", "base": api.url}})
        out = await ex.execute("http_get", {"item_id": "1"}, bad)
        assert (
            out.status == "failed"
            and out.error_type == "config"
            and "HTTP 401" in (out.error or "")
        )
        assert "wrong" not in (out.error or "")
        out = await ex.execute("http_get", {"item_id": "1"}, {})
        assert out.status == "failed" and "{base}" in (out.error or "")
        post = {"skill_configs": {"http_post": {"base": api.url}}}
        r = await ex.run("http_post", {"name": "Ann", "tags": ["a", "b"]}, post)
        assert r["received"] == {"name": "Ann", "tags": ["a", "b"], "note": "hello Ann"}


async def test_concurrent_runs_share_nothing(ex: Executor) -> None:
    outs = await asyncio.gather(
        *(ex.execute("echo_ctx", {"i": i}, dict(CTX, session_id=f"s{i}")) for i in range(20))
    )
    assert [o.result["input"]["i"] for o in outs] == list(range(20))
    assert len({o.result["ctx"]["workspace_dir"] for o in outs}) == 20


def test_unique_marker_helper() -> None:
    assert unique_sleep() != unique_sleep() and uuid.uuid4()


async def test_modules_are_registered_while_they_load(ex: Executor) -> None:
    r = await ex.run("typed", {}, {})
    assert r == {"ok": True, "hints": ["count", "name"], "row": {"name": "a", "count": 0}}


@pytest.mark.slow
async def test_timed_out_subprocess_keeps_its_log(ex: Executor) -> None:
    out = await ex.execute("slow_logger", {}, dict(CTX), policy_wall_sec=2)
    assert out.status == "timed_out" and "started the long part" in out.log


async def test_executor_never_raises_on_odd_context(ex: Executor, tmp_path: Path) -> None:
    out = await ex.execute("noop", {}, {"role_id": {"not": "a string"}, "session_id": 5})
    assert out.status == "succeeded"
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    ex.workspace_root = blocker  # workspaces cannot be created under a file
    out = await ex.execute("noop", {}, {"role_id": "r-new"})
    assert out.status == "failed" and "could not be run" in (out.error or "")
    assert out.exception in ("NotADirectoryError", "FileExistsError")


def test_subprocess_timeout_rule(tmp_path: Path) -> None:
    assert Executor.subprocess_timeout(Skill(name="a", path=tmp_path), 600) == 60
    assert Executor.subprocess_timeout(Skill(name="a", path=tmp_path, wall_sec=300), 300) == 300
    assert Executor.subprocess_timeout(Skill(name="a", path=tmp_path, is_async=True), 900) == 900


@pytest.mark.slow
async def test_http_skill_media_and_server_errors(ex: Executor, tmp_path: Path) -> None:
    from tests.exec_fixtures.fake_api import PNG, FakeAPI, Running

    folder = tmp_path / "skills" / "http_media"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: http_media\ndescription: x\n---\n")
    async with Running(FakeAPI()) as api:
        (folder / "api.toml").write_text(f'url = "{api.url}/{{what}}"\n')
        skill = load_skill(folder)
        assert skill.error is None, skill.error
        r = await ex.run(skill, {"what": "chart.png"}, dict(CTX))
        assert r["media"] == "image" and r["filename"].endswith(".png")
        assert Path(r["local_path"]).parent == ex.workspace_root / "r1" / "s1"
        assert Path(r["local_path"]).read_bytes() == PNG
        out = await ex.execute(skill, {"what": "status/503"}, dict(CTX))
        assert out.status == "failed" and out.error_type == "transient"
        assert out.error == f"GET {api.url}/status%2F503 answered HTTP 503: nope: 503"


@pytest.mark.slow
async def test_known_secrets_never_come_back(
    ex: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    token = 'lk-"quoted\\' + uuid.uuid4().hex  # characters JSON escapes
    ctx = dict(CTX, skill_configs={"leaky": {"LEAKY_API_KEY": token}})
    out = await ex.execute("leaky", {}, ctx)
    assert out.status == "succeeded" and out.result["len"] == len(token)
    assert out.result["token"] == "••••••" and out.result["note"] == "used ••••••"
    assert token not in out.log and "Bearer ••••••" in out.log
    out = await ex.execute("leaky", {"fail": True}, ctx)
    assert out.status == "failed" and "auth failed for ••••••" in (out.error or "")
    assert token not in json.dumps(out.result) and token not in out.log
    assert token not in caplog.text


@pytest.mark.slow
async def test_file_params_resolved_into_workspace(ex: Executor) -> None:
    r = await ex.run("shell_echo", {"output": "dir/report.txt", "title": "x.txt"}, dict(CTX))
    ws = ex.workspace_root / "r1" / "s1"
    assert r["args"] == f"--output {ws / 'report.txt'} --title x.txt"
    assert r["input"]["output"] == str(ws / "report.txt")


async def test_relative_skill_folder(
    ex: Executor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(FIXTURES / "shell_echo", tmp_path / "rel" / "shell_echo")
    monkeypatch.chdir(tmp_path)
    skill = load_skill(Path("rel/shell_echo"))
    assert skill.error is None
    r = await ex.run(skill, {"a": 1}, dict(CTX))  # runs with cwd = the workspace
    assert r["ok"] is True and r["args"] == "--a 1"


async def test_input_too_large_for_a_subprocess(ex: Executor) -> None:
    out = await ex.execute("shell_echo", {"text": "x" * 200_000}, dict(CTX))
    assert out.status == "failed" and out.error_type == "config"
    assert "too large to hand to a subprocess" in (out.error or "")


async def test_handler_touching_the_loop_at_import(ex: Executor) -> None:
    assert (await ex.run("old_style", {}, {})) == {"ok": True, "same_loop": True}


async def test_go_skill_with_a_built_binary(ex: Executor, tmp_path: Path) -> None:
    folder = tmp_path / "skills" / "go_tool"
    (folder / "bin").mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: go_tool\ndescription: x\nexec:\n  primary: {type: go, entry: bin/tool}\n---\n"
    )
    tool = folder / "bin" / "tool"  # stands in for a compiled Go program
    tool.write_text('#!/bin/sh\necho "{\\"ok\\": true, \\"argv\\": \\"$*\\"}"\n')
    tool.chmod(0o755)
    skill = load_skill(folder)
    assert skill.error is None, skill.error
    assert (await ex.run(skill, {"n": 1}, dict(CTX))) == {"ok": True, "argv": "--n 1"}
    (folder / "bin" / "main.go").write_text("package main\nfunc main() {}\n")
    src = load_skill(folder)
    src.entry = folder / "bin" / "main.go"
    if not shutil.which("go"):
        out = await ex.execute(src, {}, dict(CTX))
        assert out.status == "failed" and "'go' runtime is not installed" in (out.error or "")


async def test_json_context_cannot_fake_live_objects(ex: Executor) -> None:
    ctx = dict(CTX, db="x", db_factory="y", provider={"complete": 1}, call_skill="z")
    r = (await ex.execute("echo_ctx", {}, ctx)).result
    assert r["live"] == {
        "db": "LazySession",
        "db_factory": "async_sessionmaker",
        "provider": "NoneType",
        "call_skill": "function",
    }
