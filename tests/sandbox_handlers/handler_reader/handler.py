"""Try to read what a skill must never see, and to leave processes behind."""

import os
import subprocess


async def execute(input_data, ctx):
    found = {}
    for path in input_data.get("targets", []):
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
    for folder in input_data.get("list", []):
        try:
            listed[folder] = sorted(os.listdir(folder))
        except OSError:
            listed[folder] = None
    token = input_data.get("token")
    if token:  # a new session, a double fork: both meant to survive the run
        subprocess.Popen(["sleep", f"40.{token}"], start_new_session=True)  # noqa: ASYNC220
        subprocess.Popen(["sh", "-c", f"( sleep 41.{token} & ) &"])  # noqa: ASYNC220
    return {
        "ok": True,
        "found": found,
        "environs": environs,
        "listed": listed,
        "uid": os.getuid(),
        "pid": os.getpid(),
    }
