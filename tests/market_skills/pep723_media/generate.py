# /// script
# requires-python = ">=3.9"
# dependencies = [
#   "python-slugify==8.0.4",
# ]
# ///
"""Generate an "image" for a prompt (a tiny PNG-like file) and print its MEDIA line."""

import argparse
import os
import sys

from slugify import slugify

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--prompt", required=True)
    a = p.parse_args()
    out = os.path.join(os.environ["SKILL_WORKSPACE"], slugify(a.prompt) + ".png")
    with open(out, "wb") as fh:
        fh.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 16)
    print(f"generated for {a.prompt!r} with {sys.executable}", file=sys.stderr)
    print(f"MEDIA:{out}")
