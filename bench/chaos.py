"""The chaos harness: the reliability promises under load and repeated faults.

Run: ``.venv/bin/python -m bench.chaos [--duration 300] [--jobs 5000] [--workers 3]
[--results bench/RESULTS.md]`` (``make chaos``). Everything is private and thrown away: a
PostgreSQL cluster made with ``initdb`` under a temporary folder (so it can be restarted),
a Redis server, a fake Telegram server, 3 ``skilljobs worker`` processes (with the chain
scheduler) and ``skilljobs web``, through which every job is dispatched.

Workload: ``--jobs`` jobs spread over ``--duration`` seconds — in-process no-ops, 0.2–2 s
sleepers, file-producing and flaky (transient) skills, and subprocess skills (a Python CLI
script, 0.2–2 s or one in five 10–14 s, and a 1 s shell script) — delivered to the fake Telegram chat or to web
sessions, plus 3 chains firing every minute (a 6 s sleeper, then a no-op; each step logs
its completion under its run). Faults meanwhile: ``kill -9`` of a random worker every
5–20 s (restarted after a few seconds), SIGTERM of one, a Redis restart, a Redis outage
while results finish (stopped for 5 s), a ``FLUSHALL``, a PostgreSQL restart (``pg_ctl
restart -m fast``; the cluster runs with ``fsync`` on), ``pg_terminate_backend`` of every
client connection, a connection-pool exhaustion burst, a worker stalled (SIGSTOP) for
longer than its lease, the chat platform answering 500 for a window and hanging for one.

Accounting, from the database and an independent ledger: every execution of a skill
appends a ``start`` and an ``end`` line (tag, pid, time) to its own log, and the fake
Telegram counts the messages that reached it per job. Must be 0, else the exit status is
1: jobs lost (never terminal), jobs executed twice (two executions overlapping, or one
completing after the job's outcome was recorded), results delivered twice (Telegram
messages beyond deliveries left ``unknown``, web messages stored twice), jobs failed
because of a fault, deliveries not arrived at the end (a succeeded job's result missing
from its chat, or a delivery not ``sent``/``unknown``), cron ticks missing or run twice
(each minute boundary while the chains existed fires once), chain steps completed after
their run's outcome was recorded. Reported: repeated completions (a re-run after a worker
died between its skill's end and its record), time from each fault to the next finished
job and from each ``kill -9`` to the re-run of the killed worker's jobs (p50/p99). The
table is appended to ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import itertools
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECRET = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
TOKEN = "chaos-token"
CHATS = [str(5000 + n) for n in range(10)]
TERMINAL = ("succeeded", "failed", "timed_out", "cancelled")
CHAIN_DONE = ("succeeded", "failed", "stopped_empty")


def _die_with_parent() -> None:
    """In the child, before exec: killed when the harness dies, however it dies."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# --- the private services ------------------------------------------------------------------


