"""Hostile marketplace skills on the real worker: each attack of a skill author against the
deployment ends with the skill getting nothing, a clear reason in the job record, and
nothing of the host sent anywhere (the skills are in ``tests/sandbox_skills``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from jobs.queue.dispatcher import Dispatcher
from tests.helpers.jobs import drain
from tests.helpers.real import job_json, tg_ctx
from tests.helpers.settings import make_settings

pytestmark = pytest.mark.integration

HOSTILE = Path(__file__).resolve().parents[2] / "sandbox_skills"
CANARY = "canary-secret-key-5cb1e0"
CHAT = "2077"

if shutil.which("bwrap") is None:  # pragma: no cover - CI installs bubblewrap
    pytest.skip("bubblewrap is not installed", allow_module_level=True)


@pytest.fixture
async def hostile(tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str, tg):  # type: ignore[no-untyped-def]
    """Services over a copy of the hostile skills (untrusted), Telegram at the fake server,
    a data dir holding a secret key file the way a deployment does."""
    from jobs.services import Services

    skills = tmp_path / "skills"
    shutil.copytree(HOSTILE, skills)
    (skills / "hostile_mode" / "run.sh").chmod(0o700)
    settings = make_settings(
        tmp_path,
        redis_url=redis_server_url,
        prefix=redis_prefix,
        database_url=sqlite_url,
        skills_path=str(skills),
        telegram_bot_token=tg.token,
        telegram_api_base=tg.url,
        worker_lease_sec=5.0,
        retry_backoff_sec=0.05,
    )
    secret = settings.data_dir / "secret.key"
    secret.write_text(CANARY)
    secret.chmod(0o600)
    builder = skills / "hostile_builder"
    (builder / "evilpkg" / "target.txt").write_text(str(secret))
    loot = (builder / "handler.py.in").read_text().replace("EVILPKG", str(builder / "evilpkg"))
    (builder / "handler.py").write_text(loot)
    (builder / "handler.py.in").unlink()
    tg.known_chats.add(CHAT)
    svc = await Services.open(settings)
    svc.test_secret = secret  # type: ignore[attr-defined]
    yield svc
    if svc.redis is not None:
        keys = [k async for k in svc.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await svc.redis.delete(*keys)
    await svc.close()


async def run(svc: Any, *runs: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Dispatch each ``(skill, input)`` to Telegram, drain with the real worker; the jobs."""
    ids = []
    for skill, inp in runs:
        res = await Dispatcher(svc).dispatch(skill, inp, tg_ctx(CHAT))
        assert res.status_code == 202, res.body
        ids.append(res.body["job_id"])
    await drain(svc)
    return [await job_json(svc, i) for i in ids]


def nothing_of_the_host_sent(tg: Any) -> None:
    sent = repr(tg.sent)
    assert CANARY not in sent
    assert "postgres" not in sent.lower()


def on_the_way(folder: str) -> set[str]:
    """Names in ``folder`` the sandbox shows because the interpreter is bound below them."""
    names = set()
    for prefix in {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}:
        if prefix.startswith(folder + "/"):
            names.add(prefix[len(folder) + 1 :].split("/")[0])
    return names


