"""Prints its whole environment and tries to read the files it is given."""

import argparse
import json
import os
import sys


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode("utf-8", "replace")
    except OSError as exc:
        return f"ERR {type(exc).__name__}"


if __name__ == "__main__":
    argparse.ArgumentParser().parse_known_args()
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    probes = {p: _read(p) for p in data.get("probe_list") or []}
    print(json.dumps({"ok": True, "env": dict(os.environ), "probes": probes, "uid": os.getuid()}))
    sys.exit(0)
