"""Poison values and the finishing stage: a job always ends, on SQLite and PostgreSQL.

A skill printing NUL and non-UTF-8 bytes, run in the background by a real worker, ends
``succeeded`` (values escaped, noted); an exception anywhere in the finishing stage ends
the job ``failed``/``internal`` and the person is told; values are storable everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from jobs import storable
from jobs.queue import store
from jobs.queue.runner import INTERNAL_NOTICE, JobRunner
from jobs.queue.stall import StallWatch
from jobs.services import Services
from tests.helpers.jobs import TG, dispatch, drain, job_and_attempts
from tests.helpers.settings import JOB_SKILLS

POISON = r"printf 'weird \000 bytes \377\376 end\n'"


def _skill(root: Path, name: str, script: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: prints bytes no database stores\nasync: true\n"
        "exec:\n  primary:\n    type: shell\n    entry: run.sh\n---\n# poison\n"
    )
    (folder / "run.sh").write_text(f"#!/bin/sh\n{script}\n")
    os.chmod(folder / "run.sh", 0o755)


@pytest.fixture
def poison_settings(job_settings, tmp_path):
    skills = tmp_path / "poison_skills"
    _skill(skills, "poison_out", POISON)
    _skill(skills, "poison_err", POISON.replace("\\n'", "\\n' >&2") + "\nexit 3")
    job_settings.skills_path = f"{skills}{os.pathsep}{JOB_SKILLS}"
    return job_settings


# --- the helper, pure ------------------------------------------------------------------


def test_nul_and_lone_surrogates_are_escaped_and_noted():
    notes = storable.Notes()
    raw = "a\x00b" + b"\xff".decode("utf-8", "surrogateescape")
    out = storable.json_value({"k\x00": [raw, float("nan"), b"\x00x"]}, notes)
    assert out == {"k\\x00": ["a\\x00b\\udcff", None, "\\x00x"]}
    assert "NUL" in notes.text() and "surrogates" in notes.text() and "null" in notes.text()
    assert storable.text("x" * 50, cap=10) == "x" * 9 + "…"


def test_values_that_need_nothing_are_kept_and_the_rest_is_found_at_any_depth():
    clean = {"t": "你好" * 1000, "n": [1, 2.5, None, True, {"deep": [2**62]}]}
    assert storable.json_value(clean) is clean  # nothing to change: the value itself
    big = {"n": [{"deep": [2**70, -(2**70)]}]}  # past 64 bits: the careful path, exact
    assert storable.json_value(big) == big
    for bad in (
        {"a": [{"b": [float("inf")]}]},
        {"a": [[["x\x00"]]]},
        [{"s": b"\xfe".decode("utf-8", "surrogateescape")}],
        {"a": float("-inf")},
        float("nan"),
    ):
        notes = storable.Notes()
        out = storable.json_value(bad, notes)
        assert out != bad and notes, bad
    assert storable.json_value({"k": "x" * 100}, cap=50)["_truncated"] is True


def test_oversize_values_become_a_marked_summary():
    res = storable.result({"ok": True, "message": "big", "rows": ["x" * 1000] * 3000})
    assert res is not None and res["_truncated"] and res["ok"] is True
    assert res["message"] == "big" and "summary" in res["storage_note"]
    assert storable.result({"ok": True}) == {"ok": True}  # nothing to note: unchanged


# --- a real skill through a real worker, both backends --------------------------------


async def test_skill_printing_nul_and_bad_bytes_succeeds(poison_settings):
    svc = await Services.open(poison_settings)
    try:
        job_id = await dispatch(svc, "poison_out")
        await drain(svc)
        job, attempts = await job_and_attempts(svc, job_id)
        assert job.status == "succeeded", (job.status, job.error)
        assert [a.outcome for a in attempts] == ["succeeded"]
        result = svc.box.unseal(job.result)
        text = str(result)
        assert "\x00" not in text and "\\x00" in text and "storage_note" in result
    finally:
        await svc.close()


async def test_failing_skill_with_nul_on_stderr_fails_with_a_reason(poison_settings):
    svc = await Services.open(poison_settings)
    try:
        job_id = await dispatch(svc, "poison_err")
        await drain(svc)
        job, _ = await job_and_attempts(svc, job_id)
        assert job.status == "failed" and job.attempts == 1
        assert "weird" in (job.error or "") and "\x00" not in (job.error or "")
    finally:
        await svc.close()


@pytest.mark.slow
async def test_nul_in_a_dispatched_input_is_stored(services):
    job_id = await dispatch(services, "bg_sleep", {"seconds": 0, "note": "a\x00b"})
    job, _ = await job_and_attempts(services, job_id)
    assert services.box.unseal(job.input)["note"] == "a\\x00b"
    assert "NUL" in job.context["storage_note"]


async def test_outcomes_batched_with_a_poison_one_are_all_recorded(services):
    """One unstorable outcome must not fail the others of its batch."""
    ids = [await dispatch(services, "bg_sleep", {"seconds": 0}) for _ in range(3)]
    tokens = [(await store.get_job(services.sessionmaker, i)).lease_token for i in ids]
    claims = await store.claim_many(
        services.sessionmaker, list(zip(ids, tokens, strict=True)), "w-test", 30.0
    )
    assert all(c is not None for c in claims)
    outs = [
        store.Outcome(c.job.id, c.token, "succeeded", {"text": f"r{n}\x00"}, None, None)
        for n, c in enumerate(c for c in claims if c is not None)
    ]
    assert await store.finish_many(services.sessionmaker, outs) == [True, True, True]


# --- the finishing stage never only logs ----------------------------------------------


@pytest.mark.slow
async def test_an_exception_in_the_finishing_stage_fails_the_job_and_tells_the_user(
    job_settings, tg, monkeypatch, caplog
):
    job_settings.telegram_bot_token = SecretStr(tg.token)
    job_settings.telegram_api_base = tg.url

    def broken(self, job, result):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(JobRunner, "_for_storage", broken)
    svc = await Services.open(job_settings)
    try:
        job_id = await dispatch(svc, "bg_sleep", {"seconds": 0}, {**TG, "actor_key": "1001"})
        with caplog.at_level(logging.ERROR):
            await drain(svc)
        job, attempts = await job_and_attempts(svc, job_id)
        assert job.status == "failed" and job.error_type == "internal"
        assert "finishing stage (record)" in job.error and "RuntimeError: disk on fire" in job.error
        assert [a.outcome for a in attempts] == ["failed"]
        deadline = time.monotonic() + 10
        while not tg.sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        texts = [m.get("text") or m.get("caption") or "" for m in tg.sent]
        assert f"Sorry, bg_sleep could not finish: {INTERNAL_NOTICE}." in texts, texts
    finally:
        await svc.close()


@pytest.mark.slow
async def test_a_failing_post_processing_fails_the_job_keeping_the_skills_result(
    job_settings, tg, monkeypatch
):
    """Post-processing that raises (not the database being away) is not recorded as a
    success nobody received: failed/internal naming the stage, the person told, the
    skill's result kept in the record for the operator."""
    job_settings.telegram_bot_token = SecretStr(tg.token)
    job_settings.telegram_api_base = tg.url
    real = JobRunner._postprocess

    async def broken(self, job, token, result, **kw):  # the success result only, not the notice
        if result.get("ok", True) is not False:
            raise ValueError("renderer exploded")
        return await real(self, job, token, result, **kw)

    monkeypatch.setattr(JobRunner, "_postprocess", broken)
    svc = await Services.open(job_settings)
    try:
        job_id = await dispatch(svc, "bg_sleep", {"seconds": 0}, {**TG, "actor_key": "1001"})
        await drain(svc)
        job, attempts = await job_and_attempts(svc, job_id)
        assert job.status == "failed" and job.error_type == "internal"
        assert "finishing stage (post-processing)" in job.error
        assert "ValueError: renderer exploded" in job.error
        assert job.result["skill_result"]["ok"] is True  # what the skill answered, kept
        assert [a.outcome for a in attempts] == ["failed"]
        deadline = time.monotonic() + 10
        while not tg.sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        texts = [m.get("text") or m.get("caption") or "" for m in tg.sent]
        assert f"Sorry, bg_sleep could not finish: {INTERNAL_NOTICE}." in texts, texts
    finally:
        await svc.close()


