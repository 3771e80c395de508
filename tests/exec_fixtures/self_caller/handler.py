async def execute(input_data, runtime_context):
    return {"ok": True, "got": await runtime_context["call_skill"]("self_caller", {})}
