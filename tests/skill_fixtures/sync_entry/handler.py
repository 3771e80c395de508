def helper():
    return 1


def run(input_data):
    return {"n": len(input_data)}


def handle(input_data, runtime_context):
    return {}
