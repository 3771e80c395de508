async def execute(input_data, ctx):
    return {"ok": True, "message": "done"}
