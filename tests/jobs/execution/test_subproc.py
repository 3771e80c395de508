"""Subprocess plumbing: argv rules, environment, process-group lifetime, stdout parsing."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from jobs.execution.subproc import (
    SetupError,
    base_environ,
    build_args,
    build_command,
    build_env,
    parse_stdout,
    run_process,
    subprocess_context,
)
from jobs.skill import ExecType, Skill
from tests.helpers.procs import procs_gone, procs_started, procs_with, unique_sleep


def _skill(tmp_path: Path, **kw: object) -> Skill:
    return Skill(name="s", path=tmp_path, **kw)  # type: ignore[arg-type]


def test_argv_rules(tmp_path: Path) -> None:
    sk = _skill(tmp_path)
    args = build_args(
        sk,
        {
            "dry_run": True,
            "verbose": False,
            "skip": None,
            "tags": ["a", "b"],
            "empty": [],
            "opts": {"k": 1},
            "max_rows": 5,
            "_meta": "hidden",
            "out": "{workspace}/o.txt",
            "cfg": "{baseDir}/c.json",
        },
        workspace="/ws",
        skill_dir="/sk",
    )
    assert args == [
        "--dry-run",
        "--tags",
        "a",
        "b",
        "--opts",
        '{"k": 1}',
        "--max-rows",
        "5",
        "--out",
        "/ws/o.txt",
        "--cfg",
        "/sk/c.json",
    ]


def test_subcommand_first_and_positional(tmp_path: Path) -> None:
    sk = _skill(
        tmp_path,
        cli_commands=["list", "add"],
        input_schema={
            "properties": {"name": {"type": "string", "x-cli-positional": True}, "n": {}}
        },
    )
    assert build_args(sk, {"n": 2, "name": "x", "_subcommand": "add"}) == ["add", "x", "--n", "2"]
    with pytest.raises(SetupError, match="unknown subcommand 'rm'"):
        build_args(sk, {"_subcommand": "rm"})
    with pytest.raises(SetupError, match="needs a subcommand"):
        build_args(sk, {})


def test_missing_runtime_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "main.rb"
    script.write_text("puts 1")
    monkeypatch.setenv("PATH", str(tmp_path))
    sk = _skill(tmp_path, exec_type=ExecType.RUBY, entry=script)
    with pytest.raises(SetupError, match="'ruby' runtime is not installed"):
        build_command(sk, {}, workspace="", skill_dir="")
    sk = _skill(tmp_path, exec_type=ExecType.SHELL, entry=tmp_path / "nope.sh")
    with pytest.raises(SetupError, match="does not exist"):
        build_command(sk, {}, workspace="", skill_dir="")


def test_inline_shell_command(tmp_path: Path) -> None:
    sk = _skill(tmp_path, exec_type=ExecType.INLINE_SHELL, command="echo {baseDir} $1")
    argv = build_command(sk, {"x": 1}, workspace="/ws", skill_dir=str(tmp_path))
    assert argv[1:] == ["-c", f"echo {tmp_path} $1", "s", "--x", "1"]


# --- environment ----------------------------------------------------------------------


def test_subprocess_context_filtering() -> None:
    ctx = {
        "role_id": "r",
        "actor_key": "ou_1",  # vocabulary, even though its name contains "key"
        "_meta": {"x": 1},
        "_llm_conn": {"key": "sk"},
        "db": object(),
        "db_factory": object(),
        "call_skill": print,
        "provider": object(),
        "abort_signal": None,
        "workspace_dir": "/ws",
        "api_token": "mine",
        "other_secret": "leak",
        "blob": object(),
        "nan": float("nan"),
        "skill_configs": {"s": {"api_token": "mine"}, "api_token": "mine", "other": {"pw": 1}},
        "skill_args": {"api_token": "mine"},
    }
    out = subprocess_context(ctx, "s")
    assert out["actor_key"] == "ou_1" and out["api_token"] == "mine"
    for k in ("_meta", "_llm_conn", "db", "db_factory", "call_skill", "provider", "abort_signal"):
        assert k not in out
    assert "other_secret" not in out and "blob" not in out and "nan" not in out
    assert out["skill_configs"] == {"s": {"api_token": "mine"}, "api_token": "mine"}
    json.dumps(out)


def test_env_strips_service_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKILLJOBS_SECRET_KEY", "do-not-leak")
    monkeypatch.setenv("SKILLJOBS_LLM_KEY", "do-not-leak")
    assert not any(k.startswith("SKILLJOBS_") for k in base_environ())
    sk = _skill(tmp_path, exec_type=ExecType.SHELL, requires_env=["XX_API_KEY"])
    ctx = {"skill_configs": {"s": {"XX_API_KEY": "abc", "region": "eu"}}, "skill_args": {}}
    env = build_env(sk, ctx, {"q": 1}, workspace="/ws", llm_env={"OPENAI_API_KEY": "k"})
    assert env["XX_API_KEY"] == "abc" and "region" not in env
    assert env["OPENAI_API_KEY"] == "k"
    assert json.loads(env["SKILL_INPUT"]) == {"q": 1}
    assert env["SKILL_WORKSPACE"] == "/ws" and env["SKILL_DIR"] == str(tmp_path)
    assert "do-not-leak" not in json.dumps(env)


# --- stdout parsing -------------------------------------------------------------------


def test_parse_stdout_order(tmp_path: Path) -> None:
    assert parse_stdout('{"ok": true, "n": 1}\n') == {"ok": True, "n": 1}
    assert parse_stdout("[1, 2]") == [1, 2]
    assert parse_stdout('progress 10%\nprogress 90%\n{"done": 1}\n') == {"done": 1}
    assert parse_stdout("just text\n") == {"output": "just text\n"}
    assert parse_stdout("") == {"output": ""}
    img = tmp_path / "chart.png"
    img.write_bytes(b"\x89PNG")
    r = parse_stdout(f"rendering\n{img}\n", tmp_path)
    assert r["local_path"] == str(img) and r["media"] == "image" and r["filename"] == "chart.png"
    assert r["images"] == [{"filename": "chart.png", "local_path": str(img), "media": "image"}]
    assert r["output"] == "rendering"
    (tmp_path / "clip.mp4").write_bytes(b"x")
    r = parse_stdout("MEDIA: clip.mp4\nMEDIA_URL: https://cdn.example.com/a.mp3\nbye", tmp_path)
    assert r["videos"][0]["local_path"] == str(tmp_path / "clip.mp4")
    assert r["urls"] == ["https://cdn.example.com/a.mp3"] and r["output"] == "bye"
    r = parse_stdout("MEDIA_URL: https://cdn.example.com/a.png\n")
    assert r["urls"] == ["https://cdn.example.com/a.png"] and r["media"] == "image"
    assert parse_stdout("/no/such/file.png\n") == {"output": "/no/such/file.png\n"}


# --- running --------------------------------------------------------------------------


async def test_concurrent_reads_of_large_streams() -> None:
    code = (
        "import sys\n"
        "for _ in range(64): sys.stderr.write('e' * 65536); sys.stdout.write('o' * 65536)\n"
    )
    r = await run_process([sys.executable, "-c", code], env=base_environ(), cwd=None, timeout=30)
    assert r.returncode == 0 and r.overflow is None
    assert len(r.stdout) == len(r.stderr) == 64 * 65536


async def test_output_cap_kills_process() -> None:
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)\n"
    r = await run_process(
        [sys.executable, "-c", code], env=base_environ(), cwd=None, timeout=30, cap=1 << 20
    )
    assert r.overflow == "stdout" and len(r.stdout) == 1 << 20
    assert r.returncode is not None and r.returncode != 0


@pytest.mark.slow
async def test_timeout_kills_whole_group() -> None:
    dur = unique_sleep()
    script = f"sleep {dur} & sleep {dur} & sleep {dur}\n"
    r = await run_process(["bash", "-c", script], env=base_environ(), cwd=None, timeout=0.5)
    assert r.timed_out
    assert await procs_gone(dur) == []


async def test_leftover_children_killed_after_normal_exit() -> None:
    dur = unique_sleep()
    script = f"sleep {dur} &\necho '{{\"ok\": true}}'\n"
    r = await run_process(["bash", "-c", script], env=base_environ(), cwd=None, timeout=20)
    assert not r.timed_out and r.returncode == 0
    assert json.loads(r.stdout) == {"ok": True}
    assert await procs_gone(dur) == []


async def test_cancel_kills_group_and_reraises() -> None:
    dur = unique_sleep()
    task = asyncio.ensure_future(
        run_process(
            ["bash", "-c", f"sleep {dur} & sleep {dur}"], env=base_environ(), cwd=None, timeout=60
        )
    )
    await procs_started(dur, 2)
    assert len(procs_with(dur)) >= 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await procs_gone(dur) == []


def test_positional_from_subcommand_schema(tmp_path: Path) -> None:
    sk = _skill(tmp_path, cli_commands=["get"])
    sk.cli_command_schemas = {"get": {"properties": {"id": {"x-cli-positional": True}}}}
    assert build_args(sk, {"_subcommand": "get", "id": 7, "v": True}) == ["get", "7", "--v"]


@pytest.mark.slow
async def test_output_before_a_timeout_is_kept() -> None:
    script = "echo early-err >&2; echo early-out; sleep 30"
    r = await run_process(["bash", "-c", script], env=base_environ(), cwd=None, timeout=1.5)
    assert r.timed_out
    assert r.stderr == b"early-err\n" and r.stdout == b"early-out\n"
