SCHEMA = {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}, "required": ["q"]}


async def execute(input_data, runtime_context):
    return {"ok": True, "q": input_data["q"]}
