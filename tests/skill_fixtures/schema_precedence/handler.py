input_schema = {"type": "object", "properties": {"from_code": {"type": "string"}}}


async def execute(input_data, runtime_context):
    return {}
