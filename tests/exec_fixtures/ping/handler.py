async def execute(input_data, runtime_context):
    call = runtime_context["call_skill"]
    return {"ok": True, "level": call.depth, "next": await call("pong", {})}