class Postgres:
    """A PostgreSQL cluster of its own, under ``root`` (``initdb``; as ``postgres`` when we
    are root, which initdb refuses to run as)."""

    def __init__(self, root: Path) -> None:
        self.root = root / "pg"
        self.port = _free_port()
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        self.bin = Path(found[-1]).parent if found else Path(shutil.which("initdb") or "x").parent
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        subprocess.run(
            [*self.as_user, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def start(self) -> None:
        self.root.mkdir(parents=True)
        if self.as_user:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.root.parent, "postgres", "postgres")
        data = str(self.root / "data")
        self._run(str(self.bin / "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "-N")
        self._pg_ctl("start")

    def _pg_ctl(self, action: str, *extra: str) -> None:
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c max_connections=200 -c fsync=on -c synchronous_commit=on"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.root / "data"),
            "-l",
            str(self.root / "log"),
            "-o",
            opts,
            "-w",
            *extra,
            action,
        )

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._pg_ctl("stop", "-m", "immediate")

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/chaos"


class Redis:
    """A private, password-protected redis-server without persistence."""

    def __init__(self, root: Path) -> None:
        self.port = _free_port()
        self.password = uuid.uuid4().hex
        self.dir = root / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server") or "redis-server"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--requirepass", self.password, "--dir", str(self.dir)],
            stdout=(self.dir / "log").open("ab"),
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"


# --- skills of the workload ------------------------------------------------------------------

_HANDLER = """
import asyncio, os, pathlib, time

LOG = {log!r}


def _log(event, tag):
    with open(LOG, "a") as fh:  # one short line per event, appended atomically
        fh.write(f"{{event}} {{tag}} {{os.getpid()}} {{time.time():.3f}}\\n")


async def execute(input_data, ctx):
    tag = input_data["tag"]
    if ctx.get("channel") == "schedule":  # a chain step: one tag per run (its fire time)
        tag = f"{{tag}}@{{round(float(ctx.get('triggered_at') or 0))}}"
    _log("start", tag)
{body}
    _log("end", tag)
    return {{"ok": True, "message": f"done {{tag}}"{extra}}}
"""

SKILLS: dict[str, tuple[str, str]] = {
    "chaos_noop": ("", ""),
    "chaos_sleep": ('    await asyncio.sleep(float(input_data.get("seconds", 0.5)))', ""),
    "chaos_file": (
        '    ws = pathlib.Path(ctx["workspace_dir"]); ws.mkdir(parents=True, exist_ok=True)\n'
        '    path = ws / f"{tag}.csv"; path.write_text("a,b\\n1,2\\n")',
        ', "files": [{"local_path": str(path)}]',
    ),
    "chaos_flaky": (
        '    mark = pathlib.Path(LOG).with_name("flaky-" + tag)\n'
        "    if not mark.exists():\n"
        '        mark.write_text("1")\n'
        '        raise ConnectionError("flaky upstream refused the connection")',
        "",
    ),
}


_CLI = """\
\"\"\"Sleep a while, then print that it is done (an argparse CLI, run as a subprocess).\"\"\"

import argparse
import os
import time

LOG = {log!r}


def log(event, tag):
    with open(LOG, "a") as fh:
        fh.write(f"{{event}} {{tag}} {{os.getpid()}} {{time.time():.3f}}\\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tag", required=True)
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    log("start", args.tag)
    time.sleep(args.seconds)
    log("end", args.tag)
    print(f"done {{args.tag}}")


if __name__ == "__main__":
    main()
"""

_SH = """\
#!/bin/sh
# Sleep a while, then say it is done (a shell skill: its input arrives as --tag TAG).
tag=""
while [ $# -gt 0 ]; do
  case "$1" in --tag) tag="$2"; shift ;; esac
  shift
done
echo "start $tag $$ $(date +%s.%N)" >> {log}
sleep 1
echo "end $tag $$ $(date +%s.%N)" >> {log}
echo "done $tag"
"""


def write_subprocess_skills(skills: Path, log: Path) -> None:
    cli = skills / "chaos_cli"
    cli.mkdir(parents=True)
    (cli / "SKILL.md").write_text(
        "---\nname: chaos_cli\ndescription: chaos workload CLI script\nasync: true\n"
        "exec:\n  primary:\n    type: python\n    entry: run.py\n---\n# chaos_cli\n"
    )
    (cli / "run.py").write_text(_CLI.format(log=str(log)))
    sh = skills / "chaos_sh"
    sh.mkdir(parents=True)
    (sh / "SKILL.md").write_text(
        "---\nname: chaos_sh\ndescription: chaos workload shell script\nasync: true\n"
        "exec:\n  primary:\n    type: shell\n    entry: run.sh\n---\n# chaos_sh\n"
    )
    (sh / "run.sh").write_text(_SH.format(log=str(log)))
    (sh / "run.sh").chmod(0o755)


def write_skills(root: Path, log: Path) -> Path:
    skills = root / "skills"
    for name, (body, extra) in SKILLS.items():
        folder = skills / name
        folder.mkdir(parents=True)
        (folder / "SKILL.md").write_text(
            f"---\nname: {name}\ndescription: chaos workload skill {name}\nasync: true\n---\n"
            f"# {name}\n"
        )
        handler = _HANDLER.format(log=str(log), body=body or "    pass", extra=extra)
        (folder / "handler.py").write_text(handler)
    write_subprocess_skills(skills, log)
    return skills


# --- processes -----------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.cli.app", *self.args],
            env=self.env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(ROOT),
            preexec_fn=_die_with_parent,
        )
        self.pids.append(self.proc.pid)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def crash(self) -> None:
        """``kill -9`` of the process alone (as the OOM killer does): whatever it started
        is on its own then — a skill's subprocesses must die with it by themselves."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    at: float
    pid: int | None = None


@dataclass
class Run:
    duration: float
    n_jobs: int
    n_workers: int
    seed: int
    drain: float
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="skilljobs-chaos-")))
    faults: list[Fault] = field(default_factory=list)
    dispatched: dict[str, str] = field(default_factory=dict)  # tag → job id
    channel_of: dict[str, str] = field(default_factory=dict)  # tag → its origin channel
    retries: int = 0
    refusals: list[str] = field(default_factory=list)
    t0: float = 0.0
    chains_at: float = 0.0
    tg: Any = None

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.lease = 10.0 if self.duration < 120 else 30.0
        self.pg = Postgres(self.root)
        self.redis = Redis(self.root)
        self.completions = self.root / "completions.log"
        self.workers: list[Proc] = []
        self.web: Proc | None = None
        self.web_port = _free_port()

    def env(self, tg_url: str, skills: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLJOBS_")}
        env.update(
            SKILLJOBS_DATABASE_URL=self.pg.url,
            SKILLJOBS_REDIS_URL=self.redis.url,
            SKILLJOBS_REDIS_PREFIX="chaos",
            SKILLJOBS_QUEUE_NAME="chaos:queue",
            # trusted: the harness's own skills write the execution ledger outside their
            # workspace, which a sandboxed skill cannot (nor ever should)
            SKILLJOBS_SKILLS_PATH=f"trusted={skills}",
            SKILLJOBS_DATA_DIR=str(self.root / "data"),
            SKILLJOBS_SECRET_KEY=SECRET,
            SKILLJOBS_API_TOKEN=TOKEN,
            SKILLJOBS_TELEGRAM_BOT_TOKEN="123:ABC",
            SKILLJOBS_TELEGRAM_API_BASE=tg_url,
            SKILLJOBS_WORKER_LEASE_SEC=str(self.lease),
            SKILLJOBS_WORKER_MAX_JOBS="50",
            SKILLJOBS_WORKER_GRACE_SEC="5",
            SKILLJOBS_RETRY_BACKOFF_SEC="0.5",
            # an outage's sends are tried again at most 5 s apart (the window stays 30 min)
            SKILLJOBS_DELIVERY_RETRY_MAX_SEC="5",
            SKILLJOBS_LOG_LEVEL=os.environ.get("CHAOS_LOG_LEVEL", "WARNING"),
        )
        return env


async def _admin(run: Run, sql: str) -> Any:
    import asyncpg

    conn = await asyncpg.connect(run.pg.admin_dsn)
    try:
        return await conn.fetch(sql)
    finally:
        await conn.close()


async def _wait_http(url: str, limit: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + limit
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


# --- workload --------------------------------------------------------------------------------


def _job(run: Run, i: int) -> tuple[str, dict[str, Any]]:
    """The i-th job of the mix: (tag, dispatch body)."""
    tag = f"j{i:06d}"
    r = run.rng.random()
    if r < 0.25:
        skill, inp = "chaos_noop", {}
    elif r < 0.50:
        skill, inp = "chaos_sleep", {"seconds": round(run.rng.uniform(0.2, 2.0), 2)}
    elif r < 0.65:
        # one in five runs past the take-over of a killed worker (8.5 s): its process must
        # die with the worker, or the re-run overlaps it
        long = run.rng.random() < 0.2
        secs = run.rng.uniform(10.0, 14.0) if long else run.rng.uniform(0.2, 2.0)
        skill, inp = "chaos_cli", {"seconds": round(secs, 2)}
    elif r < 0.75:
        skill, inp = "chaos_sh", {}
    elif r < 0.93:
        skill, inp = "chaos_file", {}
    else:
        skill, inp = "chaos_flaky", {}
    body: dict[str, Any] = {"skill": skill, "input": {**inp, "tag": tag}, "idempotency_key": tag}
    if run.rng.random() < 0.5:
        chat = CHATS[i % len(CHATS)]  # each chat takes 1 message/s (Telegram's limit)
        ctx = {"channel": "telegram", "actor_key": chat, "session_id": f"tg-{chat}"}
    else:
        # a web session delegated by an organization: runs in the background and is
        # delivered to the session (a plain web session would run it on the sync line)
        ctx = {"channel": "web", "session_id": f"web-{i % 20}", "actor_key": f"u{i % 20}"}
        body["external_id"] = f"orgdeleg:chaos-{i % 20}"
    ctx.update(role_id="chaos", org_id="chaos")
    body["context"] = ctx
    return tag, body


async def dispatch_all(run: Run) -> None:
    """Dispatch ``n_jobs`` through ``skilljobs web`` at an even pace over the run; a refused
    or unanswered dispatch is retried under the same idempotency key (one job either way)."""
    import httpx

    url = f"http://127.0.0.1:{run.web_port}/api/v1/dispatch"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    span = run.duration * 0.9
    sem = asyncio.Semaphore(32)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        tag, body = _job(run, i)
        run.channel_of[tag] = body["context"]["channel"]
        await asyncio.sleep(max(0.0, run.t0 + span * i / run.n_jobs - time.time()))
        async with sem:
            for _ in range(240):
                try:
                    res = await client.post(url, json=body, headers=headers, timeout=10)
                    if res.status_code == 202:
                        run.dispatched[tag] = res.json()["job_id"]
                        return
                    if res.status_code < 500:  # a refusal is an answer: not retried
                        run.refusals.append(f"{res.status_code} {res.text[:200]}")
                        return
                except httpx.HTTPError:
                    pass
                run.retries += 1
                await asyncio.sleep(0.5)
            run.refusals.append("no answer after 240 tries")

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(one(client, i) for i in range(run.n_jobs)))


async def make_chains(run: Run, svc: Any) -> list[str]:
    from chains import schedules

    ids = []
    for n in range(3):
        spec = schedules.validate(
            {
                "name": f"chaos-chain-{n}",
                "cron": "* * * * *",
                "timezone": "UTC",
                "identity": {"role_id": "chaos", "org_id": "chaos", "session_id": f"chain-{n}"},
                "steps": [
                    {"skill": "chaos_sleep", "input": {"tag": f"chain{n}s", "seconds": 6}},
                    {"skill": "chaos_noop", "input": {"tag": f"chain{n}"}},
                ],
            },
            svc.registry,
        )
        row = await schedules.create(svc.sessionmaker, spec)
        ids.append(row.id)
    return ids


# --- faults ----------------------------------------------------------------------------------


async def _restart_later(run: Run, w: Proc, after: float) -> None:
    await asyncio.sleep(after)
    if not w.alive:
        w.start()


async def kill_loop(run: Run, until: float) -> None:
    """kill -9 of a random worker (its process alone) every 5–20 s, restarted after 2–4 s."""
    pending: set[asyncio.Task[None]] = set()
    while True:
        await asyncio.sleep(run.rng.uniform(5, 20))
        if time.time() >= until:
            break
        alive = [w for w in run.workers if w.alive]
        if len(alive) < 2:
            continue
        w = run.rng.choice(alive)
        assert w.proc is not None
        run.faults.append(Fault("kill -9", time.time(), w.proc.pid))
        w.crash()
        t = asyncio.create_task(_restart_later(run, w, run.rng.uniform(2, 4)))
        pending.add(t)
        t.add_done_callback(pending.discard)
    await asyncio.gather(*pending)


async def _sigterm(run: Run) -> None:
    w = run.workers[0]
    if not w.alive:
        return
    run.faults.append(Fault("SIGTERM", time.time(), w.proc.pid if w.proc else None))
    w.signal(signal.SIGTERM)
    if w.proc is not None:
        await asyncio.to_thread(w.proc.wait)
    w.start()


async def _redis_restart(run: Run) -> None:
    run.faults.append(Fault("redis restart", time.time()))
    run.redis.restart()  # on the loop's thread: the server must not die with a pool thread


async def _redis_outage(run: Run) -> None:
    """Redis stopped for 5 s while results finish (jobs running, deliveries going out)."""
    run.faults.append(Fault("redis outage 5 s", time.time()))
    run.redis.stop()
    await asyncio.sleep(5)
    run.redis.start()


async def _chat_500(run: Run) -> None:
    """The chat platform answers 500 to everything for a window."""
    window = 30.0 if run.duration >= 120 else 5.0
    run.faults.append(Fault(f"chat 500 for {window:.0f} s", time.time()))
    run.tg.outage(window)
    await asyncio.sleep(window)


async def _chat_hang(run: Run) -> None:
    """The chat platform holds every request for a window (past the client's 30 s read
    timeout in the full run: those sends end ``unknown``), then processes them."""
    window = 35.0 if run.duration >= 120 else 3.0
    run.faults.append(Fault(f"chat hang {window:.0f} s", time.time()))
    run.tg.hang(window)
    await asyncio.sleep(window)


async def _flushall(run: Run) -> None:
    import redis.asyncio as aioredis

    run.faults.append(Fault("redis FLUSHALL", time.time()))
    client = aioredis.from_url(run.redis.url)  # type: ignore[no-untyped-call]
    try:
        await client.flushall()
    finally:
        await client.aclose()


async def _pg_restart(run: Run) -> None:
    run.faults.append(Fault("postgres restart", time.time()))
    await asyncio.to_thread(run.pg.restart)


async def _terminate(run: Run) -> None:
    run.faults.append(Fault("pg_terminate_backend", time.time()))
    await _admin(
        run,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = 'chaos' AND pid <> pg_backend_pid()",
    )


async def _exhaust(run: Run) -> None:
    """Take every free connection slot for 5 s: the workers' new connections are refused."""
    import asyncpg

    run.faults.append(Fault("connection exhaustion", time.time()))
    held = []
    with contextlib.suppress(Exception):
        for _ in range(200):
            held.append(await asyncpg.connect(run.pg.admin_dsn, timeout=2))
    await asyncio.sleep(5)
    for conn in held:
        with contextlib.suppress(Exception):
            await conn.close()


