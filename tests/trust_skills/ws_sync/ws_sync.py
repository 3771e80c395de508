"""ws_sync: write, link and name files in the workspace; answer with its listing."""

import json
import os
import sys


def main() -> None:
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    ws = os.environ["SKILL_WORKSPACE"]
    for name, text in (data.get("write") or {}).items():
        with open(os.path.join(ws, name), "w") as fh:
            fh.write(text)
    for name, target in (data.get("symlink") or {}).items():
        os.symlink(target, os.path.join(ws, name))
    out = {"message": "done", "listing": sorted(os.listdir(ws))}
    if "declare" in data:
        out["local_path"] = data["declare"]
    if data.get("leak"):  # a careless skill naming a host file in its answer
        out["files"] = ["/etc/hostname", *(data.get("also") or [])]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
