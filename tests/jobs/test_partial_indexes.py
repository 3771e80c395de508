"""Migrations 0014 and 0015 on both backends.

0014: the lease, finish-time and (PostgreSQL) error-text indexes of ``jobs`` hold only rows
where the column is set, the planner still uses them for the queries that need them, and an
existing database upgrades (and downgrades) in place.

0015: the skill-name trigram index is gone; the job search still finds every job whose
skill contains the text (case-insensitive, ``%``/``_`` taken literally), through
``ix_jobs_skill_created`` on PostgreSQL.

0016: on PostgreSQL ``jobs`` and ``job_attempts`` are filled to 70 % per page (room for
the next versions of their rows); downgrading resets it."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobs.db import create_engine
from jobs.migrate import alembic_config, upgrade
from jobs.models import Job
from jobs.queue.filters import JobFilter, like_pattern, skills_containing, text_match

PARTIAL = {"ix_jobs_lease_expires_at": "lease_expires_at", "ix_jobs_finished": "finished_at"}

# Each query the partial indexes are for, by the index it must use.
QUERIES = {
    "ix_jobs_lease_expires_at": "SELECT id FROM jobs WHERE lease_expires_at < 2e9",
    "ix_jobs_finished": "SELECT count(*) FROM jobs WHERE finished_at >= 1e9",
}
TRGM_QUERY = "SELECT id FROM jobs WHERE error ILIKE '%quota%'"


@pytest.fixture
async def fresh(database_url: str, tmp_path: Any) -> AsyncIterator[AsyncEngine]:
    """An empty database of the backend under test (nothing migrated yet)."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}")
        yield engine
        await engine.dispose()
        return
    import asyncpg

    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"skilljobs_ix_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(admin)
    await conn.execute(f'CREATE DATABASE "{name}"')
    engine = create_engine(url.set(database=name).render_as_string(hide_password=False))
    try:
        yield engine
    finally:
        await engine.dispose()
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.close()


async def _indexes(engine: AsyncEngine) -> dict[str, str]:
    """Each index of ``jobs`` and its WHERE clause ('' when it holds every row)."""

    def read(sync_conn: Any) -> dict[str, str]:
        out = {}
        for i in inspect(sync_conn).get_indexes("jobs"):
            opts = i.get("dialect_options", {})
            where = opts.get("postgresql_where", opts.get("sqlite_where"))
            out[i["name"]] = "" if where is None else str(where)
        return out

    async with engine.connect() as conn:
        found = await conn.run_sync(read)
        if engine.dialect.name == "postgresql":  # gin indexes are not all reflected
            rows = await conn.execute(
                text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'jobs'")
            )
            for name, definition in rows:
                where = definition.partition(" WHERE ")[2]
                found[name] = where.strip("()") if where else ""
    return found


async def _plan(engine: AsyncEngine, sql: str) -> str:
    async with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # a handful of rows: make the planner show which index it can use at all
            await conn.execute(text("SET enable_seqscan = off"))
            rows = await conn.execute(text(f"EXPLAIN {sql}"))
        else:
            rows = await conn.execute(text(f"EXPLAIN QUERY PLAN {sql}"))
        return "\n".join(" ".join(str(c) for c in r) for r in rows)


async def _downgrade(engine: AsyncEngine, revision: str) -> None:
    def down(sync_conn: Any) -> None:
        cfg = alembic_config(str(engine.url))
        cfg.attributes["connection"] = sync_conn
        command.downgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(down)


async def _insert_jobs(engine: AsyncEngine) -> None:
    now = time.time()
    async with engine.begin() as conn:
        for i, (status, lease, finished, error) in enumerate(
            [
                ("queued", None, None, None),
                ("running", now + 60, None, None),
                ("succeeded", None, now, None),
                ("failed", None, now, "Quota exceeded"),
            ]
        ):
            await conn.execute(
                text(
                    "INSERT INTO jobs (id, skill, status, attempts, input, context, fetches, "
                    "wall_sec, channel, session_id, external_id, actor_key, role_id, org_id, "
                    "lease_token, lease_expires_at, cancel_requested, created_at, queued_at, "
                    "finished_at, updated_at, priority, error) VALUES (:id, 'noop', :status, "
                    "0, '{}', '{}', '[]', 60, 'web', '', '', '', '', '', 0, :lease, false, "
                    ":now, :now, :finished, :now, 3, :error)"
                ),
                {
                    "id": f"job{i}",
                    "status": status,
                    "lease": lease,
                    "finished": finished,
                    "error": error,
                    "now": now,
                },
            )


@pytest.mark.slow
async def test_indexes_hold_only_rows_where_set_and_still_serve(fresh: AsyncEngine) -> None:
    await upgrade(fresh)
    found = await _indexes(fresh)
    for name, column in PARTIAL.items():
        assert found[name].lower().replace('"', "") == f"{column} is not null", found[name]
    await _insert_jobs(fresh)
    for name, sql in QUERIES.items():
        assert name in await _plan(fresh, sql)
    if fresh.dialect.name == "postgresql" and "ix_jobs_error_trgm" in found:
        assert found["ix_jobs_error_trgm"].lower() == "error is not null"
        assert "ix_jobs_error_trgm" in await _plan(fresh, TRGM_QUERY)
        # the dashboard's free-text search (an OR over five columns, the skill names it
        # matches resolved first: none here) still takes it
        search = select(Job.id).where(text_match("quota", []))
        compiled = search.compile(dialect=fresh.dialect, compile_kwargs={"literal_binds": True})
        assert "ix_jobs_error_trgm" in await _plan(fresh, str(compiled))
    async with fresh.connect() as conn:  # what they serve is still found
        expired = await conn.scalar(text("SELECT count(*) FROM jobs WHERE lease_expires_at < 2e9"))
        finished = await conn.scalar(text(QUERIES["ix_jobs_finished"]))
        like = "ILIKE" if fresh.dialect.name == "postgresql" else "LIKE"
        matched = await conn.scalar(text(f"SELECT count(*) FROM jobs WHERE error {like} '%quota%'"))
    assert (expired, finished, matched) == (1, 2, 1)


