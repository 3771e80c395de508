import asyncio


async def execute(input_data, runtime_context):
    await asyncio.sleep(float(input_data.get("seconds", 1)))
    return {"message": "slow task done"}
