"""The sync line and dispatch details with the realistic corpus (``tests/real_skills``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delivery.render import failure_text
from jobs.catalog.loader import load_registry
from jobs.cli.skills import try_it
from jobs.execution.executor import Executor
from jobs.queue.dispatcher import Dispatcher
from tests.helpers.real import REAL_SKILLS, background, job_json, tg_ctx, web_ctx
from tests.helpers.settings import EXEC_FIXTURES, make_settings


@pytest.mark.slow
async def test_a_large_sync_result_is_offloaded_like_a_background_one(real_services) -> None:
    res = await Dispatcher(real_services).dispatch("log_export", {}, web_ctx("s-big"))
    assert res.status_code == 200
    receipt = res.body
    assert receipt["offloaded"] is True and receipt["chars"] > 100_000
    assert receipt["lines_count"] == 2000 and len(receipt["lines_sample"]) == 3
    # result fields are data, not secrets by name (C12)
    assert receipt["schema_keys"] == ["message", "lines", "keywords", "schema_keys", "ok"]
    assert receipt["keywords_count"] == 2 and receipt["keywords_sample"] == ["served", "INFO"]
    full = json.loads(Path(receipt["path"]).read_text())
    assert len(full["lines"]) == 2000 and full["message"] == "Exported 2000 log lines."
    ws = real_services.settings.resolved_workspace_root / "r1" / "s-big"
    assert Path(receipt["path"]).parent == ws / ".toolout"


@pytest.mark.slow
async def test_a_bare_string_schema_property_is_corrected_at_run_time(real_services) -> None:
    d = Dispatcher(real_services)
    ok = await d.dispatch("quote_lookup", {"symbol": "AAPL"}, web_ctx("s-q"))
    assert ok.status_code == 200 and ok.body["message"] == "AAPL: 187.20 USD"
    missing = await d.dispatch("quote_lookup", {}, web_ctx("s-q"))
    assert missing.status_code == 422 and missing.body["need_param"] == ["symbol"]
    wrong = await d.dispatch("quote_lookup", {"symbol": 7}, web_ctx("s-q"))
    assert wrong.status_code == 422 and wrong.body["need_param"] == ["symbol"]


@pytest.mark.slow
async def test_without_a_workspace_a_script_runs_in_a_temporary_folder(real_services) -> None:
    before = set((REAL_SKILLS / "sysinfo_report").iterdir())
    ctx = {"channel": "web", "session_id": "s-none"}  # no role: no workspace
    res = await Dispatcher(real_services).dispatch("sysinfo_report", {"verbose": True}, ctx)
    assert res.status_code == 200, res.body
    out = res.body["output"]
    assert "argv: --verbose" in out and "cwd is the skill folder: False" in out
    assert set((REAL_SKILLS / "sysinfo_report").iterdir()) == before  # nothing written there


@pytest.mark.slow
async def test_stdout_reason_is_the_tail_and_the_chat_gets_the_meaningful_line(tmp_path) -> None:
    settings = make_settings(tmp_path, redis_url=None, prefix="t")
    ex = Executor(
        settings=settings, registry=load_registry([EXEC_FIXTURES]), sessionmaker=None, box=None
    )
    out = await ex.execute("stdout_fail", {}, {"role_id": "r1"})
    env = out.result
    assert out.status == "failed" and env["exit_code"] == 1
    # the reason is the last meaningful block (C26), not 30 lines of progress; the operator
    # keeps the whole tail
    assert env["error"] == (
        "skill 'stdout_fail' exited with code 1: "
        "ERROR: quota exceeded for project demo, please contact an administrator"
    )
    assert "progress line 0\n" in env["stdout_tail"] and "progress line 29" in env["stdout_tail"]
    assert failure_text("stdout_fail", env) == (
        "Sorry, stdout_fail could not finish: ERROR: quota exceeded for project demo."
    )
    assert failure_text("stdout_fail", env, "zh") == (
        "抱歉，stdout_fail 未能完成：ERROR: quota exceeded for project demo。"
    )
    await ex.aclose()


def test_admin_hints_are_stripped_in_both_languages() -> None:
    for reason, want in (
        ("额度不足，请联系管理员", "额度不足"),
        ("内部错误，请联系管理员处理", ""),
        ("token expired. Please contact your administrator.", "token expired"),
    ):
        text = failure_text("s", {"ok": False, "error": reason})
        assert "管理员" not in text and "administrator" not in text and "内部错误" not in text
        if want:
            assert want in text


@pytest.mark.slow
async def test_unloadable_skill_refusal_is_config_and_not_retriable(real_services, tmp_path):
    from jobs.skill import Skill

    real_services.registry.add(Skill(name="broken", path=tmp_path, error="syntax error"))
    res = await Dispatcher(real_services).dispatch("broken", {}, tg_ctx("2001"))
    assert res.status_code == 409
    assert res.body["error_type"] == "config" and res.body["non_retriable"] is True


@pytest.mark.slow
async def test_a_background_job_record_keeps_result_keys_readable(real_services, tg) -> None:
    ids, _ = await background(real_services, [("model_costs", {}, tg_ctx("2002"))])
    job = await job_json(real_services, ids[0])
    assert job["result"]["schema_keys"] == ["model", "calls", "usd"]
    assert job["partial"] is False


def test_up_advertises_a_skill_that_is_loaded() -> None:
    lines = try_it(load_registry([REAL_SKILLS]), "skilljobs", "curl -s http://x")
    text = "\n".join(lines)
    assert "sales_report" not in text
    name = text.split("dispatch ", 1)[1].split()[0]
    assert load_registry([REAL_SKILLS]).get(name).runnable
    assert "--external-id orgdeleg:demo" in text  # an async skill: shown on the background line


def test_chain_outcomes_are_rendered_and_spoken_in_both_languages() -> None:
    from chains.deliver import outcome_text

    final = {"ok": True, "total_usd": 33.0, "models": [{"model": "gpt-4o"}]}
    assert outcome_text("costs", "succeeded", final, None) == (
        "total_usd: 33.0\nmodels (1):\n\nmodel\n------\ngpt-4o"
    )
    final["models"] = [{"model": f"m{i}"} for i in range(25)]
    assert outcome_text("costs", "succeeded", final, None, "zh").endswith("……另有 5 项")
    assert outcome_text("daily", "failed", None, "step fetch: boom\ntrace", "zh") == (
        "daily 未完成：step fetch: boom"
    )
    assert outcome_text("daily", "stopped_empty", None, None) == (
        "daily: nothing to report this time — a step returned no data."
    )
    assert "本次没有可报告的内容" in outcome_text("daily", "stopped_empty", None, None, "zh")


async def test_secret_values_never_reach_the_stream_tails(tmp_path) -> None:
    settings = make_settings(tmp_path, redis_url=None, prefix="t")
    ex = Executor(
        settings=settings, registry=load_registry([EXEC_FIXTURES]), sessionmaker=None, box=None
    )
    secret = "sk-live-0123456789abcdef"
    ctx = {"role_id": "r1", "skill_configs": {"leaky": {"LEAKY_API_KEY": secret}}}
    out = await ex.execute("leaky", {"fail": True}, ctx)
    env = out.result
    assert out.status == "failed" and env["exit_code"] == 1
    blob = json.dumps(env) + out.log + (out.error or "")
    assert secret not in blob and "auth failed for ••••••" in env["stderr_tail"]
    await ex.aclose()


def test_outbound_directives_are_never_sent_as_text() -> None:
    from delivery.render import render

    result = {
        "message": 'Done [[reply_to_current]]\n[embed ref="cv_1" title="Status" /]\n[[audio_as_voice]]'
    }
    assert render(result) == "Done"
    assert render(result, rich=True) == 'Done\n[embed ref="cv_1" title="Status" /]'
    assert render({"message": "a [view id=1]old[/view] b"}, rich=True) == "a  b"


def test_skills_list_shows_how_each_real_skill_runs(monkeypatch) -> None:
    from typer.testing import CliRunner

    from jobs.cli.app import app

    monkeypatch.setenv("SKILLJOBS_SKILLS_PATH", str(REAL_SKILLS))
    res = CliRunner().invoke(app, ["skills", "list", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.output)["items"]}
    assert rows["sysinfo_report"]["exec_type"] == "python_cli"
    assert rows["sysinfo_report"]["cli_reason"] == "reads sys.argv"
    assert rows["flashcards"]["cli_reason"] == "argparse + __main__"
    assert (
        rows["model_costs"]["exec_type"] == "python" and rows["model_costs"]["cli_reason"] is None
    )
    assert rows["skill_packager"]["skill_type"] == "skill_md"
    assert "scripts/package_skill.py" in rows["skill_packager"]["hint"]
