"""``skilljobs doctor`` against real PostgreSQL, Redis and SQLite."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import uuid
from pathlib import Path

import pytest
import typer
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from jobs.cli.checks import (
    Check,
    Status,
    check_api_token,
    check_channel,
    check_database,
    check_directories,
    check_fetch_allow_hosts,
    check_llm,
    check_logging,
    check_migrations,
    check_notify_targets,
    check_redis,
    check_redis_persistence,
    check_secret_key,
    check_settings,
    check_skills,
    failed,
    render,
    run_checks,
)
from jobs.cli.doctor import register
from jobs.cli.embedded import EmbeddedRedis, free_port
from jobs.db import create_engine
from jobs.migrate import upgrade
from tests.helpers.settings import make_settings

GOOD_KEY = "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="


def _skills(tmp_path: Path, *, broken: bool = False) -> Path:
    root = tmp_path / "skills"
    hello = root / "hello"
    hello.mkdir(parents=True)
    (hello / "SKILL.md").write_text("---\nname: hello\ndescription: says hello\n---\nHello.\n")
    (hello / "handler.py").write_text("def execute(input):\n    return {'ok': True}\n")
    if broken:
        bad = root / "broken"
        bad.mkdir()
        (bad / "SKILL.md").write_text("---\nname: other-name\n---\nA skill in the wrong folder.\n")
    return root


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def _cfg(tmp_path: Path, redis_prefix: str, **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("redis_url", None)
    return make_settings(tmp_path, prefix=redis_prefix, **kw)  # type: ignore[arg-type]


# --- whole reports ----------------------------------------------------------------------


@pytest.mark.slow
async def test_good_config_passes(
    database_url: str, tmp_path: Path, redis_server_url: str, redis_prefix: str
) -> None:
    settings = _cfg(
        tmp_path,
        redis_prefix,
        redis_url=redis_server_url,
        database_url=database_url,
        skills_path=str(_skills(tmp_path)),
        api_token="a-long-enough-api-token-value",
        notify_targets='{"ops": ["json://127.0.0.1:9/hook"]}',
        telegram_bot_token="123:abc",
        fetch_allow_hosts="127.0.0.1:8443",
    )
    checks = await run_checks(settings, host="0.0.0.0", timeout_sec=5)
    assert not failed(checks), render(checks)
    by = _by_name(checks)
    assert "skill(s) loaded" in by["skills"].detail
    for name in (
        "secret key",
        "database",
        "migrations",
        "redis",
        "channel telegram",
        "notify targets",
        "api token",
        "fetch allow-list",
    ):
        assert by[name].status is Status.OK, render([by[name]])
    assert by["migrations"].detail.startswith("schema at head revision")


async def test_unreachable_database_fails_with_a_fix(tmp_path: Path, redis_prefix: str) -> None:
    port = free_port()
    settings = _cfg(
        tmp_path,
        redis_prefix,
        database_url=f"postgresql+asyncpg://postgres:pgsecretpw@127.0.0.1:{port}/x",
    )
    check = await check_database(settings, timeout_sec=3)
    assert check.status is Status.FAIL
    assert f"127.0.0.1:{port}" in check.detail
    assert "pgsecretpw" not in check.detail + check.fix
    assert "SKILLJOBS_DATABASE_URL" in check.fix
    checks = _by_name(await run_checks(settings, timeout_sec=3))
    assert checks["migrations"].status is Status.WARN  # not checked, not a second failure


@pytest.mark.slow
async def test_a_server_that_never_answers_times_out(tmp_path: Path, redis_prefix: str) -> None:
    held: list[asyncio.StreamWriter] = []

    async def _hold(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        held.append(w)  # accept the connection, never speak

    server = await asyncio.start_server(_hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        settings = _cfg(
            tmp_path,
            redis_prefix,
            database_url=f"postgresql+asyncpg://postgres@127.0.0.1:{port}/x",
            redis_url=f"redis://127.0.0.1:{port}/0",
        )
        db = await check_database(settings, timeout_sec=0.5)
        assert db.status is Status.FAIL and "no answer within 0.5 s" in db.detail
        redis = await check_redis(settings, timeout_sec=0.5)
        assert redis.status is Status.FAIL
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


@pytest.mark.slow
async def test_unmigrated_sqlite_says_to_run_db_upgrade(tmp_path: Path, redis_prefix: str) -> None:
    path = tmp_path / "empty.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE unrelated (id INTEGER)")
    settings = _cfg(tmp_path, redis_prefix, database_url=f"sqlite+aiosqlite:///{path}")
    assert (await check_database(settings)).status is Status.OK
    check = await check_migrations(settings)
    assert check.status is Status.FAIL
    assert "not migrated" in check.detail
    assert check.fix == "run `skilljobs db upgrade`"
    engine = create_engine(settings.resolved_database_url)
    await upgrade(engine)
    await engine.dispose()
    assert (await check_migrations(settings)).status is Status.OK


@pytest.mark.slow
async def test_unmigrated_postgres_says_to_run_db_upgrade(
    pg_url: str, tmp_path: Path, redis_prefix: str
) -> None:
    import asyncpg

    base = make_url(pg_url)
    admin = base.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"skilljobs_doc_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = base.set(database=name).render_as_string(hide_password=False)
        settings = _cfg(tmp_path, redis_prefix, database_url=url)
        assert (await check_database(settings)).status is Status.OK
        check = await check_migrations(settings)
        assert check.status is Status.FAIL and "skilljobs db upgrade" in check.fix
    finally:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def test_missing_sqlite_file_is_a_warning_and_is_not_created(
    tmp_path: Path, redis_prefix: str
) -> None:
    path = tmp_path / "not-yet.db"
    settings = _cfg(tmp_path, redis_prefix, database_url=f"sqlite+aiosqlite:///{path}")
    assert (await check_database(settings)).status is Status.WARN
    assert (await check_migrations(settings)).status is Status.WARN
    assert not path.exists()


# --- Redis ------------------------------------------------------------------------------


@pytest.mark.slow
async def test_redis_unset_unreachable_and_persistence(tmp_path: Path, redis_prefix: str) -> None:
    unset = await check_redis(_cfg(tmp_path, redis_prefix))
    assert unset.status is Status.OK and "embedded Redis" in unset.detail
    pg_like = _cfg(tmp_path, redis_prefix, database_url="postgresql+asyncpg://u@db:5432/x")
    assert (await check_redis(pg_like)).status is Status.WARN
    assert await check_redis_persistence(pg_like) is None

    down = _cfg(tmp_path, redis_prefix, redis_url=f"redis://:redispw@127.0.0.1:{free_port()}/0")
    check = await check_redis(down, timeout_sec=2)
    assert check.status is Status.FAIL and "redispw" not in check.detail
    assert "SKILLJOBS_REDIS_URL" in check.fix

    with EmbeddedRedis(tmp_path / "volatile", persist=False) as server:
        settings = _cfg(tmp_path, redis_prefix, redis_url=server.url)
        assert (await check_redis(settings)).status is Status.OK
        check = await check_redis_persistence(settings)
        assert check is not None and check.status is Status.WARN
        assert "re-enqueued from the database by the reconciler" in check.fix
    with EmbeddedRedis(tmp_path / "durable", persist=True) as server:
        check = await check_redis_persistence(_cfg(tmp_path, redis_prefix, redis_url=server.url))
        assert check is not None and check.status is Status.OK and "AOF" in check.detail


# --- secrets, directories, settings -----------------------------------------------------


def test_secret_key_states(tmp_path: Path, redis_prefix: str) -> None:
    assert check_secret_key(_cfg(tmp_path, redis_prefix)).status is Status.OK
    bad = check_secret_key(_cfg(tmp_path, redis_prefix, secret_key="not-a-fernet-key"))
    assert bad.status is Status.FAIL and "Fernet.generate_key" in bad.fix
    assert "not-a-fernet-key" not in bad.detail + bad.fix

    pg = "postgresql+asyncpg://u@db:5432/x"
    gen = check_secret_key(_cfg(tmp_path, redis_prefix, secret_key=None))
    assert gen.status is Status.OK and "generated" in gen.detail
    prod = check_secret_key(_cfg(tmp_path, redis_prefix, secret_key=None, database_url=pg))
    assert prod.status is Status.WARN and "SKILLJOBS_SECRET_KEY" in prod.fix
    key_file = tmp_path / "data" / "secret.key"
    assert not key_file.exists()  # the doctor never writes the key
    key_file.write_text(GOOD_KEY)
    prod = check_secret_key(_cfg(tmp_path, redis_prefix, secret_key=None, database_url=pg))
    assert prod.status is Status.WARN and str(key_file) in prod.fix
    key_file.write_text("garbage")
    assert check_secret_key(_cfg(tmp_path, redis_prefix, secret_key=None)).status is Status.FAIL


def test_directories_must_be_usable(tmp_path: Path, redis_prefix: str) -> None:
    assert check_directories(_cfg(tmp_path, redis_prefix)).status is Status.OK
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    check = check_directories(_cfg(tmp_path, redis_prefix, workspace_root=blocker / "ws"))
    assert check.status is Status.FAIL and "not a directory" in check.detail


def test_settings_that_do_not_parse_name_the_variable(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKILLJOBS_WORKER_MAX_JOBS", "many")
    settings, check = check_settings()
    assert settings is None and check.status is Status.FAIL
    assert "SKILLJOBS_WORKER_MAX_JOBS" in check.detail


# --- skills, channels, notify, token, allow-list ----------------------------------------


def test_skill_load_errors_name_the_skill(tmp_path: Path, redis_prefix: str) -> None:
    root = _skills(tmp_path, broken=True)
    check = check_skills(_cfg(tmp_path, redis_prefix, skills_path=str(root)))
    assert check.status is Status.FAIL
    assert "broken:" in check.detail and "hello" not in check.detail
    missing = check_skills(_cfg(tmp_path, redis_prefix, skills_path=str(tmp_path / "nope")))
    assert missing.status is Status.FAIL and "SKILLJOBS_SKILLS_PATH" in missing.fix


def test_partial_channel_config_names_the_missing_variable(
    tmp_path: Path, redis_prefix: str
) -> None:
    feishu = check_channel(_cfg(tmp_path, redis_prefix, feishu_app_id="cli_a1"), "feishu")
    assert feishu.status is Status.FAIL
    assert "SKILLJOBS_FEISHU_APP_SECRET" in feishu.detail
    assert "SKILLJOBS_FEISHU_APP_ID" not in feishu.detail

    ding = check_channel(
        _cfg(tmp_path, redis_prefix, dingtalk_app_key="k", dingtalk_app_secret="s"), "dingtalk"
    )
    assert ding.status is Status.FAIL and "SKILLJOBS_DINGTALK_ROBOT_CODE" in ding.detail
    wecom = check_channel(
        _cfg(
            tmp_path, redis_prefix, wecom_corp_id="ww1", wecom_corp_secret="s", wecom_agent_id="app"
        ),
        "wecom",
    )
    assert wecom.status is Status.FAIL and "SKILLJOBS_WECOM_AGENT_ID" in wecom.detail
    ok = check_channel(
        _cfg(
            tmp_path,
            redis_prefix,
            wecom_corp_id="ww1",
            wecom_corp_secret="s",
            wecom_agent_id="1000002",
        ),
        "wecom",
    )
    assert ok.status is Status.OK
    base = check_channel(
        _cfg(
            tmp_path, redis_prefix, telegram_bot_token="1:x", telegram_api_base="api.telegram.org"
        ),
        "telegram",
    )
    assert base.status is Status.FAIL and "SKILLJOBS_TELEGRAM_API_BASE" in base.detail
    none = check_channel(_cfg(tmp_path, redis_prefix), "dingtalk")
    assert none.status is Status.OK and none.detail == "not configured"


def test_bad_notify_url_is_flagged_without_leaking_its_password(
    tmp_path: Path,
    redis_prefix: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    targets = {
        "ops": [
            "json://hookuser:goodpass123@127.0.0.1:9/hook",
            "nosuchscheme://admin:hunter2secret@example.org/x",
        ],
        "oncall": "mailto://me:mailpass456@example.org",
    }
    check = check_notify_targets(_cfg(tmp_path, redis_prefix, notify_targets=json.dumps(targets)))
    assert check.status is Status.FAIL
    assert "'ops' URL #2" in check.detail and "nosuchscheme://" in check.detail
    assert "oncall" not in check.detail  # the valid alias is not blamed
    out = render([check]) + caplog.text + "".join(capsys.readouterr())
    for secret in ("hunter2secret", "goodpass123", "mailpass456", "admin"):
        assert secret not in out


def test_notify_targets_from_files(tmp_path: Path, redis_prefix: str) -> None:
    good = tmp_path / "targets.yaml"
    good.write_text("ops:\n  - json://127.0.0.1:9/a\n  - form://127.0.0.1:9/b\n")
    check = check_notify_targets(_cfg(tmp_path, redis_prefix, notify_targets=str(good)))
    assert check.status is Status.OK and "2 URL(s)" in check.detail
    gone = check_notify_targets(
        _cfg(tmp_path, redis_prefix, notify_targets=str(tmp_path / "x.json"))
    )
    assert gone.status is Status.FAIL and "does not exist" in gone.detail
    broken = check_notify_targets(_cfg(tmp_path, redis_prefix, notify_targets='{"ops": '))
    assert broken.status is Status.FAIL


def test_api_token_rule(tmp_path: Path, redis_prefix: str) -> None:
    none = _cfg(tmp_path, redis_prefix, api_token=None)
    assert check_api_token(none, "0.0.0.0").status is Status.FAIL
    assert check_api_token(none, "127.0.0.1").status is Status.OK
    assert check_api_token(none, "::1").status is Status.OK
    assert check_api_token(none).status is Status.OK
    short = _cfg(tmp_path, redis_prefix, api_token="abc")
    assert check_api_token(short, "0.0.0.0").status is Status.WARN


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("127.0.0.1:8443, Example.org, [::1]:9000, ::1, files.example.com.", True),
        ("https://files.example.com", False),
        ("example.org/path", False),
        ("example.org:0", False),
        ("example.org:https", False),
        ("bad host name", False),
        ("[::1]9000", False),
    ],
)
def test_fetch_allow_list_entries(tmp_path: Path, redis_prefix: str, value: str, ok: bool) -> None:
    check = check_fetch_allow_hosts(_cfg(tmp_path, redis_prefix, fetch_allow_hosts=value))
    assert (check.status is Status.OK) is ok, check.detail


def test_llm_and_logging(tmp_path: Path, redis_prefix: str) -> None:
    assert check_llm(_cfg(tmp_path, redis_prefix)).status is Status.OK
    partial = check_llm(_cfg(tmp_path, redis_prefix, llm_model="gpt-x"))
    assert partial.status is Status.WARN and "SKILLJOBS_LLM_KEY" in partial.detail
    assert "sk-secret1" not in check_llm(_cfg(tmp_path, redis_prefix, llm_key="sk-secret1")).detail
    assert check_logging(_cfg(tmp_path, redis_prefix, log_level="debug")).status is Status.OK
    bad = check_logging(_cfg(tmp_path, redis_prefix, log_level="LOUD", log_format="xml"))
    assert bad.status is Status.FAIL
    assert "SKILLJOBS_LOG_LEVEL" in bad.detail and "SKILLJOBS_LOG_FORMAT" in bad.detail


# --- the command ------------------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """skilljobs"""

    register(app)
    return app


@pytest.mark.slow
def test_command_exit_codes_and_output(
    tmp_path: Path, monkeypatch, sqlite_url: str, redis_server_url: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for k, v in {
        "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
        "SKILLJOBS_DATABASE_URL": sqlite_url,
        "SKILLJOBS_REDIS_URL": redis_server_url,
        "SKILLJOBS_SKILLS_PATH": str(_skills(tmp_path)),
        "SKILLJOBS_SECRET_KEY": GOOD_KEY,
    }.items():
        monkeypatch.setenv(k, v)
    runner = CliRunner()
    result = runner.invoke(_app(), ["doctor"])
    assert result.exit_code == 0, result.output
    assert "✓ database:" in result.output and "0 failed" in result.output

    monkeypatch.setenv("SKILLJOBS_FEISHU_APP_ID", "cli_a1")
    result = runner.invoke(_app(), ["doctor", "--json"])
    assert result.exit_code == 1
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["channel feishu"]["status"] == "fail"
    assert "SKILLJOBS_FEISHU_APP_SECRET" in rows["channel feishu"]["detail"]

    monkeypatch.setenv("SKILLJOBS_WORKER_LEASE_SEC", "soon")
    result = runner.invoke(_app(), ["doctor"])
    assert result.exit_code == 1 and "SKILLJOBS_WORKER_LEASE_SEC" in result.output


def test_skilljobs_has_the_doctor_command() -> None:
    from jobs.cli.app import app

    result = CliRunner().invoke(app, ["doctor", "--help"])
    assert result.exit_code == 0 and "--host" in result.output