async def _stall(run: Run) -> None:
    w = next((w for w in reversed(run.workers) if w.alive), None)
    if w is None:
        return
    run.faults.append(Fault("SIGSTOP > lease", time.time(), w.proc.pid if w.proc else None))
    w.signal(signal.SIGSTOP)
    await asyncio.sleep(run.lease + 2)
    w.signal(signal.SIGCONT)


FAULTS = [
    (0.08, _sigterm),
    (0.15, _redis_outage),
    (0.25, _chat_500),
    (0.32, _redis_restart),
    (0.38, _flushall),
    (0.45, _pg_restart),
    (0.52, _chat_hang),
    (0.60, _terminate),
    (0.66, _exhaust),
    (0.72, _stall),
]


async def fault_plan(run: Run) -> None:
    until = run.t0 + run.duration
    killer = asyncio.create_task(kill_loop(run, until - run.lease - 4))
    for frac, fault in FAULTS:
        await asyncio.sleep(max(0.0, run.t0 + frac * run.duration - time.time()))
        try:
            await fault(run)
        except Exception as exc:  # a fault that could not be applied is reported, not fatal
            print(f"fault {fault.__name__} not applied: {exc!r}", file=sys.stderr)
    await killer


# --- accounting ------------------------------------------------------------------------------


async def wait_drained(run: Run, sm: Any, limit: float) -> None:
    from sqlalchemy import func, select

    from jobs.models import ChainRun, Job

    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for w in run.workers:
            if not w.alive:
                w.start()
        with contextlib.suppress(Exception):
            async with sm() as s:
                left = await s.scalar(
                    select(func.count()).select_from(Job).where(Job.status.not_in(TERMINAL))
                )
                left += await s.scalar(
                    select(func.count())
                    .select_from(ChainRun)
                    .where(ChainRun.status.in_(("queued", "running")))
                )
            if left == 0:
                return
        await asyncio.sleep(1.0)


