"""A flashcard tool: argparse subcommands, as marketplace CLIs are written."""

import argparse
import json
import sys

if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="deck")
    sub = p.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("add")
    add.add_argument("front")
    add.add_argument("--back", required=True)
    count = sub.add_parser("count")
    count.add_argument("--deck", default="default")
    a = p.parse_args()
    print(json.dumps({"ok": True, "cmd": a.cmd, "args": vars(a), "argv": sys.argv[1:]}))
