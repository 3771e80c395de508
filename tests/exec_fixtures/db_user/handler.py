from sqlalchemy import text


async def execute(input_data, runtime_context):
    db = runtime_context["db"]
    one = (await db.execute(text("select 1"))).scalar()
    async with runtime_context["db_factory"]() as session:
        two = (await session.execute(text("select 2"))).scalar()
    return {"ok": True, "one": one, "two": two, "db": type(db).__name__}
