async def execute(input_data, runtime_context):
    provider = runtime_context.get("provider")
    if provider is None:
        return {"success": False, "error_type": "config", "error": "no model"}
    resp = await provider.complete(
        [{"role": "user", "content": input_data["prompt"]}],
        system="be brief",
        max_tokens=50,
        temperature=0.2,
    )
    return {
        "ok": True,
        "text": resp.text,
        "in": resp.input_tokens,
        "out": resp.output_tokens,
        "stop": resp.stop_reason,
    }