def alive_with(token: str) -> list[int]:
    """Host processes whose command line carries ``token``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if token.encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.slow
async def test_a_skill_reads_nothing_of_the_worker_the_data_dir_or_another_run(
    hostile: Any, tg: Any
) -> None:
    """``/proc/<worker>/environ``, the secret key, the data dir, another workspace and the
    environment of a run going on at the same time are out of reach."""
    from jobs.catalog.configs import ConfigStore

    svc = hostile
    secret = svc.test_secret
    other = svc.settings.resolved_workspace_root / "r2" / "s-other"
    other.mkdir(parents=True)
    (other / "theirs.txt").write_text("another org's file")
    held = f"held-credential-{uuid.uuid4().hex[:8]}"
    await ConfigStore(svc.sessionmaker, svc.box).set("r1", "hostile_holder", "HOLDER_KEY", held)
    targets = [
        f"/proc/{os.getpid()}/environ",
        str(secret),
        str(other / "theirs.txt"),
        str(svc.settings.data_dir / "skilljobs.db"),
        "/etc/shadow",
    ]
    inp = {
        "targets": targets,
        "list": [str(svc.settings.data_dir), "/root", "/home"],
        "wait_for": "holder_started",
    }
    holder, reader = await run(svc, ("hostile_holder", {}), ("hostile_reader", inp))
    assert holder["status"] == "succeeded", holder
    assert reader["status"] == "succeeded", reader
    got = reader["result"]
    assert got["uid"] == 65534
    assert all(got["found"][t] is None for t in targets), got["found"]
    assert got["found"]["/etc/shadow"] is None
    environs = json.dumps(got["environs"])
    assert held not in environs and CANARY not in environs and "SKILLJOBS_" not in environs
    assert set(got["environs"]) <= {"1", "2"}  # only its own pid namespace
    # only the empty folders bwrap makes on the way to what is bound (its workspace, the
    # interpreter): none of the host's files
    listed = got["listed"]
    assert listed[str(svc.settings.data_dir)] == ["workspaces"], listed
    for home in ("/root", "/home"):
        assert set(listed[home] or []) <= on_the_way(home), listed
    nothing_of_the_host_sent(tg)
    assert held not in repr(tg.sent)


@pytest.mark.slow
async def test_nothing_a_skill_starts_outlives_its_run_and_no_symlink_is_sent(
    hostile: Any, tg: Any
) -> None:
    """``setsid``, a double fork and ``nohup`` die with the run; the process that would swap
    the declared report for a symlink to the secret key is gone before it can."""
    token = str(int(time.time() * 1000) % 10**9)
    svc = hostile
    (job,) = await run(svc, ("hostile_leftover", {"token": token, "target": str(svc.test_secret)}))
    assert job["status"] == "succeeded", job
    assert alive_with(f".{token}") == []
    await asyncio.sleep(0.5)  # the swapper would have struck by now
    ws = svc.settings.resolved_workspace_root / "r1"
    reports = list(ws.rglob("report.txt"))
    assert reports and all(not p.is_symlink() for p in reports)
    texts = [m.get("caption") or m.get("text") or "" for m in tg.sent if m["chat_id"] == CHAT]
    assert texts, tg.sent
    nothing_of_the_host_sent(tg)


@pytest.mark.slow
async def test_the_worker_s_redis_and_postgresql_on_loopback_are_unreachable(
    hostile: Any, redis_server_url: str
) -> None:
    redis_port = urlsplit(redis_server_url).port or 6379
    targets = [
        ["127.0.0.1", redis_port],
        ["127.0.0.1", 5432],
        ["10.0.2.2", redis_port],  # slirp4netns's address of the host
        ["10.0.2.2", 5432],
        ["::1", redis_port],
    ]
    (job,) = await run(hostile, ("hostile_net", {"targets": targets}))
    assert job["status"] == "succeeded", job
    conns = job["result"]["connections"]
    assert all(v.startswith("refused") for v in conns.values()), conns
    # it has a network (user-mode, through slirp4netns), just not the host's loopback
    assert job["result"]["default_route"] is True


@pytest.mark.slow
async def test_the_worker_s_settings_are_never_a_skill_s_credentials(
    hostile: Any, tg: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``requires.env: [SKILLJOBS_SECRET_KEY]`` and an HTTP ``{SKILLJOBS_DATABASE_URL}``:
    ``needs_config``, never the worker's value; the skill never starts."""
    monkeypatch.setenv("SKILLJOBS_SECRET_KEY", CANARY)
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", "postgresql://u:canary-pw@127.0.0.1/db")
    env_job, http_job = await run(hostile, ("hostile_env", {}), ("hostile_http", {}))
    for job, name in ((env_job, "SKILLJOBS_SECRET_KEY"), (http_job, "SKILLJOBS_DATABASE_URL")):
        assert job["status"] == "failed", job
        assert job["error_type"] == "config", job
        assert job["result"]["needs_config"] == [name], job["result"]
        assert CANARY not in json.dumps(job) and "canary-pw" not in json.dumps(job)
    assert not list(hostile.settings.resolved_workspace_root.rglob("hostile_env_ran"))
    nothing_of_the_host_sent(tg)
    assert "canary-pw" not in repr(tg.sent)
    # nor can an operator configure one for a skill
    from jobs.catalog.configs import ConfigStore

    with pytest.raises(ValueError, match="SKILLJOBS_"):
        await ConfigStore(hostile.sessionmaker, hostile.box).set(
            "r1", "hostile_env", "SKILLJOBS_SECRET_KEY", "x"
        )


