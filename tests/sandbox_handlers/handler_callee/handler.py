def execute(input_data):
    return {"ok": True, "y": input_data["x"] * 2}
