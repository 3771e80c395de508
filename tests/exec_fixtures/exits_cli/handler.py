import json
import os
import sys


def main(input_data=None):
    sys.exit("use the command line")


if __name__ == "__main__":
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    print(json.dumps({"ok": True, "ran_as": "cli", "input": data}))
