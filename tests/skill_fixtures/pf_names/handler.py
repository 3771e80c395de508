PARAM_KEYS = ["a", "b"]

SCHEMA = {
    "type": "object",
    "properties": {
        "keyword": {"type": "string", "description": "search word"},
        "author": {"type": "string", "description": "who wrote it"},
        "tokenizer": {"type": "string", "description": "which tokenizer"},
        "api_token": {"type": "string", "description": "credential"},
        "query": {"type": "string", "description": "plain"},
    },
}


async def execute(input_data, runtime_context):
    return {}
