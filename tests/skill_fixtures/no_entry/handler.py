def helper(x):
    return x


async def process(input_data, runtime_context):
    return {}
