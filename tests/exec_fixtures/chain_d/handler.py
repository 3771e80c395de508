async def execute(input_data, runtime_context):
    return {"ok": True, "level": runtime_context["call_skill"].depth}
