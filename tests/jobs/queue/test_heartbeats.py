"""Dead workers found by their missing heartbeat, with real worker processes on PostgreSQL
and Redis: a job of a worker killed with -9 is re-run within 10 s, a worker paused for 5 s
is not taken over, and a job whose runs are lost 3 times fails instead of running forever."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from jobs import texts
from jobs.queue import incidents
from jobs.services import Services
from tests.helpers.jobs import TG, dispatch, job_and_attempts, wait_status
from tests.helpers.settings import JOB_SKILLS, make_settings
from tests.helpers.workers import WorkerProcess, holder, pid_of

pytestmark = pytest.mark.slow


def _settings(tmp_path, pg_url, redis_server_url, redis_prefix, **kw):
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=str(JOB_SKILLS),
        worker_grace_sec=2.0,
        **kw,
    )


@pytest.fixture
def workers(tmp_path):
    started: list[WorkerProcess] = []

    def start(settings, **env: str) -> WorkerProcess:
        w = WorkerProcess(settings, tmp_path / f"worker{len(started)}.log", **env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
async def default_beats(tmp_path, pg_url, redis_server_url, redis_prefix):
    """The shipped heartbeat (2.5 s) and lease (30 s) settings."""
    s = _settings(tmp_path, pg_url, redis_server_url, redis_prefix)
    assert s.worker_heartbeat_sec == 2.5 and s.worker_lease_sec == 30.0
    svc = await Services.open(s)
    yield s, svc
    await svc.close()


async def _two_workers_and_a_job(settings, svc, workers, seconds: float, marker):
    a, b = workers(settings), workers(settings)
    job_id = await dispatch(svc, "bg_sleep", {"seconds": seconds, "marker": str(marker)}, TG)
    first = await holder(svc, job_id, limit=60)
    victim, other = (a, b) if pid_of(first.worker_id) == a.pid else (b, a)
    await asyncio.sleep(1.0)  # both workers have beaten at least once
    return job_id, victim, other


@pytest.mark.slow
async def test_a_killed_workers_job_is_rerun_within_10_seconds(default_beats, workers, tmp_path):
    settings, svc = default_beats
    marker = tmp_path / "completed"
    job_id, victim, survivor = await _two_workers_and_a_job(settings, svc, workers, 4, marker)
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    job = await wait_status(svc, job_id, {"succeeded", "failed"}, limit=60)
    assert job.status == "succeeded"
    _, attempts = await job_and_attempts(svc, job_id)
    assert [a.outcome for a in attempts] == ["lost", "succeeded"]
    assert "missed 3 heartbeats" in (attempts[0].error or "")
    rerun_after = attempts[1].started_at - killed_at
    assert rerun_after < 10.0, rerun_after
    assert marker.read_text().split() == [str(survivor.pid)]


@pytest.mark.slow
async def test_a_worker_paused_for_5_seconds_is_not_taken_over(default_beats, workers, tmp_path):
    settings, svc = default_beats
    marker = tmp_path / "completed"
    job_id, paused, _ = await _two_workers_and_a_job(settings, svc, workers, 7, marker)
    paused.signal(signal.SIGSTOP)
    await asyncio.sleep(5.0)
    paused.signal(signal.SIGCONT)
    job = await wait_status(svc, job_id, {"succeeded", "failed"}, limit=60)
    await asyncio.sleep(1.0)
    job, attempts = await job_and_attempts(svc, job_id)
    assert job.status == "succeeded" and job.attempts == 1
    assert [a.outcome for a in attempts] == ["succeeded"]
    assert marker.read_text().split() == [str(paused.pid)]  # one run, by the paused worker


@pytest.mark.slow
async def test_a_job_lost_three_times_fails_and_is_not_rerun(
    tmp_path, pg_url, redis_server_url, redis_prefix, workers, tg
):
    """...and the person is told in one short line, in their language, once."""
    settings = _settings(
        tmp_path,
        pg_url,
        redis_server_url,
        redis_prefix,
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        reconcile_stale_sec=2.0,
    )
    svc = await Services.open(settings)
    channel = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
    origin = {**TG, "actor_key": "1001", "locale": "zh-CN"}
    try:
        marker = tmp_path / "completed"
        running = [workers(settings, **channel)]
        job_id = await dispatch(svc, "bg_sleep", {"seconds": 60, "marker": str(marker)}, origin)
        for n in range(1, 4):
            running.append(workers(settings, **channel))  # the one that takes over
            attempt = await holder(svc, job_id, limit=60)
            assert attempt.number == n
            victim = next(w for w in running if w.pid == pid_of(attempt.worker_id))
            victim.signal(signal.SIGKILL)
            running.remove(victim)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until taken over (or failed, the 3rd time)
                job, attempts = await job_and_attempts(svc, job_id)
                if job.status == "failed" or len(attempts) > n:
                    break
                await asyncio.sleep(0.1)
        job = await wait_status(svc, job_id, {"failed"}, limit=30)
        await asyncio.sleep(2.0)  # nobody runs it again
        job, attempts = await job_and_attempts(svc, job_id)
        assert job.status == "failed" and job.attempts == 3 and job.error_type == "lost"
        assert job.error == "lost 3 times (the worker running it died or stalled each time)"
        assert [a.outcome for a in attempts] == ["lost", "lost", "lost"]
        assert not marker.exists()  # the skill never completed
        [inc] = await incidents.list_incidents(svc.sessionmaker, skill="bg_sleep")
        assert inc["error_type"] == "lost" and inc["sample_job_ids"] == [job_id]
        deadline = time.monotonic() + 20
        while not tg.sent and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # (nothing more comes)
        said = [(m["chat_id"], m.get("text")) for m in tg.sent]
        assert said == [("1001", f"抱歉，bg_sleep 未能完成：{texts.text('lost_reason', 'zh')}。")]
    finally:
        await svc.close()
