"""In-process Python handlers (``execute(input, ctx)``) of an untrusted path on the real
worker: they run in the sandbox through the runner (``jobs.execution.sandbox_runner``),
never inside the worker — the worker's memory, ``/proc``, data dir and other workspaces
are out of reach and nothing they start outlives the run — with the contract of the
worker's own path: the result, ``call_skill`` answered by the worker, the failure envelope
of an exception with its traceback kept on the attempt (skills in
``tests/sandbox_handlers``)."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from jobs.execution import sandbox
from jobs.queue.dispatcher import Dispatcher
from tests.helpers.jobs import drain, job_and_attempts
from tests.helpers.real import job_json, tg_ctx
from tests.helpers.settings import make_settings

pytestmark = pytest.mark.integration

HANDLERS = Path(__file__).resolve().parents[2] / "sandbox_handlers"
CANARY = "canary-secret-key-0d41a7"
CHAT = "2078"

if shutil.which("bwrap") is None:  # pragma: no cover - CI installs bubblewrap
    pytest.skip("bubblewrap is not installed", allow_module_level=True)


@pytest.fixture
async def svc(tmp_path: Path, sqlite_url: str, redis_server_url: str, redis_prefix: str, tg):  # type: ignore[no-untyped-def]
    """Services over a copy of the handler skills (an untrusted path), a data dir holding a
    secret key file the way a deployment does."""
    from jobs.services import Services

    skills = tmp_path / "skills"
    shutil.copytree(HANDLERS, skills)
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
    tg.known_chats.add(CHAT)
    services = await Services.open(settings)
    services.test_secret = secret  # type: ignore[attr-defined]
    yield services
    if services.redis is not None:
        keys = [k async for k in services.redis.scan_iter(count=1000, match=f"{redis_prefix}*")]
        if keys:
            await services.redis.delete(*keys)
    await services.close()


async def run(svc: Any, *runs: tuple[str, dict[str, Any]]) -> list[str]:
    """Dispatch each ``(skill, input)`` to Telegram, drain with the real worker; job ids."""
    ids = []
    for skill, inp in runs:
        res = await Dispatcher(svc).dispatch(skill, inp, tg_ctx(CHAT))
        assert res.status_code == 202, res.body
        ids.append(res.body["job_id"])
    await drain(svc)
    return ids


def alive_with(token: str) -> list[int]:
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


def test_handlers_of_untrusted_paths_are_reported_sandboxed(tmp_path: Path) -> None:
    from jobs.catalog.loader import load_skill

    s = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=str(HANDLERS))
    mode, why = sandbox.run_mode(load_skill(HANDLERS / "handler_benign"), s)
    assert mode == "sandboxed" and "handler runs in the sandbox" in why
    trusted = make_settings(tmp_path, redis_url=None, prefix="t", skills_path=f"trusted={HANDLERS}")
    assert sandbox.run_mode(load_skill(HANDLERS / "handler_benign"), trusted)[0] == "trusted"


async def test_a_hostile_handler_reads_nothing_of_the_worker_and_leaves_nothing(
    svc: Any, tg: Any
) -> None:
    other = svc.settings.resolved_workspace_root / "r2" / "s-other"
    other.mkdir(parents=True)
    (other / "theirs.txt").write_text("another org's file")
    token = str(int(time.time() * 1000) % 10**9)
    targets = [
        f"/proc/{os.getpid()}/environ",
        str(svc.test_secret),
        str(other / "theirs.txt"),
        str(svc.settings.data_dir / "skilljobs.db"),
    ]
    inp = {"targets": targets, "list": [str(svc.settings.data_dir)], "token": token}
    (job_id,) = await run(svc, ("handler_reader", inp))
    job = await job_json(svc, job_id)
    assert job["status"] == "succeeded", job
    got = job["result"]
    assert got["uid"] == sandbox.SKILL_UID != os.getuid()
    assert got["pid"] != os.getpid()  # not the worker: a process of its own pid namespace
    assert all(got["found"][t] is None for t in targets), got["found"]
    environs = json.dumps(got["environs"])
    assert CANARY not in environs and "SKILLJOBS_" not in environs
    assert set(got["environs"]) <= {"1", "2", "3", "4", "5", "6"}  # its own pid namespace
    assert got["listed"][str(svc.settings.data_dir)] == ["workspaces"], got["listed"]
    assert alive_with(f"40.{token}") == [] and alive_with(f"41.{token}") == []
    assert CANARY not in repr(tg.sent)


async def test_a_benign_handler_returns_its_result_and_calls_another_skill(svc: Any) -> None:
    (job_id,) = await run(svc, ("handler_benign", {"amounts": [3, 4, 5]}))
    _job, attempts = await job_and_attempts(svc, job_id)
    data = await job_json(svc, job_id)
    assert data["status"] == "succeeded", data
    got = data["result"]
    assert got["total"] == 12 and got["role"] == "r1" and got["db"] == "None"
    assert got["doubled"] == {"ok": True, "y": 24}  # the worker ran the callee for it
    assert got["depth"] == 0
    ws = svc.settings.resolved_workspace_root / "r1"
    assert [p.read_text() for p in ws.rglob("total.txt")] == ["12"]  # its workspace, written
    assert "total is 12" in (attempts[-1].stdout_tail or "")  # what it printed, kept


async def test_a_raising_handler_fails_with_the_envelope_and_its_traceback(svc: Any) -> None:
    (job_id,) = await run(svc, ("handler_raiser", {"row": 7}))
    data = await job_json(svc, job_id)
    assert data["status"] == "failed", data
    assert data["result"]["ok"] is False
    assert data["result"]["error"] == "skill 'handler_raiser' raised ValueError: bad ledger row 7"
    _job, attempts = await job_and_attempts(svc, job_id)
    last = attempts[-1]
    assert "parsing the ledger" in (last.stdout_tail or "")
    tb = last.stderr_tail or ""
    assert "Traceback" in tb and "in parse_row" in tb and "ValueError: bad ledger row 7" in tb


async def test_db_factory_in_the_sandbox_is_a_config_error(svc: Any) -> None:
    (job_id,) = await run(svc, ("handler_db", {}))
    data = await job_json(svc, job_id)
    assert data["status"] == "failed", data
    assert data["error_type"] == "config", data
    assert "no business database is mapped" in data["result"]["error"]


async def test_without_a_sandbox_an_untrusted_handler_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bwrap to be found: refused with ``config``, never run as the worker."""
    from jobs.catalog.loader import load_registry
    from jobs.execution.executor import Executor

    marker = tmp_path / "skills" / "handler_marker"
    marker.mkdir(parents=True)
    (marker / "SKILL.md").write_text("---\nname: handler_marker\ndescription: d\n---\n# m\n")
    ran = tmp_path / f"ran-{uuid.uuid4().hex[:6]}"
    (marker / "handler.py").write_text(
        f"def execute(input_data):\n    open({str(ran)!r}, 'w').close()\n    return {{}}\n"
    )
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    settings = make_settings(tmp_path, redis_url=None, prefix="t")
    ex = Executor(
        settings=settings,
        registry=load_registry([tmp_path / "skills"]),
        sessionmaker=None,
        box=None,
    )
    out = await ex.execute("handler_marker", {}, {"role_id": "r1", "session_id": "s1"})
    await ex.aclose()
    assert out.status == "failed" and out.error_type == "config", out.result
    assert "bubblewrap" in str(out.error)
    assert not ran.exists()
