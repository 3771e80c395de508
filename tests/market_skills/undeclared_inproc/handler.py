async def execute(input_data, runtime_context):
    import yaml_not_declared  # noqa: F401

    return {"ok": True}
