async def execute(input_data, runtime_context):
    return {"image_url": input_data["url"], "title": "Weekly orders"}
