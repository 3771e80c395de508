"""Isolation, tried as an attacker would: nothing a chat input, a skill or a Redis writer
does reaches beyond its own job. Each test runs the real thing (executor, subprocess,
arq worker, Redis) and checks for the effect an attack would have."""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
import uuid
from pathlib import Path

import pytest

from jobs.catalog.loader import load_registry
from jobs.crypto import SecretBox
from jobs.db import create_engine, create_sessionmaker
from jobs.execution.executor import Executor
from tests.helpers.settings import EXEC_FIXTURES, make_settings

KEY = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
CTX = {"role_id": "r1", "session_id": "s1", "org_id": "o1", "channel": "web"}


@pytest.fixture(scope="module")
def registry():  # type: ignore[no-untyped-def]
    reg = load_registry([EXEC_FIXTURES])
    assert not reg.errors(), reg.errors()
    return reg


@pytest.fixture
async def ex(tmp_path: Path, sqlite_url: str, registry):  # type: ignore[no-untyped-def]
    settings = make_settings(
        tmp_path,
        redis_url=None,
        prefix="t",
        skill_env_passthrough=(
            "SJT_ISO_ALLOWED, bad name, iso_env:SJT_ISO_MINE, other:SJT_ISO_THEIRS, "
            "SKILLJOBS_API_TOKEN"
        ),
    )
    engine = create_engine(sqlite_url)
    executor = Executor(
        settings=settings,
        registry=registry,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(KEY),
    )
    yield executor
    await executor.aclose()
    await engine.dispose()


# --- a Redis writer ------------------------------------------------------------------------


class _Boom:
    """What an attacker plants: unpickling it would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.slow
async def test_a_pickle_planted_in_the_queue_runs_nothing(
    services, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crafted pickle written by a plain Redis client is dropped and logged; no code runs."""
    from arq.constants import job_key_prefix
    from redis.asyncio import Redis

    from tests.helpers.jobs import drain

    marker = tmp_path / "pwned"
    planted = f"planted-{uuid.uuid4().hex[:12]}"  # arq's keys are not namespaced per test
    payload = pickle.dumps(
        {"t": 1, "f": "skilljobs.run", "a": [_Boom(marker)], "k": {}, "et": 1}, protocol=4
    )
    plain = Redis.from_url(services.settings.redis_url)
    try:
        await plain.set(job_key_prefix + planted, payload)
        await plain.zadd(services.settings.queue_name, {planted: 1})
        with caplog.at_level(logging.ERROR):
            await drain(services)
        assert not marker.exists()
        assert not await plain.exists(job_key_prefix + planted)
        assert await plain.zcard(services.settings.queue_name) == 0
    finally:
        await plain.aclose()
    assert any(planted in r.getMessage() and "dropped" in r.getMessage() for r in caplog.records)


# --- a skill reading its environment -------------------------------------------------------


