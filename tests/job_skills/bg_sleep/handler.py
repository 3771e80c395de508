import asyncio
import os


async def execute(input_data, ctx):
    await asyncio.sleep(float(input_data.get("seconds", 0)))
    marker = input_data.get("marker")
    if marker:
        with open(marker, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    return {"ok": True, "message": f"slept {input_data.get('seconds', 0)}s", "pid": os.getpid()}
