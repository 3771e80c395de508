"""Alembic environment (async). The URL comes from the caller (jobs.migrate) or the settings."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from jobs.db import create_engine
from jobs.models import Base

target_metadata = Base.metadata


def _url() -> str:
    url = context.config.attributes.get("url") or context.config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from jobs.settings import Settings

    return Settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(), target_metadata=target_metadata, literal_binds=True, render_as_batch=True
    )
    with context.begin_transaction():
        context.run_migrations()


def _do_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_migrations_online() -> None:
    engine = create_engine(_url())
    async with engine.connect() as conn:
        await conn.run_sync(_do_run)
        await conn.commit()
    await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
elif context.config.attributes.get("connection") is not None:
    # Called from jobs.migrate with an open connection (inside a running loop).
    _do_run(context.config.attributes["connection"])
else:
    asyncio.run(run_migrations_online())
