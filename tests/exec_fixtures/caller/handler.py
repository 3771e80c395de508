async def execute(input_data, runtime_context):
    call = runtime_context["call_skill"]
    kwargs = dict(input_data.get("kwargs") or {})
    return {"ok": True, "got": await call(input_data["target"], input_data.get("args"), **kwargs)}
