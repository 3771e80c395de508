async def execute(input_data, ctx):
    return {"ok": False, "error": "the report source has no data for that day"}
