async def execute(input_data, runtime_context, extra):
    return {}
