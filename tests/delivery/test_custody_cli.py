"""``skilljobs deliveries list|resend|dismiss`` against a real SQLite data dir and the fake
Telegram."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from delivery.channels.base import Courier
from delivery.errors import DeliveryOutcomeUnknown
from delivery.ledger import Parcel, deliver_once, ledger_key
from jobs.cli.app import app
from jobs.db import create_engine, create_sessionmaker


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tg) -> Path:
    for key in ("SKILLJOBS_DATABASE_URL", "SKILLJOBS_REDIS_URL", "SKILLJOBS_SKILLS_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SKILLJOBS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SKILLJOBS_TELEGRAM_BOT_TOKEN", tg.token)
    monkeypatch.setenv("SKILLJOBS_TELEGRAM_API_BASE", tg.url)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["db", "upgrade"]).exit_code == 0
    return tmp_path


def _unknown(data_dir: Path, job_id: str, text: str) -> None:
    async def go() -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{data_dir / 'skilljobs.db'}")

        async def lost() -> str:
            raise DeliveryOutcomeUnknown("telegram sendMessage: timed out waiting for the answer")

        await deliver_once(
            create_sessionmaker(engine),
            lost,
            Courier("telegram:1001", "w#1", channel="telegram", job_id=job_id),
            Parcel(ledger_key(job_id, "telegram:1001", "text"), content={"text": text}),
        )
        await engine.dispose()

    asyncio.run(go())


@pytest.mark.slow
def test_deliveries_cli_lists_resends_and_dismisses(cli_env: Path, tg) -> None:
    data = cli_env / "data"
    if not (data / "skilljobs.db").exists():
        pytest.skip("the data dir keeps its database elsewhere")
    _unknown(data, "job-a", "first")
    _unknown(data, "job-b", "second")
    runner = CliRunner()
    res = runner.invoke(app, ["deliveries", "list", "--status", "unknown", "--json"])
    assert res.exit_code == 0, res.output
    items = json.loads(res.output)["items"]
    assert {i["job_id"] for i in items} == {"job-a", "job-b"}
    by_job = {i["job_id"]: i["id"] for i in items}
    res = runner.invoke(app, ["deliveries", "resend", str(by_job["job-a"])])
    assert res.exit_code == 0, res.output
    assert "sent again" in res.output and [m["text"] for m in tg.sent] == ["first"]
    res = runner.invoke(app, ["deliveries", "dismiss", str(by_job["job-b"])])
    assert res.exit_code == 0 and "dismissed" in res.output
    res = runner.invoke(app, ["deliveries", "resend", "99999"])
    assert res.exit_code != 0 and "no delivery 99999" in res.output
    res = runner.invoke(app, ["deliveries", "list", "--job", "job-a"])
    assert res.exit_code == 0 and "sent" in res.output
    assert runner.invoke(app, ["deliveries", "list", "--status", "bogus"]).exit_code != 0
