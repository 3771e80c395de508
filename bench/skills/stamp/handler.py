import time


async def execute(input_data, ctx):
    return {"ok": True, "message": "stamped", "started": time.time()}