async def wait_delivered(run: Run, sm: Any, limit: float) -> None:
    """Until no delivery is on its way (``pending``/``sending``): an outage's sends are
    being tried again from the outbox."""
    from sqlalchemy import func, select

    from jobs.models import Delivery

    deadline = time.monotonic() + limit
    await asyncio.sleep(2)
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            async with sm() as s:
                left = await s.scalar(
                    select(func.count())
                    .select_from(Delivery)
                    .where(Delivery.status.in_(("pending", "sending")))
                )
            if left == 0:
                return
        await asyncio.sleep(1.0)


def _executions(run: Run) -> dict[str, list[tuple[float, float | None]]]:
    """The independent ledger: tag → its executions as (start, end or None when it never
    ended: killed with its worker)."""
    seen: dict[tuple[str, str], list[float | None]] = {}
    if run.completions.exists():
        for line in run.completions.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) != 4 or parts[0] not in ("start", "end"):
                continue
            event, tag, pid, at = parts
            span = seen.setdefault((tag, pid), [None, None])
            span[0 if event == "start" else 1] = float(at)
    out: dict[str, list[tuple[float, float | None]]] = {}
    for (tag, _pid), (start, end) in seen.items():
        out.setdefault(tag, []).append((start if start is not None else end or 0.0, end))
    return {t: sorted(xs, key=lambda x: x[0]) for t, xs in out.items()}