# --- the stall detector -----------------------------------------------------------------


@pytest.mark.slow
async def test_a_blocked_event_loop_is_reported_with_its_stack(caplog):
    watch = StallWatch(threshold=0.3, interval=0.05)
    with caplog.at_level(logging.WARNING, logger="skilljobs.stall"):
        watch.start()
        try:
            await asyncio.sleep(0.1)
            time.sleep(0.8)  # the blocking code
            await asyncio.sleep(0.2)
        finally:
            watch.stop()
    assert watch.stalls == 1 and watch.max_lag > 0.3
    assert "test_a_blocked_event_loop_is_reported_with_its_stack" in caplog.text


@pytest.mark.slow
async def test_an_exception_while_running_fails_the_job_instead_of_losing_it(services, monkeypatch):
    """Not only logged by arq (the job would stay running, be lost and re-run 3 times)."""
    from jobs.execution.executor import Executor

    async def broken(self, *args, **kwargs):
        raise RuntimeError("executor bug")

    monkeypatch.setattr(Executor, "execute", broken)
    job_id = await dispatch(services, "bg_sleep", {"seconds": 0})
    await drain(services)
    job, attempts = await job_and_attempts(services, job_id)
    assert job.status == "failed" and job.error_type == "internal" and job.attempts == 1
    assert "while running it: RuntimeError: executor bug" in job.error
    assert [a.outcome for a in attempts] == ["failed"]


def test_a_database_starting_up_is_waited_out_but_a_refused_value_is_not():
    from sqlalchemy.exc import DBAPIError

    from jobs.queue.runner import db_unavailable

    class Orig(Exception):
        def __init__(self, sqlstate: str) -> None:
            super().__init__(sqlstate)
            self.sqlstate = sqlstate

    def err(state: str) -> DBAPIError:
        return DBAPIError("SELECT 1", None, Orig(state))

    assert db_unavailable(err("57P03"))  # the database system is starting up
    assert db_unavailable(err("53300")) and db_unavailable(err("08006"))
    assert not db_unavailable(err("22021"))  # a value the database refuses: reported
    assert not db_unavailable(RuntimeError("bug"))
