import json

SCHEMA = json.loads('{"type": "object"}')


async def execute(input_data, runtime_context):
    return {}
