async def execute(input_data, ctx):
    keep = {}
    for k, v in ctx.items():
        if k in ("db", "db_factory", "call_skill", "provider", "progress"):
            keep[k] = None if v is None else type(v).__name__
        else:
            keep[k] = v
    return {"ok": True, "ctx": keep}
