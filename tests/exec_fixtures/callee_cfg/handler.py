async def execute(input_data, runtime_context):
    return {
        "ok": True,
        "input": input_data,
        "api_key": runtime_context.get("api_key"),
        "api_key_len": len(runtime_context.get("api_key") or ""),
        "region": runtime_context.get("region"),
        "configs_for": sorted(
            k
            for k, v in (runtime_context.get("skill_configs") or {}).items()
            if isinstance(v, dict)
        ),
    }
