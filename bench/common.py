"""What the benchmarks share: the services they use, a throw-away database, percentiles."""

from __future__ import annotations

import os
import uuid

from sqlalchemy.engine import make_url

from jobs.db import create_engine
from jobs.migrate import upgrade

PG = os.environ.get(
    "SKILLJOBS_BENCH_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
REDIS = os.environ.get("SKILLJOBS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def make_db() -> tuple[str, str]:
    """A new, migrated PostgreSQL database: ``(url, name)``."""
    import asyncpg

    name = f"skilljobs_bench_{uuid.uuid4().hex[:8]}"
    base = make_url(PG)
    conn = await asyncpg.connect(base.set(drivername="postgresql").render_as_string(False))
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = base.set(database=name).render_as_string(False)
    engine = create_engine(url)
    await upgrade(engine)
    await engine.dispose()
    return url, name


async def drop_db(name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(make_url(PG).set(drivername="postgresql").render_as_string(False))
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()
