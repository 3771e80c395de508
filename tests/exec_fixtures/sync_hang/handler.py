import time


def run(input_data, ctx):
    time.sleep(float(input_data.get("sleep", 30)))
    return {"ok": True}
