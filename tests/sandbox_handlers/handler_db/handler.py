async def execute(input_data, ctx):
    async with ctx["db_factory"]() as session:
        rows = await session.execute("select 1")
    return {"ok": True, "rows": list(rows)}
