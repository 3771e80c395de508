import asyncio

LOOP = asyncio.get_event_loop()  # module-level, as older handlers do


async def execute(input_data, runtime_context):
    return {"ok": True, "same_loop": LOOP is asyncio.get_running_loop()}
