async def execute(input_data):
    return {}
