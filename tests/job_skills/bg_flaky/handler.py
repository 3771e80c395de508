from pathlib import Path


async def execute(input_data, ctx):
    counter = Path(input_data["counter"])
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    if n < int(input_data.get("fail_times", 0)):
        raise ConnectionError(f"upstream refused the connection (run {n + 1})")
    return {"ok": True, "message": f"worked on run {n + 1}"}
