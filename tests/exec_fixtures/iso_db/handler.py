"""Looks for skilljobs's own tables through the sessions it is given."""

from sqlalchemy import text


async def _try(session, sql):
    try:
        return (await session.execute(text(sql))).scalar()
    except Exception as exc:
        await session.rollback()
        return f"ERR {type(exc).__name__}"


async def execute(input_data, ctx):
    async with ctx["db_factory"]() as s:
        jobs = await _try(s, "select count(*) from jobs")
        configs = await _try(s, "select count(*) from skill_configs")
        await s.execute(text("create table if not exists notes (n integer)"))
        await s.execute(text("insert into notes values (1)"))
        await s.commit()
        url = str(s.get_bind().url)
    lazy = await _try(ctx["db"], "select count(*) from notes")
    return {
        "ok": True,
        "jobs": jobs,
        "configs": configs,
        "lazy": lazy,
        "url": url,
        "platform": "_platform_sessions" in ctx,
    }