@pytest.mark.slow
async def test_an_existing_database_upgrades_and_downgrades_in_place(fresh: AsyncEngine) -> None:
    await upgrade(fresh, "0013")
    await _insert_jobs(fresh)
    before = await _indexes(fresh)
    assert all(before[name] == "" for name in PARTIAL)
    await upgrade(fresh, "0014")
    after = await _indexes(fresh)
    assert all(after[name] for name in PARTIAL)
    assert set(after) == set(before)  # the same indexes, nothing lost or added

    await _downgrade(fresh, "0013")
    assert await _indexes(fresh) == before
    async with fresh.connect() as conn:
        assert await conn.scalar(text("SELECT count(*) FROM jobs")) == 4


SKILLS = ["noop", "web-search", "Web_Scraper", "image-gen", "weather", "100%-done", "a_b", "axb"]


async def _insert_skills(engine: AsyncEngine, skills: list[str], per: int) -> None:
    now = time.time()
    rows = [
        {"id": f"{n:03d}{i:04d}", "skill": skill, "now": now + i}
        for n, skill in enumerate(skills)
        for i in range(per)
    ]
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO jobs (id, skill, status, attempts, input, context, fetches, "
                "wall_sec, channel, session_id, external_id, actor_key, role_id, org_id, "
                "lease_token, cancel_requested, created_at, queued_at, updated_at, priority) "
                "VALUES (:id, :skill, 'succeeded', 1, '{}', '{}', '[]', 60, 'web', '', '', "
                "'', '', '', 0, false, :now, :now, :now, 3)"
            ),
            rows,
        )


async def _search(engine: AsyncEngine, q: str) -> set[str]:
    """The skills of the jobs the job list's text search finds, both ways: with the skill
    names resolved first (what the list and bulk actions do) and without."""
    flt = JobFilter(q=q)
    async with AsyncSession(engine) as session:
        resolved = select(Job.skill).where(*await flt.conditions_in(session)).distinct()
        found = set((await session.scalars(resolved)).all())
        plain = set((await session.scalars(select(Job.skill).where(text_match(q)))).all())
    assert found == plain
    return found


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("web", {"web-search", "Web_Scraper"}),
        ("WEB", {"web-search", "Web_Scraper"}),
        ("_", {"Web_Scraper", "a_b"}),  # literally an underscore, not "any character"
        ("%", {"100%-done"}),
        ("a_b", {"a_b"}),
        ("-", {"web-search", "image-gen", "100%-done"}),
        ("noop", {"noop"}),
        ("nosuchskill", set()),
    ],
)
@pytest.mark.slow
async def test_skill_substring_search_finds_exactly_the_matching_skills(
    fresh: AsyncEngine, q: str, expected: set[str]
) -> None:
    await upgrade(fresh)
    assert await _search(fresh, q) == set()  # an empty table: no names, no match, no error
    await _insert_skills(fresh, SKILLS, 3)
    assert await _search(fresh, q) == expected
    assert expected == {s for s in SKILLS if q.lower() in s.lower()}


async def test_skill_search_needs_no_trigram_index_and_uses_the_skill_index(
    fresh: AsyncEngine,
) -> None:
    await upgrade(fresh, "0014")
    before = await _indexes(fresh)
    await upgrade(fresh)
    after = await _indexes(fresh)
    assert "ix_jobs_skill_trgm" not in after
    assert set(before) - set(after) <= {"ix_jobs_skill_trgm"}
    await _insert_skills(fresh, SKILLS, 200)
    if fresh.dialect.name == "postgresql":
        async with fresh.begin() as conn:
            await conn.execute(text("ANALYZE jobs"))
        async with AsyncSession(fresh) as session:
            names = await skills_containing(session, like_pattern("scrap"))
        assert names == ["Web_Scraper"]
        search = select(Job.id).where(text_match("scrap", names))
        compiled = search.compile(dialect=fresh.dialect, compile_kwargs={"literal_binds": True})
        plan = await _plan(fresh, str(compiled))
        assert "ix_jobs_skill_created" in plan, plan
        assert await _search(fresh, "scrap") == {"Web_Scraper"}

        await _downgrade(fresh, "0014")
        assert set(await _indexes(fresh)) == set(before)


async def test_updated_tables_leave_room_on_their_pages(fresh: AsyncEngine) -> None:
    await upgrade(fresh)
    if fresh.dialect.name != "postgresql":
        return  # (SQLite has no fill factor; the migration is a no-op there)

    async def options() -> dict[str, list[str] | None]:
        async with fresh.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT relname, reloptions FROM pg_class "
                    "WHERE relname IN ('jobs', 'job_attempts') AND relkind = 'r'"
                )
            )
            return {row[0]: row[1] for row in rows}

    assert await options() == {"jobs": ["fillfactor=70"], "job_attempts": ["fillfactor=70"]}

    await _downgrade(fresh, "0015")
    assert await options() == {"jobs": None, "job_attempts": None}
