import time


def execute(input_data, runtime_context):
    progress = runtime_context.get("progress")
    if progress is not None:
        progress("indexing")
        progress("still indexing")  # told once
    time.sleep(float(input_data.get("seconds", 0.3)))
    return {"message": "busy task done"}
