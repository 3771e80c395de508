import asyncio


async def execute(input_data, ctx):
    await asyncio.sleep(0.1)
    return {"ok": True, "message": "slept"}
