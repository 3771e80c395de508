"""Running alembic migrations from code (``skilljobs db upgrade``, ``skilljobs up``, tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from jobs.db import create_engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the database at ``engine`` to ``revision``."""

    def _run(connection: Connection) -> None:
        cfg = alembic_config(str(engine.url))
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(_run)


async def current_revision(engine: AsyncEngine) -> str | None:
    def _cur(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(_cur)


async def is_current(engine: AsyncEngine) -> bool:
    return await current_revision(engine) == head_revision()


def upgrade_sync(url: str) -> None:

    async def _main() -> None:
        engine = create_engine(url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()

    asyncio.run(_main())
