async def execute(input_data, runtime_context):
    return {"success": False, "error": "no such customer", "user_message": "Check the id"}
