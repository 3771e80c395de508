async def execute(input_data, runtime_context):
    rows = [
        {"model": "gpt-4o", "calls": 1200, "usd": 18.4},
        {"model": "claude-sonnet", "calls": 800, "usd": 12.1},
        {"model": "qwen-max", "calls": 300, "usd": 2.2},
        {"model": "deepseek-chat", "calls": 90, "usd": 0.3},
    ]
    return {
        "ok": True,
        "period": {"from": "2026-11-01", "to": "2026-11-30"},
        "total_usd": round(sum(r["usd"] for r in rows), 2),
        "models": rows,
        "schema_keys": ["model", "calls", "usd"],
        "primary_key": "model",
    }
