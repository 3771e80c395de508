"""Processes dying and services going away, with real `skilljobs worker` processes on
PostgreSQL + Redis: kill -9, a paused worker waking up, SIGTERM, a database outage."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from dataclasses import dataclass

import pytest
from sqlalchemy import select

from jobs.models import Job
from jobs.queue.dispatcher import Dispatcher
from jobs.services import Services
from tests.fakes.server import Request, Response
from tests.fakes.telegram import FakeTelegram
from tests.helpers.jobs import TG, job_and_attempts, wait_status
from tests.helpers.settings import FAKE_SKILLS, JOB_SKILLS, make_settings
from tests.helpers.workers import WorkerProcess, holder, pid_of

pytestmark = pytest.mark.slow


@pytest.fixture
def pg_settings(tmp_path, pg_url, redis_server_url, redis_prefix):
    return make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=pg_url,
        skills_path=str(JOB_SKILLS),
        worker_lease_sec=3.0,
        worker_heartbeat_sec=0.5,
        reconcile_interval_sec=0.5,
        reconcile_stale_sec=2.0,
        worker_grace_sec=2.0,
    )


@pytest.fixture
async def svc(pg_settings):
    s = await Services.open(pg_settings)
    yield s
    await s.close()


@pytest.fixture
def workers(tmp_path):
    started: list[WorkerProcess] = []

    def start(settings, **overrides: str) -> WorkerProcess:
        w = WorkerProcess(settings, tmp_path / f"worker{len(started)}.log", **overrides)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.mark.slow
async def test_kill_9_mid_job_is_rerun_by_another_worker(svc, pg_settings, workers, tmp_path):
    marker = tmp_path / "completed"
    a, b = workers(pg_settings), workers(pg_settings)
    res = await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 3, "marker": str(marker)}, TG)
    job_id = res.body["job_id"]
    first = await holder(svc, job_id)
    victim, survivor = (a, b) if pid_of(first.worker_id) == a.pid else (b, a)
    assert pid_of(first.worker_id) == victim.pid
    killed_at = time.time()
    victim.signal(signal.SIGKILL)
    job = await wait_status(svc, job_id, {"succeeded", "failed"}, limit=60)
    assert job.status == "succeeded"
    job, attempts = await job_and_attempts(svc, job_id)
    assert [a.outcome for a in attempts] == ["lost", "succeeded"]
    assert pid_of(attempts[1].worker_id) == survivor.pid
    assert attempts[1].started_at - killed_at < 60
    assert marker.read_text().split() == [str(survivor.pid)]  # exactly one completed run
    assert svc.box.unseal(job.result)["pid"] == survivor.pid


@pytest.mark.slow
async def test_paused_worker_that_wakes_up_records_nothing(svc, pg_settings, workers, tmp_path):
    a, b = workers(pg_settings), workers(pg_settings)
    res = await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 2}, TG)
    job_id = res.body["job_id"]
    first = await holder(svc, job_id)
    sleeper, other = (a, b) if pid_of(first.worker_id) == a.pid else (b, a)
    sleeper.signal(signal.SIGSTOP)
    try:
        job = await wait_status(svc, job_id, {"succeeded"}, limit=60)
    finally:
        sleeper.signal(signal.SIGCONT)
    assert svc.box.unseal(job.result)["pid"] == other.pid
    await asyncio.sleep(4)  # the woken attempt finishes its sleep and tries to record
    job, attempts = await job_and_attempts(svc, job_id)
    assert job.status == "succeeded" and svc.box.unseal(job.result)["pid"] == other.pid
    assert [a.outcome for a in attempts] == ["lost", "succeeded"]
    assert sleeper.proc.poll() is None  # and it did not crash over it


@pytest.mark.slow
async def test_sigterm_lets_short_jobs_finish_and_hands_back_long_ones(svc, pg_settings, workers):
    w = workers(pg_settings)
    short = (await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 1}, TG)).body["job_id"]
    long = (await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 6}, TG)).body["job_id"]
    await holder(svc, short)
    await holder(svc, long)
    w.signal(signal.SIGTERM)
    assert await asyncio.to_thread(w.proc.wait, 30) is not None
    job, _ = await job_and_attempts(svc, short)
    assert job.status == "succeeded"
    job, attempts = await job_and_attempts(svc, long)
    assert job.status == "queued"  # handed back, nothing half-recorded
    assert [a.outcome for a in attempts] == ["requeued"] and job.result is None
    workers(pg_settings)
    job = await wait_status(svc, long, {"succeeded"}, limit=60)
    assert job.attempts == 2


class FlakyProxy:
    """A TCP proxy to PostgreSQL that can drop every connection and refuse new ones."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.down = False
        self.conns: set[asyncio.StreamWriter] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader, writer) -> None:
        if self.down:
            writer.close()
            return
        try:
            ur, uw = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.conns.update({writer, uw})

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except Exception:
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, uw), pipe(ur, writer))

    def cut(self) -> None:
        self.down = True
        for w in list(self.conns):
            w.close()
        self.conns.clear()

    async def close(self) -> None:
        self.cut()
        if self.server:
            self.server.close()


