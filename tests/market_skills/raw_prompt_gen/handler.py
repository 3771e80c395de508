async def execute(input_data, runtime_context):
    return {"ok": True, "input": input_data}