async def test_subprocess_skill_sees_only_its_environment(
    ex: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A canary in the worker's environment never reaches a skill that prints its env; the
    declared, the configured, the passthrough and the protocol variables do."""
    monkeypatch.setenv("SJT_ISO_CANARY", "canary-value-91")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-aws-92")
    monkeypatch.setenv("PGPASSWORD", "canary-pg-93")
    monkeypatch.setenv("SKILLJOBS_API_TOKEN", "canary-token-94")
    monkeypatch.setenv("SJT_ISO_ALLOWED", "passed-through")
    monkeypatch.setenv("SJT_ISO_MINE", "mapped-to-this-skill")
    monkeypatch.setenv("SJT_ISO_THEIRS", "canary-other-skill-95")
    monkeypatch.setenv("SJT_ISO_DECLARED", "declared-from-env")  # never a skill's config
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    out = await ex.execute("iso_env", {"q": 1}, dict(CTX))
    assert out.result["needs_config"] == ["SJT_ISO_DECLARED"], out.result
    assert "or the environment" not in (out.error or "")
    ctx = dict(CTX, skill_configs={"iso_env": {"SJT_ISO_DECLARED": "from-config"}})
    out = await ex.execute("iso_env", {"q": 1}, ctx)
    assert out.status == "succeeded", out.result
    env = out.result["env"]
    text = json.dumps(env)
    for canary in (
        "canary-value-91",
        "canary-aws-92",
        "canary-pg-93",
        "canary-token-94",
        "canary-other-skill-95",
    ):
        assert canary not in text
    assert env["SJT_ISO_ALLOWED"] == "passed-through"
    assert env["SJT_ISO_MINE"] == "mapped-to-this-skill"  # a per-skill mapping
    assert env["SJT_ISO_DECLARED"] == "from-config"
    assert env["LC_ALL"] == "C.UTF-8" and env["PATH"]
    ws = str(ex.workspace_root / "r1" / "s1")
    assert env["HOME"] == ws and env["SKILL_WORKSPACE"] == ws
    assert json.loads(env["SKILL_INPUT"]) == {"q": 1}
    allowed = {"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONIOENCODING", "PWD"}
    allowed |= {"SJT_ISO_ALLOWED", "SJT_ISO_MINE", "SJT_ISO_DECLARED", "SHLVL", "_"}
    extra = {k for k in env if k not in allowed and not k.startswith(("SKILL_", "LC_"))}
    assert not extra, extra


# --- a chat input naming a file ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("path", "/etc/hostname"),
        ("path", "../../../secret.key"),
        ("path", "/proc/self/environ"),
        ("doc", "/etc/passwd"),  # schema format: path
        ("source_file", "/proc/self/environ"),
        ("image", "/etc/hostname"),  # a media field holding a path
        ("path", "~root/.bashrc"),
    ],
)
async def test_file_parameters_outside_the_workspace_are_refused(
    ex: Executor, field: str, value: str
) -> None:
    out = await ex.execute("iso_read", {field: value}, dict(CTX))
    assert out.status == "failed"
    assert out.result["error_type"] == "recoverable" and out.result["field"] == field
    assert out.result["need_param"] == [field]  # names the field, as dispatch refusals do
    assert field in out.result["error"] and "text" not in out.result


async def test_a_symlink_out_of_the_workspace_is_refused(ex: Executor) -> None:
    ws = ex.workspace_root / "r1" / "s1"
    ws.mkdir(parents=True, exist_ok=True)
    (ws / "link.txt").symlink_to("/etc/hostname")
    (ws / "mine.txt").write_text("my own file")
    out = await ex.execute("iso_read", {"path": "link.txt"}, dict(CTX))
    assert out.status == "failed" and out.result["field"] == "path"
    out = await ex.execute("iso_read", {"path": "mine.txt"}, dict(CTX))
    assert out.result == {"ok": True, "text": "my own file"}
    out = await ex.execute("iso_read", {"path": str(ws / "mine.txt")}, dict(CTX))
    assert out.result["text"] == "my own file"


async def test_another_roles_workspace_is_refused(ex: Executor) -> None:
    other = ex.workspace_root / "r2" / "s9"
    other.mkdir(parents=True)
    (other / "theirs.txt").write_text("not yours")
    for value in (str(other / "theirs.txt"), "../../r2/s9/theirs.txt"):
        out = await ex.execute("iso_read", {"path": value}, dict(CTX))
        assert out.status == "failed" and out.result["field"] == "path", value


async def test_a_current_attachment_may_be_outside(ex: Executor, tmp_path: Path) -> None:
    upload = tmp_path / "uploads" / "a.txt"
    upload.parent.mkdir()
    upload.write_text("uploaded")
    ctx = dict(CTX, attachments=[{"type": "file", "local_path": str(upload)}])
    out = await ex.execute("iso_read", {"path": str(upload)}, ctx)
    assert out.result == {"ok": True, "text": "uploaded"}
    out = await ex.execute("iso_read", {"path": str(upload)}, dict(CTX))
    assert out.status == "failed"


def test_confinement_rules(tmp_path: Path) -> None:
    from jobs.execution.inputs import Refused, confine

    ws = tmp_path / "ws"
    ws.mkdir()
    ok = [
        {"path": "a/b.csv", "message": "see /etc/passwd for details"},
        {"url": "https://example.com/x", "file": "data:text/plain,hi"},
        {"output": "json", "input": "a prompt / with a slash", "text": "/start"},
        {"files": [{"filename": "x.png", "caption": "hello"}]},
        {"query": "/", "separator": "/", "marker": "/tmp/anything"},
        {"image": "/imagine a cat on the moon"},
    ]
    for data in ok:
        confine(data, workspace=str(ws))
    bad = [
        ({"files": [{"local_path": "/etc/hosts"}]}, "files[0].local_path"),
        ({"report_path": "/var/log/x.log"}, "report_path"),
        ({"image": "../../x.png"}, "image"),
        ({"attach": ["/etc/hostname"]}, "attach[0]"),
        ({"opts": {"config_file": "/etc/hostname"}}, "opts.config_file"),
    ]
    for data, field in bad:
        with pytest.raises(Refused) as exc:
            confine(data, workspace=str(ws))
        assert exc.value.field == field
    # without a workspace: plain relative names only
    confine({"path": "x.txt"}, workspace=None)
    with pytest.raises(Refused):
        confine({"path": "/etc/hostname"}, workspace=None)


# --- a skill pretending to be another role ---------------------------------------------------


async def test_call_skill_identity_is_bound_when_it_is_created(
    tmp_path: Path, sessionmaker, registry
) -> None:
    """A skill that rewrites ``ctx["role_id"]`` before ``call_skill`` still gets its own
    role's callee configs, never the other role's."""
    from jobs.catalog.configs import ConfigStore

    settings = make_settings(tmp_path, redis_url=None, prefix="t")
    ex = Executor(
        settings=settings, registry=registry, sessionmaker=sessionmaker, box=SecretBox(KEY)
    )
    try:
        store = ConfigStore(sessionmaker, SecretBox(KEY))
        await store.replace("r1", "callee_cfg", {"api_key": "mine-123456", "region": "r1-region"})
        await store.replace("r_other", "callee_cfg", {"api_key": "theirs-654321", "region": "x"})
        out = await ex.execute("iso_role", {"as_role": "r_other"}, dict(CTX))
        assert out.status == "succeeded", out.result
        assert out.result["region"] == "r1-region" and out.result["api_key_len"] == 11
        assert "theirs" not in json.dumps(out.result)
    finally:
        await ex.aclose()


@pytest.mark.slow
async def test_a_forged_cancel_message_changes_nothing(services) -> None:
    """Publishing a job id on the cancel channel (any Redis writer can) does not stop the
    job: only a job whose row says ``cancel_requested`` is cancelled."""
    import asyncio

    from redis.asyncio import Redis

    from jobs.constants import CANCEL_CHANNEL
    from jobs.queue.worker import build_worker
    from tests.helpers.jobs import dispatch, wait_status

    job_id = await dispatch(services, "bg_sleep", {"seconds": 1.5})
    w = build_worker(services, handle_signals=False, scheduler=False)
    task = asyncio.create_task(w.async_run())
    plain = Redis.from_url(services.settings.redis_url)
    try:
        await wait_status(services, job_id, {"running"})
        channel = services.settings.key(CANCEL_CHANNEL)
        for _ in range(5):
            await plain.publish(channel, job_id)
            await asyncio.sleep(0.1)
        job = await wait_status(
            services, job_id, {"succeeded", "cancelled", "failed", "timed_out"}, limit=60
        )
        # (on a loaded machine the run may end otherwise; never as a cancel)
        assert job.status != "cancelled" and "cancel" not in (job.error or ""), job.error
    finally:
        await plain.aclose()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await w.close()


@pytest.mark.slow
async def test_a_forged_live_push_reaches_no_web_session(sessionmaker, redis, settings) -> None:
    """A message published on a session's live channel by a plain Redis client is not a
    stored message: a listener with the database drops it and passes on only what is
    stored; one without is given the stored-message fields only."""
    import asyncio

    from delivery.channels import web
    from jobs.constants import SESSION_EVENTS

    await web.ensure_session(sessionmaker, "s-live", role_id="r1", channel="web")
    channel = settings.key(SESSION_EVENTS, "s-live")
    got: list[dict] = []
    reduced: list[dict] = []

    async def consume(into: list[dict], want: int, **kw: object) -> None:
        async for msg in web.listen(redis, settings, "s-live", **kw):  # type: ignore[arg-type]
            into.append(msg)
            if len(into) == want:
                return

    tasks = [
        asyncio.create_task(consume(got, 1, sessionmaker=sessionmaker)),
        asyncio.create_task(consume(reduced, 2)),
    ]
    deadline = time.monotonic() + 15  # both listening (a push before that is lost)
    while (await redis.pubsub_numsub(channel))[0][1] < 2:
        assert time.monotonic() < deadline, "the listeners never subscribed"
        await asyncio.sleep(0.01)
    forged = {"id": 424242, "text": "click", "attachments": [], "created_at": 1, "html": "<b>"}
    await redis.publish(channel, json.dumps(forged))
    await redis.publish(channel, json.dumps({"id": "x", "html": "<script>"}))
    await redis.publish(channel, "not json")
    await asyncio.sleep(0.2)
    assert got == []
    stored = await web.post_message(sessionmaker, redis, settings, "s-live", "real", [])
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert got == [stored]
    assert reduced == [
        {"id": 424242, "text": "click", "attachments": [], "created_at": 1.0, "job_id": None},
        stored,
    ]


# --- inputs are data -----------------------------------------------------------------------


def _deep(n: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(n):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("inp", "ctx_extra", "needle"),
    [
        ({"api_key": {"$enc": "x"}}, {}, "'$enc' is reserved"),
        ({"q": [{"$enc": "gAAAA"}]}, {}, "'$enc' is reserved"),
        ({}, {"api_token": {"$enc": "x"}}, "'$enc' is reserved"),
        (_deep(500), {}, "deeper than 64"),
        ({"n": float("nan")}, {}, "not a finite number"),
        ({"n": [1, float("inf")]}, {}, "not a finite number"),
    ],
)
@pytest.mark.slow
async def test_inputs_that_are_not_plain_data_are_refused_at_dispatch(
    services, inp: dict, ctx_extra: dict, needle: str
) -> None:
    from jobs.queue.dispatcher import Dispatcher

    ctx = {"channel": "web", "role_id": "r1", "session_id": "s1", **ctx_extra}
    res = await Dispatcher(services).dispatch("sync_echo", inp, ctx)
    assert res.status_code == 400, res.body
    assert needle in res.body["error"]


def test_nesting_up_to_the_limit_is_data() -> None:
    from jobs.execution.inputs import shape_problem

    assert shape_problem(_deep(63), "input") is None
    assert shape_problem(_deep(64), "input") is not None
    assert shape_problem({"enc": "x", "n": 1.5, "t": (1, 2)}, "input") is None


async def test_a_session_id_with_shell_syntax_runs_nothing(ex: Executor, tmp_path: Path) -> None:
    """The id becomes a safe path segment (others are hashed) and every value put into an
    inline shell command is quoted."""
    marker = tmp_path / "ran"
    for session in (f"s;touch {marker};", f"$(touch {marker})", f"`touch {marker}`"):
        out = await ex.execute("iso_inline", {}, dict(CTX, session_id=session))
        assert out.status == "succeeded", out.result
        assert not marker.exists(), session
        pwd = Path(out.result["pwd"])
        assert pwd.parent == ex.workspace_root / "r1"
        assert all(c.isalnum() or c in "._-" for c in pwd.name), pwd.name
    # a workspace handed in by the caller is quoted too
    odd = tmp_path / f"w;touch {marker.name}"
    odd.mkdir()
    out = await ex.execute("iso_inline", {}, dict(CTX, workspace_dir=str(odd)))
    assert out.status == "succeeded" and Path(out.result["pwd"]) == odd
    assert not (odd / marker.name).exists() and not marker.exists()


def test_ids_as_path_segments(tmp_path: Path) -> None:
    from jobs.context import workspace_dir

    assert workspace_dir(tmp_path, "r1", "abc-1.2_x") == tmp_path / "r1" / "abc-1.2_x"
    a = workspace_dir(tmp_path, "r1", "a/b")
    b = workspace_dir(tmp_path, "r1", "a_b")
    assert a is not None and b is not None and a != b
    assert a.parent == tmp_path / "r1" and a.name.startswith("a_b-")
    for odd in ("..", ".", "x y", "é", "$(id)"):
        seg = workspace_dir(tmp_path, "r1", odd)
        assert seg is not None and seg.parent == tmp_path / "r1"
        assert all((c.isalnum() and c.isascii()) or c in "._-" for c in seg.name)


# --- Redis with a password ------------------------------------------------------------------


async def test_the_embedded_redis_refuses_clients_without_its_password(
    tmp_path: Path, redis_server_url: str
) -> None:
    import redis
    from redis.asyncio import Redis

    from jobs.cli.checks import Status, check_redis_auth
    from jobs.cli.embedded import EmbeddedRedis, redis_password

    secret = tmp_path / "data" / "redis.password"
    password = redis_password(secret)
    assert secret.stat().st_mode & 0o777 == 0o600 and redis_password(secret) == password
    with EmbeddedRedis(tmp_path / "redis", persist=False, password=password) as server:
        conf = tmp_path / "redis" / "redis.conf"
        assert conf.stat().st_mode & 0o777 == 0o600
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()  # type: ignore[union-attr]
        assert password.encode() not in cmdline  # not visible in ps
        anonymous = Redis(port=server.port)
        try:
            with pytest.raises(redis.AuthenticationError):
                await anonymous.ping()
        finally:
            await anonymous.aclose()
        authed = Redis.from_url(server.url)
        try:
            assert await authed.ping()
        finally:
            await authed.aclose()
        settings = make_settings(tmp_path, redis_url=server.url, prefix="t")
        check = await check_redis_auth(settings, timeout_sec=5)
        assert check is not None and check.status is Status.OK
    # doctor warns about a Redis that answers anyone
    open_redis = make_settings(tmp_path, redis_url=redis_server_url, prefix="t")
    check = await check_redis_auth(open_redis, timeout_sec=5)
    assert check is not None
    if "@" not in redis_server_url:  # the test server has no password
        assert check.status is Status.WARN
        assert "without a password" in check.detail and check.fix


# --- HTTP skills ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_an_http_skill_cannot_be_pointed_at_another_host(
    tmp_path: Path, sqlite_url: str, registry
) -> None:
    """Configs win over the input for every placeholder; the scheme, host, port and path
    prefix never come from the input; the request passes the outbound policy. The other
    server never sees a connection, let alone the configured token."""
    from tests.exec_fixtures.fake_api import FakeAPI, Running

    settings = make_settings(tmp_path, redis_url=None, prefix="t", fetch_allow_hosts="127.0.0.1")
    engine = create_engine(sqlite_url)
    ex = Executor(
        settings=settings,
        registry=registry,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(KEY),
    )
    try:
        async with Running(FakeAPI()) as api, Running(FakeAPI(key="none")) as evil:
            cfg = {"api_token": api.key, "base": api.url}
            ctx = dict(CTX, skill_configs={"http_get": cfg})
            # an input "base" does not replace the configured one
            r = await ex.run("http_get", {"base": evil.url, "item_id": "7"}, ctx)
            assert r["id"] == "7" and len(api.requests) == 1
            # an input may not supply the scheme and host at all
            only_token = dict(CTX, skill_configs={"http_get": {"api_token": api.key}})
            out = await ex.execute("http_get", {"base": evil.url, "item_id": "7"}, only_token)
            assert out.status == "failed" and "scheme and host" in (out.error or "")
            # nor climb out of the configured path
            out = await ex.execute("http_get", {"item_id": ".."}, ctx)
            assert out.status == "failed" and "'..'" in (out.error or "")
            r = await ex.run("http_get", {"item_id": "../../admin"}, ctx)
            assert api.requests[-1]["path"].startswith("/items/")
            assert evil.requests == []
            assert api.key not in json.dumps([e["headers"] for e in evil.requests])
        # a host outside the outbound policy is refused before any connection
        async with Running(FakeAPI()) as internal:
            strict = Executor(
                settings=make_settings(tmp_path, redis_url=None, prefix="u"),
                registry=registry,
                sessionmaker=None,
                box=SecretBox(KEY),
            )
            try:
                cfg = {"api_token": internal.key, "base": internal.url}
                out = await strict.execute(
                    "http_get", {"item_id": "1"}, dict(CTX, skill_configs={"http_get": cfg})
                )
            finally:
                await strict.aclose()
            assert out.status == "failed" and "outbound policy" in (out.error or "")
            assert out.result["error_type"] == "config" and internal.requests == []
    finally:
        await ex.aclose()
        await engine.dispose()


# --- db_factory is not the job store --------------------------------------------------------


async def test_db_factory_is_the_business_database_not_the_job_store(
    ex: Executor, sqlite_url: str
) -> None:
    """A skill's sessions reach ``SKILLJOBS_SKILL_DATABASE_URL`` (default a separate SQLite
    file), where skilljobs's own tables (jobs, skill_configs) do not exist."""
    from sqlalchemy import text

    # sessions exist only inside the worker: the operator trusts this folder (an untrusted
    # handler runs sandboxed, without a database: test_sandbox_inprocess.py)
    ex.settings = ex.settings.model_copy(update={"trusted_skills": str(EXEC_FIXTURES)})
    out = await ex.execute("iso_db", {}, dict(CTX))
    assert out.status == "succeeded", out.result
    r = out.result
    assert r["jobs"].startswith("ERR") and r["configs"].startswith("ERR")
    assert r["lazy"] == 1 and r["url"].endswith("skills.db") and r["platform"] is False
    async with ex.sessionmaker() as s:  # the job store is untouched and still there
        assert (await s.execute(text("select count(*) from jobs"))).scalar() == 0
        tables = (await s.execute(text("select name from sqlite_master"))).scalars().all()
    assert "notes" not in tables and sqlite_url.endswith(".db")