@pytest.mark.slow
async def test_database_outage_mid_job_does_not_crash_the_worker(svc, pg_settings, workers):
    from sqlalchemy.engine import make_url

    url = make_url(pg_settings.database_url)
    proxy = FlakyProxy(url.host or "127.0.0.1", url.port or 5432)
    port = await proxy.start()
    try:
        proxied = url.set(port=port, host="127.0.0.1").render_as_string(hide_password=False)
        w = workers(pg_settings, SKILLJOBS_DATABASE_URL=proxied, SKILLJOBS_WORKER_LEASE_SEC="30")
        job_id = (await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 2}, TG)).body["job_id"]
        await holder(svc, job_id)
        proxy.cut()  # PostgreSQL "restarts": every connection dropped, new ones refused
        await asyncio.sleep(4)  # the skill finishes while the database is away
        assert w.proc.poll() is None
        proxy.down = False
        job = await wait_status(svc, job_id, {"succeeded", "failed"}, limit=60)
        assert job.status == "succeeded" and job.attempts == 1
        assert w.proc.poll() is None, w.log.read_text()[-2000:]
        # and it keeps working afterwards
        nxt = (await Dispatcher(svc).dispatch("bg_sleep", {"seconds": 0}, TG)).body["job_id"]
        assert (await wait_status(svc, nxt, {"succeeded"}, limit=30)).attempts == 1
    finally:
        await proxy.close()


