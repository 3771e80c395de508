import asyncio
import time

from bench import spans


async def execute(input_data, ctx):
    t0 = time.perf_counter()
    await asyncio.sleep(0.1)
    spans.SPANS.append((t0, time.perf_counter()))
    return {"ok": True, "message": "slept"}