def test_bundled_delivery_skills_alone_get_the_job_store(tmp_path: Path) -> None:
    from jobs.execution.executor import _is_bundled
    from jobs.settings import BUNDLED_SKILLS
    from jobs.skill import Skill

    assert _is_bundled(Skill(name="send_message", path=BUNDLED_SKILLS / "send_message"))
    assert not _is_bundled(Skill(name="iso_db", path=EXEC_FIXTURES / "iso_db"))
    assert not _is_bundled(Skill(name="x", path=tmp_path))


# --- untrusted skills run in the sandbox ---------------------------------------------------------


async def test_a_sandboxed_skill_reads_nothing_of_the_host_and_nothing_is_chowned(
    sqlite_url: str, registry
) -> None:
    """A skill of a test folder (untrusted) runs in bubblewrap as an unprivileged id: it cannot
    read the secret key, the database file, another workspace or the worker's environment;
    it writes its workspace and its private /tmp; what it wrote belongs to the worker without
    any ``chown``."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="sjt-iso-"))
    try:
        settings = make_settings(base, redis_url=None, prefix="t")
        data = settings.data_dir
        for name, text in (("secret.key", "canary-key"), ("skilljobs.db", "canary-db")):
            (data / name).write_text(text)
            (data / name).chmod(0o600)
        engine = create_engine(sqlite_url)
        ex = Executor(
            settings=settings,
            registry=registry,
            sessionmaker=create_sessionmaker(engine),
            box=SecretBox(KEY),
        )
        try:
            ws_other = ex.workspace_root / "r2" / "s9"
            first = await ex.execute(
                "iso_probe", {"targets": ["/dev/null"]}, dict(CTX, role_id="r2", session_id="s9")
            )
            assert first.status == "succeeded", first.result
            assert (ws_other / "mine.txt").stat().st_uid == os.getuid()  # no hand-over
            targets = [
                str(data / "secret.key"),
                str(data / "skilljobs.db"),
                str(ws_other / "mine.txt"),
                f"/proc/{os.getpid()}/environ",
                "/dev/null",
            ]
            out = await ex.execute("iso_probe", {"targets": targets}, dict(CTX))
            assert out.status == "succeeded", out.result
            r = out.result
            assert r["uid"] == 65534
            assert [r[f"r{i}"] for i in range(5)] == [False, False, False, False, True]
            assert r["ws"] is True and r["tmp"] is True and r["skill_dir"] is False
            assert r["tmpdir"] == "/tmp"
            ws = ex.workspace_root / "r1" / "s1"
            assert (ws / "mine.txt").stat().st_uid == os.getuid()
            assert (data / "secret.key").stat().st_mode & 0o777 == 0o600
        finally:
            await ex.aclose()
            await engine.dispose()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_worker_is_not_dumpable() -> None:
    """``make_undumpable`` is what the worker and web processes call at start: a process of
    the same user can then not read their environment or memory."""
    import subprocess
    import sys

    code = (
        "from jobs.privileges import is_dumpable, make_undumpable;"
        "before = is_dumpable(); ok = make_undumpable(); print(before, ok, is_dumpable())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True", "False"], done.stderr


async def test_the_bwrap_sandbox_shows_only_the_system_and_the_workspace(
    tmp_path: Path, sqlite_url: str, registry
) -> None:
    """``SKILLJOBS_SANDBOX=bwrap`` (the default): the data dir and the other workspaces are
    not there inside the sandbox, the system is read-only, no worker process is visible; an
    unknown mode is refused, never run unsandboxed."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    settings = make_settings(tmp_path, redis_url=None, prefix="t", sandbox="bwrap")
    data = settings.data_dir
    (data / "secret.key").write_text("canary-key")
    engine = create_engine(sqlite_url)
    ex = Executor(
        settings=settings,
        registry=registry,
        sessionmaker=create_sessionmaker(engine),
        box=SecretBox(KEY),
    )
    try:
        other = ex.workspace_root / "r2" / "s9"
        other.mkdir(parents=True)
        (other / "theirs.txt").write_text("not yours")
        targets = [
            str(data / "secret.key"),
            str(other / "theirs.txt"),
            f"/proc/{os.getpid()}/environ",
            "/etc/hostname",
        ]
        out = await ex.execute("iso_probe", {"targets": targets}, dict(CTX))
        if out.status == "failed" and "bwrap" in (out.error or ""):
            pytest.skip(f"bubblewrap cannot run here: {out.error}")
        assert out.status == "succeeded", out.result
        r = out.result
        assert [r[f"r{i}"] for i in range(4)] == [False, False, False, True]
        assert r["ws"] is True and r["tmp"] is True and r["skill_dir"] is False
        assert r["tmpdir"] == "/tmp"
        assert (ex.workspace_root / "r1" / "s1" / "mine.txt").exists()
        bad = make_settings(tmp_path, redis_url=None, prefix="t", sandbox="jail")
        ex.settings = bad
        out = await ex.execute("iso_probe", {"targets": []}, dict(CTX))
        assert out.status == "failed" and "SKILLJOBS_SANDBOX" in (out.error or "")
        assert out.result["error_type"] == "config"
    finally:
        await ex.aclose()
        await engine.dispose()


