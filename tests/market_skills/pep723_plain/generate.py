"""pep723_media without its dependency: the baseline of bench/envs.py."""

import argparse
import os
import re

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", required=True)
    a = p.parse_args()
    slug = re.sub(r"[^a-z0-9]+", "-", a.prompt.lower()).strip("-")
    out = os.path.join(os.environ["SKILL_WORKSPACE"], slug + ".png")
    with open(out, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    print(f"MEDIA:{out}")
