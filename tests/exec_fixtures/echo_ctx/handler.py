"""Reports what the runtime context holds (types for live objects)."""

import os


async def execute(input_data, runtime_context):
    ctx = runtime_context
    live = {k: type(ctx.get(k)).__name__ for k in ("db", "db_factory", "provider", "call_skill")}
    plain = {
        k: v
        for k, v in ctx.items()
        if k not in ("db", "db_factory", "provider", "call_skill", "abort_signal")
    }
    ws = ctx.get("workspace_dir")
    return {
        "ok": True,
        "input": input_data,
        "live": live,
        "ctx": plain,
        "workspace_exists": bool(ws) and os.path.isdir(ws),
        "call_depth": getattr(ctx.get("call_skill"), "depth", None),
    }
