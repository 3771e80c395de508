import asyncio


async def execute(input_data, runtime_context):
    await asyncio.sleep(3600)
    return {"ok": True}
