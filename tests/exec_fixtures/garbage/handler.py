class Thing:
    pass


async def execute(input_data, runtime_context):
    if input_data.get("kind") == "nan":
        return {"value": float("nan"), "when": __import__("datetime").date(2026, 1, 2)}
    if input_data.get("kind") == "huge":
        return {"rows": ["x" * 1000 for _ in range(20000)]}
    if input_data.get("kind") == "fake_success":
        return {"success": False, "msg": "no rows matched"}
    return {"thing": Thing()}
