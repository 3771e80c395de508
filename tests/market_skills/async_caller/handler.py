import time


async def execute(input_data, runtime_context):
    t0 = time.monotonic()
    got = await runtime_context["call_skill"]("slow_async", {"seconds": input_data["seconds"]})
    return {"ok": True, "got": got, "took": time.monotonic() - t0}
