"""The foundation: migrations on both backends, secrets at rest, settings."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from jobs.crypto import (
    REDACTED,
    SecretBox,
    is_secret_key,
    load_or_create_key,
    normalize_key,
    redact,
)
from jobs.migrate import head_revision, is_current
from jobs.models import Job
from jobs.settings import Settings


async def test_migrated_schema_is_current(engine) -> None:
    assert head_revision()  # a single head (alembic refuses several)
    assert await is_current(engine)


async def test_job_row_roundtrip(sessionmaker) -> None:
    async with sessionmaker() as s:
        s.add(Job(skill="demo", input={"a": [1, 2]}, channel="telegram"))
        await s.commit()
    async with sessionmaker() as s:
        job = (await s.execute(select(Job))).scalar_one()
        assert job.input == {"a": [1, 2]}
        assert job.status == "queued"
        assert job.created_at > 0


def test_secret_box_seals_only_secret_names(tmp_path) -> None:
    box = SecretBox(load_or_create_key(tmp_path, None))
    data = {"api_token": "s3cr3t-value", "region": "cn", "nested": [{"Password": "pw"}]}
    sealed = box.seal(data)
    assert "s3cr3t-value" not in str(sealed) and "pw'" not in str(sealed)
    assert sealed["region"] == "cn"
    assert box.unseal(sealed) == data
    # the generated key is kept and reused
    assert load_or_create_key(tmp_path, None) == load_or_create_key(tmp_path, None)
    assert (tmp_path / "secret.key").stat().st_mode & 0o777 == 0o600


def test_wrong_key_is_a_clear_error(tmp_path) -> None:
    sealed = SecretBox(load_or_create_key(tmp_path / "a", None)).seal({"token": "x"})
    other = SecretBox(load_or_create_key(tmp_path / "b", None))
    with pytest.raises(ValueError, match="SKILLJOBS_SECRET_KEY"):
        other.unseal(sealed)


def test_secret_names_and_redaction() -> None:
    assert all(is_secret_key(k) for k in ("api_key", "AUTH_HEADER", "db_password", "Credentials"))
    assert not is_secret_key("region")
    assert normalize_key("--api-token") == "api_token"
    assert redact({"token": "x", "n": {"secret": "y", "ok": 1}}) == {
        "token": REDACTED,
        "n": {"secret": REDACTED, "ok": 1},
    }


def test_settings_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("SKILLJOBS_DATABASE_URL", raising=False)
    s = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    assert s.resolved_database_url.startswith("sqlite+aiosqlite:///")
    assert s.resolved_workspace_root == (tmp_path / "workspaces").resolve()
    assert s.skill_dirs[0].name == "skills"
    monkeypatch.setenv("SKILLJOBS_NOTIFY_TARGETS", '{"ops": "json://127.0.0.1:9/x"}')
    monkeypatch.setenv("SKILLJOBS_FETCH_ALLOW_HOSTS", "127.0.0.1:8443, Example.org")
    s = Settings(_env_file=None, data_dir=tmp_path)  # type: ignore[call-arg]
    assert s.notify_target_map == {"ops": ["json://127.0.0.1:9/x"]}
    assert s.allow_hosts == ["127.0.0.1:8443", "example.org"]
