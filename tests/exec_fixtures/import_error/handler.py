raise RuntimeError("config file missing at import time")


async def execute(input_data, runtime_context):
    return {}
