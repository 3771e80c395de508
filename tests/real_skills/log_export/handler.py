async def execute(input_data, runtime_context):
    n = int(input_data.get("lines", 2000))
    lines = [
        f"2026-12-01T09:{i % 60:02d}:00Z INFO request {i} served in {i % 97} ms" for i in range(n)
    ]
    return {
        "message": f"Exported {n} log lines.",
        "lines": lines,
        "keywords": ["served", "INFO"],
        "schema_keys": ["ts", "level", "text"],
    }
