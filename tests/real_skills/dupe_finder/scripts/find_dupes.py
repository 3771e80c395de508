"""Find duplicate files by SHA-256 (reports errors on stdout, exits 1)."""

import hashlib
import json
import os
import sys
from pathlib import Path


def main():
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    folder = Path(os.environ.get("SKILL_WORKSPACE") or ".") / data.get("folder", "")
    print(f"Scanning {folder.name or '.'} ...")
    if not folder.is_dir():
        print(f"Error: folder not found: {data.get('folder', '')}")
        sys.exit(1)
    seen = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            seen.setdefault(hashlib.sha256(p.read_bytes()).hexdigest(), []).append(p.name)
    groups = [names for names in seen.values() if len(names) > 1]
    print(json.dumps({"duplicates": groups, "groups": len(groups)}))


if __name__ == "__main__":
    main()
