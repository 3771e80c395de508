import time


async def execute(input_data, ctx):
    end = time.perf_counter() + float(input_data.get("seconds", 1.0))
    rounds = 0
    while time.perf_counter() < end:
        sum(i * i for i in range(10_000))
        rounds += 1
    return {"ok": True, "message": f"burned {rounds} rounds", "rounds": rounds}
