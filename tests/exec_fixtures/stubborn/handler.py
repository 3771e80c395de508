import asyncio


async def execute(input_data, runtime_context):
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # ignores the executor's cancellation: it must be abandoned, not awaited
    await asyncio.sleep(3600)
