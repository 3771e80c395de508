async def execute(input_data, runtime_context):
    return {
        "ok": True,
        "level": runtime_context["call_skill"].depth,
        "next": await runtime_context["call_skill"]("chain_b", {}),
    }