@pytest.mark.slow
async def test_the_dispatch_endpoint_refuses_what_is_not_plain_data(services) -> None:
    """The same refusals over HTTP: a 4xx with an error envelope, never a 500."""
    import httpx
    from pydantic import SecretStr

    from dashboard.app import create_app

    services.settings.api_token = SecretStr("iso-token-0123456789abcdef0123456789")
    app = create_app(services.settings, services=services)
    ctx = {"channel": "web", "role_id": "r1", "session_id": "s1"}
    deep = "[" * 500 + "]" * 500
    head = '{"skill": "sync_echo", "context": ' + json.dumps(ctx)
    bodies = [
        head + ', "input": {"n": NaN}}',
        head + ', "input": {"d": ' + deep + "}}",
        json.dumps({"skill": "sync_echo", "input": {"k": {"$enc": "x"}}, "context": ctx}),
    ]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://127.0.0.1",
        headers={
            "authorization": "Bearer iso-token-0123456789abcdef0123456789",
            "content-type": "application/json",
        },
    ) as client:
        for body in bodies:
            resp = await client.post("/api/v1/dispatch", content=body)
            # 400 from the dispatcher, or 422 when the request layer refuses it first
            assert resp.status_code in (400, 422), (body[:60], resp.status_code, resp.text)
            assert resp.json()["ok"] is False


def test_data_shaped_like_a_sealed_value_is_never_decrypted() -> None:
    """User data is never unsealed: look-alikes survive a seal/unseal round trip as the
    data they are; values this key sealed are kept and decrypted."""
    box = SecretBox(KEY)
    other = SecretBox(b"Jf3yqkYl8b1m6p8hHn2mH0cKdCmQ4R1y5p6wXy4j3TQ=")
    forged = other.encrypt("theirs")
    data = {
        "a": {"$enc": "x"},
        "b": [{"$enc": "gAAAAAforged"}, {"$lit": {"z": 1}}, {"$lit": 5}],
        "c": forged,
        "api_key": {"$enc": "y"},
        "token": "plain-secret",
    }
    sealed = box.seal(data)
    assert sealed["token"] != "plain-secret" and box.ours(sealed["token"])
    assert box.unseal(sealed) == data
    assert box.unseal(box.seal({"token": sealed["token"]})) == {"token": "plain-secret"}
