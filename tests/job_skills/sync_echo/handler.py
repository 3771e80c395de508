async def execute(input_data, ctx):
    return {
        "ok": True,
        "echo": input_data,
        "chat_mode": ctx.get("chat_mode"),
        "channel": ctx.get("channel"),
    }