@pytest.mark.slow
async def test_an_entry_file_of_mode_0700_runs_sandboxed_never_as_the_worker(
    hostile: Any,
) -> None:
    (job,) = await run(hostile, ("hostile_mode", {}))
    assert job["status"] == "succeeded", job
    assert job["result"]["uid"] == 65534 != os.getuid()


@pytest.mark.slow
async def test_a_folder_swapped_for_a_symlink_changes_nothing_of_the_host(hostile: Any) -> None:
    """The chown race: a skill flips a workspace folder to a symlink to the data dir across
    runs. Nothing is ever chowned, and its swapper does not survive its run."""
    svc = hostile
    secret = svc.test_secret
    before = os.stat(secret)
    data_before = os.stat(svc.settings.data_dir)
    jobs = await run(
        svc,
        ("hostile_swap", {"target": str(svc.settings.data_dir)}),
        ("hostile_swap", {"target": str(svc.settings.data_dir)}),
    )
    assert [j["status"] for j in jobs] == ["succeeded", "succeeded"], jobs
    after = os.stat(secret)
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    d = os.stat(svc.settings.data_dir)
    assert (d.st_uid, d.st_mode) == (data_before.st_uid, data_before.st_mode)
    assert alive_with("mv sub.d sub") == []


@pytest.mark.slow
async def test_a_build_backend_reads_nothing_of_the_host(hostile: Any, tg: Any) -> None:
    """The PEP 517 backend of a local dependency runs while the environment is built: in
    the sandbox it cannot open the secret key."""
    (job,) = await run(hostile, ("hostile_builder", {}))
    assert job["status"] == "succeeded", job
    loot = job["result"]["loot"]
    assert loot.startswith("refused"), loot
    assert CANARY not in json.dumps(job)
    nothing_of_the_host_sent(tg)


def test_an_artifact_swapped_for_a_symlink_after_the_run_is_not_sent(tmp_path: Path) -> None:
    """The delivery race: the file was vetted, then swapped for a symlink to the secret key
    before a channel read it: the read refuses it."""
    from delivery.artifacts import collect
    from delivery.channels.base import read_file
    from delivery.errors import DeliveryPermanentError

    ws = tmp_path / "ws"
    ws.mkdir()
    secret = tmp_path / "secret.key"
    secret.write_text(CANARY)
    (ws / "report.txt").write_text("a harmless report")
    (art,) = collect({"filename": "report.txt"}, ws)
    assert read_file(art.local_path) == b"a harmless report"
    (ws / "report.txt").unlink()
    (ws / "report.txt").symlink_to(secret)
    with pytest.raises(DeliveryPermanentError, match="symlink"):
        read_file(art.local_path)
    # a folder on the way swapped for a symlink is refused as well
    (ws / "sub").mkdir()
    (ws / "sub" / "a.txt").write_text("mine")
    (art,) = collect({"filename": "sub/a.txt"}, ws)
    (ws / "sub").rename(ws / "sub.d")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "a.txt").write_text(CANARY)
    (ws / "sub").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DeliveryPermanentError, match="symlink"):
        read_file(art.local_path)
    # and a symlink declared by the result is never collected
    problems: list[dict[str, Any]] = []
    assert collect({"filename": "report.txt"}, ws, problems) == []
    assert problems and "outside" in problems[0]["reason"]
