"""The CLI as an operator scripts it: it finds the instance `up` left in the data dir,
prints JSON (--json) or tab-separated lines when piped, and turns unreachable or
misconfigured services into two lines naming the setting (exit 2)."""

from __future__ import annotations

import json
import os
import stat

import pytest
from typer.testing import CliRunner

from jobs.cli.app import app
from jobs.cli.state import STATE_FILE, read_state
from tests.helpers.settings import JOB_SKILLS

pytestmark = pytest.mark.integration


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("SKILLJOBS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    return tmp_path / "data"


def _write_state(data_dir, **fields) -> None:
    from jobs.cli.embedded import write_private

    write_private(data_dir / STATE_FILE, json.dumps({"pid": os.getpid(), **fields}))


def run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.slow
def test_state_file_alone_is_enough(clean_env, sqlite_url, redis_server_url, monkeypatch):
    """Only SKILLJOBS_DATA_DIR set: database, Redis and skills path come from state.json."""
    prefix = f"sjt-state-{os.getpid()}"
    monkeypatch.setenv("SKILLJOBS_REDIS_PREFIX", prefix)
    monkeypatch.setenv("SKILLJOBS_QUEUE_NAME", f"{prefix}:queue")
    _write_state(
        clean_env,
        database_url=sqlite_url,
        redis_url=redis_server_url,
        skills_path=str(JOB_SKILLS),
        web_url="http://127.0.0.1:8000",
    )
    skills = run("skills", "list", "--json")
    assert skills.exit_code == 0, skills.output
    assert "bg_sleep" in {s["name"] for s in json.loads(skills.output)["items"]}
    sent = run("dispatch", "bg_sleep", "-i", '{"seconds": 0}', "-c", "telegram", "--actor-key", "a")
    assert sent.exit_code == 0, sent.output
    job_id = json.loads(sent.output)["job_id"]
    listed = json.loads(run("jobs", "list", "--json").output)
    assert [j["id"] for j in listed["items"]] == [job_id]
    assert listed["items"][0]["status"] == "queued"
    assert json.loads(run("jobs", "show", job_id, "--json").output)["skill"] == "bg_sleep"


def test_a_set_variable_wins_and_a_dead_instance_lends_no_redis(
    clean_env, sqlite_url, tmp_path, monkeypatch
):
    from jobs.cli.common import load_settings

    _write_state(clean_env, database_url="sqlite+aiosqlite:////nowhere.db", skills_path="x")
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", sqlite_url)
    settings = load_settings()
    assert settings.database_url == sqlite_url and settings.skills_path == "x"
    from jobs.cli.embedded import write_private

    state = {"pid": 2**22 + 7, "redis_url": "redis://127.0.0.1:1/0", "skills_path": "y"}
    write_private(clean_env / STATE_FILE, json.dumps(state))
    settings = load_settings()
    assert settings.redis_url is None and settings.skills_path == "y"


@pytest.mark.slow
def test_piped_lists_are_tab_separated_and_whole(clean_env, sqlite_url, monkeypatch):
    """A long error is printed whole on one line, columns split by tabs."""
    import asyncio

    from jobs.db import create_engine, create_sessionmaker
    from tests.helpers.dashboard import seed_job

    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", sqlite_url)
    long_error = "boom " + "x" * 300 + "\nsecond line"

    class _Sessions:  # what seed_job reads of a Services
        def __init__(self, sm) -> None:
            self.sessionmaker = sm

    async def seed() -> None:
        engine = create_engine(sqlite_url)
        await seed_job(_Sessions(create_sessionmaker(engine)), status="failed", error=long_error)
        await engine.dispose()

    asyncio.run(seed())
    res = run("jobs", "list")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split("\t") == [
        "id", "skill", "status", "attempts", "channel", "created", "duration", "error",
    ]  # fmt: skip
    cells = lines[1].split("\t")
    assert len(cells) == 8 and cells[2] == "failed"
    assert cells[7] == "boom " + "x" * 300 + " second line"
    assert "…" not in res.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "setting"),
    [
        (["jobs", "list"], {"SKILLJOBS_DATABASE_URL": "postgresql://u@127.0.0.1:1/x"}, "DATABASE"),
        (["schedules", "list"], {"SKILLJOBS_DATABASE_URL": "postgresql://u@127.0.0.1:1/x"}, "DATABASE"),
        (["workers", "list"], {"SKILLJOBS_REDIS_URL": "redis://127.0.0.1:1/0"}, "REDIS"),
        (["jobs", "list"], {"SKILLJOBS_DATABASE_URL": "nonsense"}, "DATABASE"),
        (["jobs", "list"], {"SKILLJOBS_WORKER_MAX_JOBS": "many"}, "WORKER_MAX_JOBS"),
    ],
)  # fmt: skip
def test_unreachable_services_are_two_lines_exit_2(clean_env, args, env, setting, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) <= 2, res.output
    assert f"SKILLJOBS_{setting}" in res.output


def test_debug_shows_the_traceback(clean_env, monkeypatch):
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", "postgresql://u@127.0.0.1:1/x")
    res = run("--debug", "jobs", "list")
    assert res.exit_code == 2
    assert "Traceback" in res.output and "SKILLJOBS_DATABASE_URL" in res.output


