"""Settings for tests, and where the test data lives."""

from __future__ import annotations

import os
from pathlib import Path

from jobs.settings import Settings

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
JOB_SKILLS = TESTS / "job_skills"
TRUST_SKILLS = TESTS / "trust_skills"
EXEC_FIXTURES = TESTS / "exec_fixtures"
SKILL_FIXTURES = TESTS / "skill_fixtures"
FAKE_SKILLS = TESTS / "fakes" / "skills"
MARKET_SKILLS = TESTS / "market_skills"

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


# Every app under test has an admin token, as `skilljobs web` always does (no tokenless
# admin): clients of the API send ADMIN_AUTH.
ADMIN_TOKEN = "test-admin-token-6a0c1d9e4b7f2a5c8e3d6b9f"
ADMIN_AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def _own_handlers() -> str:
    """The in-process handlers of ``tests/job_skills`` and ``tests/trust_skills``: the
    operator's own skills (trusted), whose tests are about the worker itself (its pid,
    stalls, pauses, leases, its log, what delivery does with what a trusted skill returns)
    and so need them to run inside it. The folders' command-line skills stay untrusted
    (sandboxed)."""
    found = [
        str(d)
        for root in (JOB_SKILLS, TRUST_SKILLS)
        for d in sorted(root.iterdir())
        if (d / "SKILL.md").is_file() and "\nexec:" not in (d / "SKILL.md").read_text()
    ]
    return os.pathsep.join(found)


OWN_HANDLERS = _own_handlers()


def make_settings(tmp_path: Path, *, redis_url: str | None, prefix: str, **kw: object) -> Settings:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    values: dict[str, object] = {
        "data_dir": data,
        "redis_url": redis_url,
        "redis_prefix": prefix,
        "queue_name": f"{prefix}:queue",
        "secret_key": "t2o4F7y0N1m2vQ9wX8Yb3cD4eF5gH6iJ7kL8mN9oP0Q=",
        "api_token": ADMIN_TOKEN,
        "trusted_skills": OWN_HANDLERS,
        # a wrong token's growing wait, in milliseconds rather than quarter seconds (the
        # wait itself is tested with a longer step)
        "web_auth_failure_delay_sec": 0.001,
    }
    values.update(kw)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]
