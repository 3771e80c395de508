"""Try to read what a skill must never see; print what was found."""

import json
import os
import time


def main() -> None:
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    ws = os.environ["SKILL_WORKSPACE"]
    wait_for = data.get("wait_for")
    if wait_for:  # another run of this workspace is running while we look
        deadline = time.monotonic() + 10
        while not os.path.exists(os.path.join(ws, wait_for)) and time.monotonic() < deadline:
            time.sleep(0.02)

    found = {}
    for path in data.get("targets", []):
        try:
            with open(path, "rb") as fh:
                found[path] = fh.read(4096).decode("utf-8", "replace")
        except OSError as exc:
            found[path] = None
            found[path + " error"] = exc.strerror

    environs = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    environs[pid] = fh.read().decode("utf-8", "replace")
            except OSError:
                pass

    listed = {}
    for folder in data.get("list", []):
        try:
            listed[folder] = sorted(os.listdir(folder))
        except OSError:
            listed[folder] = None

    print(json.dumps({"found": found, "environs": environs, "listed": listed, "uid": os.getuid()}))


if __name__ == "__main__":
    main()
