"""Per-role skill configuration on SQLite and PostgreSQL: secrets only ever encrypted."""

from __future__ import annotations

import asyncio

import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select, text

from jobs.catalog.configs import ConfigStore
from jobs.crypto import REDACTED, SecretBox
from jobs.models import SkillConfig

KEY = b"t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q="
SECRET = "sk-live-PLAINTEXT-4242"


@pytest.fixture
def store(sessionmaker) -> ConfigStore:  # type: ignore[no-untyped-def]
    return ConfigStore(sessionmaker, SecretBox(KEY))


async def _all_columns_text(sessionmaker) -> str:  # type: ignore[no-untyped-def]
    async with sessionmaker() as s:
        rows = (await s.execute(text("SELECT * FROM skill_configs"))).all()
    return "\n".join(repr(tuple(r)) for r in rows)


async def test_roundtrip_and_secret_never_plaintext(store: ConfigStore, sessionmaker) -> None:  # type: ignore[no-untyped-def]
    await store.set("r1", "fetch_price", "--api-token", SECRET)
    await store.set("r1", "fetch_price", "region", "eu")
    await store.set("r1", "fetch_price", "limits", {"max": 5, "pages": [1, 2]})
    assert await store.get("r1", "fetch_price") == {
        "api_token": SECRET,
        "limits": {"max": 5, "pages": [1, 2]},
        "region": "eu",
    }
    assert await store.prefetch("r1", "fetch_price") == await store.get("r1", "fetch_price")
    dump = await _all_columns_text(sessionmaker)
    assert SECRET not in dump and "PLAINTEXT" not in dump
    assert "eu" in dump  # non-secrets are stored plainly
    async with sessionmaker() as s:
        row = await s.scalar(select(SkillConfig).where(SkillConfig.key == "api_token"))
    assert row is not None and row.is_secret and row.value is None and row.value_enc
    assert await store.get("r2", "fetch_price") == {}
    assert await store.get("r1", "other") == {}


async def test_masked(store: ConfigStore) -> None:
    await store.set("r1", "a", "password", "hunter2")
    await store.set("r1", "a", "user", "bob")
    await store.set("r1", "b", "auth_header", "Bearer x")
    await store.set("r9", "a", "user", "eve")
    assert await store.masked("r1", "a") == {"a": {"password": REDACTED, "user": "bob"}}
    everything = await store.masked("r1")
    assert everything == {
        "a": {"password": REDACTED, "user": "bob"},
        "b": {"auth_header": REDACTED},
    }
    assert "hunter2" not in repr(everything)
    assert await store.masked("r1", "none") == {"none": {}}


async def test_set_updates_and_none_deletes(store: ConfigStore) -> None:
    await store.set("r1", "a", "mode", "fast")
    await store.set("r1", "a", "mode", "slow")
    await store.set("r1", "a", "token", "t1")
    await store.set("r1", "a", "token", "t2")
    assert await store.get("r1", "a") == {"mode": "slow", "token": "t2"}
    await store.set("r1", "a", "mode", None)
    assert await store.get("r1", "a") == {"token": "t2"}


async def test_replace_keeps_masked_secret(store: ConfigStore, sessionmaker) -> None:  # type: ignore[no-untyped-def]
    await store.replace("r1", "a", {"api_key": SECRET, "region": "eu", "old": 1})
    shown = (await store.masked("r1", "a"))["a"]
    shown["region"] = "us"
    shown.pop("old")
    await store.replace("r1", "a", shown)  # what a dashboard PUT sends back
    assert await store.get("r1", "a") == {"api_key": SECRET, "region": "us"}
    with pytest.raises(ValueError, match="send the secret itself"):
        await store.replace("r1", "a", {"new_token": REDACTED})
    assert await store.get("r1", "a") == {"api_key": SECRET, "region": "us"}  # unchanged
    assert SECRET not in await _all_columns_text(sessionmaker)


async def test_bad_input(store: ConfigStore) -> None:
    with pytest.raises(ValueError, match="role_id"):
        await store.set("", "a", "k", 1)
    with pytest.raises(ValueError, match="JSON"):
        await store.set("r1", "a", "k", object())
    with pytest.raises(ValueError, match="empty"):
        await store.set("r1", "a", "--", 1)
    with pytest.raises(ValueError, match="object"):
        await store.replace("r1", "a", ["x"])  # type: ignore[arg-type]


@pytest.mark.slow
async def test_concurrent_sets_leave_one_row(store: ConfigStore, sessionmaker) -> None:  # type: ignore[no-untyped-def]
    await asyncio.gather(*(store.set("r1", "a", "k", i) for i in range(5)))
    async with sessionmaker() as s:
        rows = (await s.scalars(select(SkillConfig).where(SkillConfig.key == "k"))).all()
    assert len(rows) == 1 and rows[0].value in range(5)


async def test_wrong_secret_key_is_a_clear_error(store: ConfigStore, sessionmaker) -> None:  # type: ignore[no-untyped-def]
    await store.set("r1", "a", "token", "t")
    other = ConfigStore(sessionmaker, SecretBox(Fernet.generate_key()))
    with pytest.raises(ValueError, match="SKILLJOBS_SECRET_KEY"):
        await other.get("r1", "a")


# --- the CLI --------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_set_and_list(tmp_path, sqlite_url: str) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    from jobs.cli.app import app

    env = {
        "SKILLJOBS_DATA_DIR": str(tmp_path / "data"),
        "SKILLJOBS_DATABASE_URL": sqlite_url,
        "SKILLJOBS_SECRET_KEY": KEY.decode(),
    }
    runner = CliRunner()
    r = runner.invoke(app, ["config", "set", "r1", "demo", "--", "--api-token", SECRET], env=env)
    assert r.exit_code == 0, r.output
    assert SECRET not in r.output and "api_token" in r.output
    r = runner.invoke(app, ["config", "set", "r1", "demo", "limit", "5"], env=env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["config", "set", "r1", "demo", "note", "5", "--string"], env=env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["config", "list", "r1", "--json"], env=env)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == {"demo": {"api_token": REDACTED, "limit": 5, "note": "5"}}
    r = runner.invoke(app, ["config", "list", "r1", "demo"], env=env)
    assert r.exit_code == 0 and SECRET not in r.output and "limit" in r.output
    r = runner.invoke(app, ["config", "unset", "r1", "demo", "note"], env=env)
    assert r.exit_code == 0
    r = runner.invoke(app, ["config", "list", "r2"], env=env)
    assert r.exit_code == 0 and "no configuration" in r.output
    r = runner.invoke(app, ["config", "set", "", "demo", "k", "v"], env=env)
    assert r.exit_code == 1 and "role_id must be a non-empty string" in r.output
    bad = dict(env, SKILLJOBS_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
    r = runner.invoke(app, ["config", "list", "r1"], env=bad)
    assert r.exit_code == 2 and "db upgrade" in r.output  # a database to migrate: exit 2
