import argparse
import json
import os
import sys

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("--values", nargs="*", type=int, default=[])
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--label", default="")
    a = p.parse_args()
    ctx = json.loads(os.environ.get("SKILL_CONTEXT") or "{}")
    print("working...", file=sys.stderr)
    print(
        json.dumps(
            {
                "ok": True,
                "argv": sys.argv[1:],
                "cmd": a.cmd,
                "total": sum(a.values),
                "dry_run": a.dry_run,
                "label": a.label,
                "ctx_keys": sorted(ctx),
                "ctx": ctx,
                "input": json.loads(os.environ["SKILL_INPUT"]),
                "workspace": os.environ["SKILL_WORKSPACE"],
                "skill_dir": os.environ["SKILL_DIR"],
                "cwd": os.getcwd(),
                "env": {
                    k: v
                    for k, v in os.environ.items()
                    if k.startswith(("OPENAI_", "ANTHROPIC_", "MYINC_", "SKILLJOBS_", "SJT_"))
                },
            }
        )
    )
