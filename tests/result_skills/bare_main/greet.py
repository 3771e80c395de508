import json
import os
import sys


def main():
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    print(
        f"Hello {data.get('name', 'world')}, from pid-separate process: {os.getpid() != int(data.get('worker_pid', 0))}"
    )
    print(f"argv0: {os.path.basename(sys.argv[0])}")


main()
