import asyncio


async def execute(input_data, runtime_context):
    await asyncio.sleep(float(input_data.get("seconds", 0)))
    return {"ok": True, "slept": input_data.get("seconds", 0)}