def _overlapping(xs: list[tuple[float, float | None]]) -> bool:
    """Two executions of one job at the same time (one started before the other ended)."""
    return any(end is not None and nxt[0] < end for (_, end), nxt in itertools.pairwise(xs))


async def account(
    run: Run, sm: Any, tg_sent: list[dict[str, Any]], chains: list[str]
) -> dict[str, Any]:
    from sqlalchemy import select

    from jobs.models import ChainRun, Delivery, Job, JobAttempt, SessionMessage

    async with sm() as s:
        jobs = {j.id: j for j in (await s.scalars(select(Job))).all()}
        attempts = (await s.scalars(select(JobAttempt).order_by(JobAttempt.started_at))).all()
        messages = (await s.scalars(select(SessionMessage))).all()
        deliveries = (await s.scalars(select(Delivery))).all()
        runs = (await s.scalars(select(ChainRun))).all()
    by_tag = run.dispatched
    execs = _executions(run)
    done = {t: [e for _, e in xs if e is not None] for t, xs in execs.items()}
    lost = [j for j in jobs.values() if j.status not in TERMINAL]
    repeated = {t: c for t, c in done.items() if t in by_tag and len(c) > 1}
    overlapping = [t for t, xs in execs.items() if t in by_tag and _overlapping(xs)]
    after_record = [
        t
        for t, times in repeated.items()
        if (j := jobs.get(by_tag[t])) is not None
        and j.finished_at is not None
        and any(c > j.finished_at + 0.001 for c in times)
    ]
    web = Counter((m.job_id, m.text) for m in messages if m.job_id)
    web_twice = sum(1 for n in web.values() if n > 1)
    unknown_jobs = {d.job_id for d in deliveries if d.status == "unknown"}
    tg: Counter[tuple[str, Any]] = Counter()
    for m in tg_sent:
        text = str(m.get("text") or m.get("caption") or "")
        for word in text.split():
            if word.startswith("j") and word[1:].isdigit():
                tg[(word, m.get("method"))] += 1
    tg_twice = [k for k, n in tg.items() if n > 1]
    tg_twice_beyond = [k for k in tg_twice if by_tag.get(k[0]) not in unknown_jobs]
    # arrived: a succeeded job's result in its chat (the fake's own count), every delivery
    # recorded as sent (or unknown: it may have arrived, an operator decides)
    tg_tags = {word for word, _method in tg}
    web_jobs = {m.job_id for m in messages if m.job_id}
    not_arrived = [
        t
        for t, jid in by_tag.items()
        if (j := jobs.get(jid)) is not None
        and j.status == "succeeded"
        and (t not in tg_tags if run.channel_of.get(t) == "telegram" else jid not in web_jobs)
    ]
    open_rows = [d for d in deliveries if d.status in ("pending", "sending", "failed")]
    # cron, per tick: every minute boundary from when the chains existed until shortly
    # before now (a fire needs a moment to be recorded, its run ~6 s) fires exactly once
    ticks_until = time.time() - 15
    fires = Counter((r.schedule_id, round(r.fire_at)) for r in runs if r.trigger == "cron")
    finished = {(r.schedule_id, round(r.fire_at)) for r in runs if r.status in CHAIN_DONE}
    first = (int(run.chains_at) // 60 + 1) * 60
    expected = [(c, t) for c in chains for t in range(first, int(ticks_until) + 1, 60)]
    missing = [k for k in expected if k not in finished]
    doubled = [k for k, n in fires.items() if n > 1]
    # chain steps: completed more than once per run, and after their run's outcome
    run_end = {
        (f"chain{chains.index(r.schedule_id)}", round(r.fire_at)): r.finished_at
        for r in runs
        if r.schedule_id in chains and r.trigger == "cron"
    }
    step_done = {t: c for t, c in done.items() if "@" in t}
    steps_twice = [t for t, c in step_done.items() if len(c) > 1]
    steps_after = [
        t
        for t, times in step_done.items()
        if (end_at := run_end.get((t.split("@")[0].rstrip("s"), int(t.split("@")[1]))))
        and any(c > end_at + 0.001 for c in times)
    ]
    failed = [j for j in jobs.values() if j.status == "failed"]
    # the flaky skill fails its first run on purpose; when the per-role circuit breaker has
    # tripped, that one run is all it gets (SPEC §7): not a fault's doing
    breaker = [j for j in failed if j.skill == "chaos_flaky" and j.error_type == "transient"]
    by_faults = [j for j in failed if j not in breaker]
    recovery = []
    worst: dict[str, float] = {}
    finishes = sorted(j.finished_at for j in jobs.values() if j.finished_at)
    for f in run.faults:
        nxt = next((t for t in finishes if t > f.at), None)
        if nxt is not None:
            recovery.append(nxt - f.at)
            worst[f.kind] = round(max(worst.get(f.kind, 0.0), nxt - f.at), 2)
    rerun = []
    for f in run.faults:
        if f.kind != "kill -9" or f.pid is None:
            continue
        victims = [
            a for a in attempts if a.outcome == "lost" and f":{f.pid}:" in (a.worker_id or "")
        ]
        for a in victims:
            nxt = next(
                (b for b in attempts if b.job_id == a.job_id and b.number == a.number + 1), None
            )
            if nxt is not None:
                rerun.append(nxt.started_at - f.at)
            elif jobs[a.job_id].status == "failed":
                rerun.append(float("inf"))
    causes = Counter(
        "missed heartbeats" if "heartbeats" in (a.error or "") else "lease expired"
        for a in attempts
        if a.outcome == "lost"
    )
    return {
        "jobs": len(by_tag),
        "dispatch retries (5xx / no answer)": run.retries,
        "dispatches refused": len(run.refusals),
        "succeeded": sum(j.status == "succeeded" for j in jobs.values()),
        "lost (never terminal)": len(lost),
        "executed twice (overlapping, or after the record)": len(
            set(overlapping) | set(after_record)
        ),
        "executions overlapping": len(overlapping),
        "completed more than once": len(repeated),
        "completed after its outcome was recorded": len(after_record),
        "delivered twice": web_twice + len(tg_twice_beyond),
        "web messages stored twice": web_twice,
        "telegram sent twice": len(tg_twice),
        "telegram sent twice beyond unknown": len(tg_twice_beyond),
        "deliveries not arrived at the end": len(not_arrived) + len(open_rows),
        "deliveries left unknown": len(unknown_jobs),
        "cron ticks expected": len(expected),
        "cron ticks missing": len(missing),
        "cron ticks doubled": len(doubled),
        "chain runs taken over (lost runs)": sum(r.lost_runs for r in runs),
        "chain runs failed": sum(r.status == "failed" for r in runs),
        "chain steps completed more than once": len(steps_twice),
        "chain steps completed after their run was recorded": len(steps_after),
        "failed because of faults": len(by_faults),
        "failed reasons": dict(Counter((j.error_type or "?") for j in by_faults)),
        "flaky jobs stopped by the circuit breaker": len(breaker),
        "faults": dict(Counter(f.kind for f in run.faults)),
        "recovery p50 s": _pct(recovery, 50),
        "recovery p99 s": _pct(recovery, 99),
        "recovery, worst by fault s": worst,
        "runs lost": dict(causes),
        "kill -9 re-runs": len(rerun),
        "kill -9 re-run p50 s": _pct(rerun, 50),
        "kill -9 re-run p99 s": _pct(rerun, 99),
    }


MUST_BE_ZERO = (
    "dispatches refused",
    "lost (never terminal)",
    "executed twice (overlapping, or after the record)",
    "completed after its outcome was recorded",
    "delivered twice",
    "web messages stored twice",
    "telegram sent twice beyond unknown",
    "deliveries not arrived at the end",
    "failed because of faults",
    "cron ticks missing",
    "cron ticks doubled",
    "chain steps completed after their run was recorded",
)


def table(run: Run, figures: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "∞" if v == float("inf") else f"{v:.2f}"
        if isinstance(v, dict):
            return ", ".join(f"{k}: {n}" for k, n in v.items()) or "—"
        return "—" if v is None else str(v)

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"\n## Chaos: {run.n_jobs} jobs, {run.duration:.0f} s of faults, {run.n_workers} workers"
        f" ({when})\n",
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; lease {run.lease:.0f} s,"
        " heartbeat 2.5 s; private PostgreSQL (initdb), private Redis, fake Telegram.\n",
        "| figure | value | must be 0 |",
        "|---|---|---|",
    ]
    for k, v in figures.items():
        flag = ("✅" if v == 0 else "❌") if k in MUST_BE_ZERO else ""
        lines.append(f"| {k} | {fmt(v)} | {flag} |")
    return "\n".join(lines) + "\n"


# --- main ------------------------------------------------------------------------------------


async def main(run: Run, results: Path | None, keep: bool = False) -> int:
    from pydantic import SecretStr

    from jobs.db import create_engine
    from jobs.migrate import upgrade
    from jobs.services import Services
    from jobs.settings import Settings

    sys.path.insert(0, str(ROOT))
    from tests.fakes.telegram import FakeTelegram

    tg = FakeTelegram()
    tg.known_chats.update(CHATS)
    tg.start()
    run.tg = tg
    svc = None
    try:
        await asyncio.to_thread(run.pg.start)
        await _admin(run, "CREATE DATABASE chaos")
        engine = create_engine(run.pg.url)
        await upgrade(engine)
        await engine.dispose()
        run.redis.start()
        skills = write_skills(run.root, run.completions)
        env = run.env(tg.url, skills)
        settings = Settings(  # type: ignore[call-arg]
            _env_file=None,
            database_url=run.pg.url,
            redis_url=run.redis.url,
            redis_prefix="chaos",
            queue_name="chaos:queue",
            skills_path=f"trusted={skills}",
            data_dir=run.root / "data",
            secret_key=SecretStr(SECRET),
        )
        svc = await Services.open(settings)
        run.chains_at = time.time()
        chains = await make_chains(run, svc)
        logs = run.root / "logs"
        logs.mkdir()
        run.web = Proc("web", ["web", "--port", str(run.web_port)], env, logs / "web.log")
        run.web.start()
        for n in range(run.n_workers):
            w = Proc(f"worker{n}", ["worker"], env, logs / f"worker{n}.log")
            w.start()
            run.workers.append(w)
        await _wait_http(f"http://127.0.0.1:{run.web_port}/healthz")
        run.t0 = time.time()
        await asyncio.gather(dispatch_all(run), fault_plan(run))
        await asyncio.sleep(max(0.0, run.t0 + run.duration - time.time()))
        await wait_drained(run, svc.sessionmaker, run.drain)
        await wait_delivered(run, svc.sessionmaker, run.drain / 2)
        figures = await account(run, svc.sessionmaker, list(tg.sent), chains)
    finally:
        if svc is not None:
            await svc.close()
        for p in [*run.workers, *([run.web] if run.web else [])]:
            p.kill()
        run.redis.stop()
        run.pg.stop()
        tg.stop()
    out = table(run, figures)
    print(out)
    print(json.dumps(figures, default=str))
    if results is not None:
        with results.open("a") as fh:
            fh.write(out)
    bad = [k for k in MUST_BE_ZERO if figures[k] != 0]
    if bad:
        print(f"NOT 0: {', '.join(bad)} (logs kept in {run.root})", file=sys.stderr)
        return 1
    if keep:
        print(f"logs kept in {run.root}", file=sys.stderr)
    else:
        shutil.rmtree(run.root, ignore_errors=True)
    return 0


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of faults")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--drain", type=float, default=180.0, help="seconds to wait for the rest")
    ap.add_argument("--results", default=str(ROOT / "bench" / "RESULTS.md"), help="'' to skip")
    ap.add_argument("--keep", action="store_true", help="keep the logs and data folder")
    args = ap.parse_args(argv)
    run = Run(args.duration, args.jobs, args.workers, args.seed, args.drain)
    # SIGTERM (a CI timeout) unwinds like Ctrl-C, so the private services are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    results = Path(args.results) if args.results else None
    return asyncio.run(main(run, results, args.keep))


if __name__ == "__main__":
    sys.exit(cli())