class StallingTelegram(FakeTelegram):
    """Holds the first sendDocument (undelivered) until :meth:`release` (the worker is
    stopped long before), then processes it: the message arrives, late."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = asyncio.Event()
        self._released = threading.Event()  # set from the test's thread and loop
        self._stall_once = True

    def release(self) -> None:
        self._released.set()

    async def _handle(self, req: Request) -> Response:
        if req.path.endswith("/sendDocument") and self._stall_once:
            self._stall_once = False
            self.stalled.set()
            deadline = time.monotonic() + 60
            while not self._released.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return await super()._handle(req)


@dataclass
class StalledDelivery:
    """A `two_files` job whose first item reached the chat and whose second hangs."""

    tg: StallingTelegram
    env: dict[str, str]
    first: WorkerProcess
    svc: Services
    job_id: str

    async def wait_for_the_rest(self) -> list[str]:
        """Once the job is re-run: the methods the chat received, in order."""
        job = await wait_status(self.svc, self.job_id, {"succeeded", "failed"}, limit=90)
        assert job.status == "succeeded"
        self.tg.release()  # the held request arrives only now, after the re-run
        deadline = time.monotonic() + 30
        while len(self.tg.sent) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)
        return [m["method"] for m in self.tg.sent]


@pytest.fixture
async def stalled(pg_settings, workers):
    tg = StallingTelegram().start()
    try:
        pg_settings.skills_path = str(FAKE_SKILLS)
        env = {"SKILLJOBS_TELEGRAM_BOT_TOKEN": tg.token, "SKILLJOBS_TELEGRAM_API_BASE": tg.url}
        first = workers(pg_settings, **env)
        s = await Services.open(pg_settings)
        try:
            origin = {**TG, "actor_key": "1001"}
            job_id = (await Dispatcher(s).dispatch("two_files", {}, origin)).body["job_id"]
            deadline = time.monotonic() + 30
            while not tg.stalled.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert tg.stalled.is_set(), first.log.read_text()[-2000:]
            assert [m["method"] for m in tg.sent] == ["sendPhoto"]
            yield StalledDelivery(tg, env, first, s, job_id)
        finally:
            await s.close()
    finally:
        tg.release()
        tg.stop()


@pytest.mark.slow
async def test_worker_killed_mid_delivery_sends_each_item_once(stalled, pg_settings, workers):
    """The first item reached the chat, the worker died while the second was on the wire:
    the re-run sends neither again. The second's outcome cannot be known (here it did
    arrive, late), so it is recorded ``unknown`` for an operator, never re-sent blindly."""
    stalled.first.signal(signal.SIGKILL)
    workers(pg_settings, **stalled.env)
    assert await stalled.wait_for_the_rest() == ["sendPhoto", "sendDocument"]
    tg = stalled.tg
    assert tg.sent[0]["caption"] == "Weekly numbers"
    assert tg.sent[1]["filename"] == "data.csv"
    from jobs.models import Delivery

    async with stalled.svc.sessionmaker() as sess:
        rows = (await sess.scalars(select(Delivery).where(Delivery.job_id == stalled.job_id))).all()
    assert sorted((r.kind, r.status) for r in rows) == [("file", "unknown"), ("image", "sent")]


@pytest.mark.slow
async def test_sigterm_mid_delivery_hands_the_job_back(stalled, pg_settings, workers):
    """A job whose skill has finished but whose delivery hangs when SIGTERM arrives: the
    worker waits out the grace period, hands the job back and exits; the next worker
    delivers what is missing, once."""
    t0 = time.monotonic()
    stalled.first.signal(signal.SIGTERM)
    assert await asyncio.to_thread(stalled.first.proc.wait, 30) is not None
    assert time.monotonic() - t0 < 15  # the 2 s grace, not the stall
    job, attempts = await job_and_attempts(stalled.svc, stalled.job_id)
    assert job.status == "queued" and job.result is None
    assert [a.outcome for a in attempts] == ["requeued"]
    workers(pg_settings, **stalled.env)
    assert await stalled.wait_for_the_rest() == ["sendPhoto", "sendDocument"]
    job, _ = await job_and_attempts(stalled.svc, stalled.job_id)
    assert job.attempts == 2


async def test_dispatch_right_after_a_database_restart_is_not_refused(pg_settings):
    """The pool still holds connections from before PostgreSQL restarted: the first
    dispatch finds them dead and is retried on fresh ones instead of failing."""
    from sqlalchemy.engine import make_url

    url = make_url(pg_settings.database_url)
    proxy = FlakyProxy(url.host or "127.0.0.1", url.port or 5432)
    port = await proxy.start()
    try:
        pg_settings.database_url = url.set(port=port, host="127.0.0.1").render_as_string(
            hide_password=False
        )
        s = await Services.open(pg_settings)
        try:
            d = Dispatcher(s)
            ctx = {**TG, "role_id": "r-restart"}  # configs are read: two statements
            assert (await d.dispatch("bg_sleep", {}, ctx)).status_code == 202
            proxy.cut()  # "restart": every pooled connection is dead
            proxy.down = False  # the server is back
            res = await d.dispatch("bg_sleep", {}, ctx)
            assert res.status_code == 202, res.body
            async with s.sessionmaker() as sess:
                job = await sess.get(Job, res.body["job_id"])
            assert job is not None and job.status == "queued"
        finally:
            await s.close()
    finally:
        await proxy.close()
