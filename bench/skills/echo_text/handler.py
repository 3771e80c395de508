async def execute(input_data, ctx):
    return {"ok": True, "message": str(input_data.get("text", ""))}
