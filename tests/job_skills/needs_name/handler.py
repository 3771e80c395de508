async def execute(input_data, ctx):
    return {"ok": True, "message": f"hello {input_data['name']}"}
