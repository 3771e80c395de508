import os


async def execute(input_data, ctx):
    total = sum(input_data.get("amounts", []))
    print(f"total is {total}")
    with open(os.path.join(ctx["workspace_dir"], "total.txt"), "w") as fh:
        fh.write(str(total))
    answer = await ctx["call_skill"]("handler_callee", {"x": total})
    return {
        "ok": True,
        "total": total,
        "doubled": answer,
        "depth": ctx["call_skill"].depth,
        "role": ctx.get("role_id"),
        "db": repr(ctx.get("db")),
    }