@pytest.mark.slow
def test_missing_schema_names_the_fix(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", f"sqlite:///{tmp_path / 'empty.db'}")
    res = run("jobs", "list")
    assert res.exit_code == 2 and "skilljobs db upgrade" in res.output, res.output


def test_plain_postgresql_url_is_accepted(clean_env, pg_url, monkeypatch):
    plain = pg_url.replace("postgresql+asyncpg://", "postgresql://")
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", plain)
    res = run("jobs", "list", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"items": []}


@pytest.mark.parametrize("url", ["nonsense", "postgresql://u@[::1/x", "mysql://u@h/x"])
@pytest.mark.slow
def test_doctor_survives_a_bad_database_url(clean_env, url, monkeypatch):
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", url)
    monkeypatch.setenv("SKILLJOBS_REDIS_URL", "redis://127.0.0.1:1/0")
    res = CliRunner().invoke(app, ["doctor", "--json", "--timeout", "0.5"])
    assert res.exit_code == 1, res.output
    checks = {c["name"]: c for c in json.loads(res.stdout)}
    assert checks["database"]["status"] == "fail"
    assert "SKILLJOBS_DATABASE_URL" in checks["database"]["fix"]


def test_state_file_is_private(clean_env):
    from jobs.cli.state import write_state
    from jobs.settings import Settings

    settings = Settings(redis_url="redis://:pw@127.0.0.1:1/0")
    path = write_state(settings, web_url="http://127.0.0.1:9")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    state = read_state(clean_env)
    assert state is not None
    assert state["redis_url"] == "redis://:pw@127.0.0.1:1/0"
    assert state["web_url"] == "http://127.0.0.1:9" and state["pid"] == os.getpid()
    assert state["database_url"].startswith("sqlite+aiosqlite:///")


def test_skills_check_refuses_a_non_boolean_async(tmp_path):
    folder = tmp_path / "skills" / "maybe_bg"
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: maybe_bg\ndescription: d\nasync: maybe\n---\n")
    (folder / "handler.py").write_text("def run(input, context):\n    return {}\n")
    res = run("skills", "check", str(tmp_path / "skills"))
    assert res.exit_code == 1
    assert "async: 'maybe' is not true or false" in res.output
    (folder / "SKILL.md").write_text("---\nname: maybe_bg\ndescription: d\nasync: yes\n---\n")
    assert run("skills", "check", str(tmp_path / "skills")).exit_code == 0


@pytest.mark.slow
def test_jobs_delete_from_the_cli(clean_env, sqlite_url, monkeypatch):
    import asyncio

    from jobs.db import create_engine, create_sessionmaker
    from tests.helpers.dashboard import seed_job

    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("SKILLJOBS_REDIS_URL", "redis://127.0.0.1:1/0")  # not needed

    class _Sessions:
        def __init__(self, sm) -> None:
            self.sessionmaker = sm

    async def seed() -> list[str]:
        engine = create_engine(sqlite_url)
        sm = _Sessions(create_sessionmaker(engine))
        ids = [(await seed_job(sm, status=s)).id for s in ("succeeded", "queued")]
        await engine.dispose()
        return ids

    done, queued = asyncio.run(seed())
    res = run("jobs", "delete", done)
    assert res.exit_code == 0 and "deleted" in res.output, res.output
    res = run("jobs", "delete", queued)
    assert res.exit_code == 1 and "cancel it first" in res.output
    listed = json.loads(run("jobs", "list", "--json").output)["items"]
    assert [j["id"] for j in listed] == [queued]


@pytest.mark.slow
def test_cli_speaks_chinese(clean_env, monkeypatch, tmp_path):
    monkeypatch.setenv("SKILLJOBS_LANGUAGE", "zh")
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", "postgresql://u@127.0.0.1:1/x")
    res = run("jobs", "list")
    assert res.exit_code == 2
    assert "错误：无法使用" in res.output and "解决：" in res.output
    assert "SKILLJOBS_DATABASE_URL" in res.output  # the setting is named as it is
    monkeypatch.delenv("SKILLJOBS_DATABASE_URL")
    assert run("db", "upgrade").exit_code == 0
    path = tmp_path / "one.json"
    path.write_text(
        json.dumps({"name": "每日", "cron": "0 9 * * *", "steps": [{"skill": "echo"}]}),
        encoding="utf-8",
    )
    res = run("schedules", "apply", str(path))
    assert res.exit_code == 0 and "+ 每日 (新建)" in res.output and "新建 1 个" in res.output
    piped = run("schedules", "list")  # piped: the headers scripts read stay as they are
    assert piped.output.splitlines()[0].startswith("id\tname\tcron")


@pytest.mark.parametrize(
    "args",
    [
        ["config", "list", "r1"],
        ["prune", "--dry-run"],
        ["deliveries", "list"],
        ["incidents", "list"],
        ["schedules", "runs", "x"],
    ],
)
@pytest.mark.slow
def test_every_command_explains_an_unreachable_database(clean_env, monkeypatch, args):
    monkeypatch.setenv("SKILLJOBS_DATABASE_URL", "postgresql://u@127.0.0.1:1/x")
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "SKILLJOBS_DATABASE_URL" in res.output
