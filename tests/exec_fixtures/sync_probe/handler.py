import threading


def run(input_data, ctx):
    return {
        "db_is_none": ctx["db"] is None,
        "has_call_skill": "call_skill" in ctx,
        "in_main_thread": threading.current_thread() is threading.main_thread(),
        "got": input_data,
    }
