"""Reports what its environment can import."""

import argparse
import importlib.util
import json
import sys

import six

if __name__ == "__main__":
    argparse.ArgumentParser().parse_args()
    print(
        json.dumps(
            {
                "ok": True,
                "six": six.__version__,
                "prefix": sys.prefix,
                "executable": sys.executable,
                # the worker's own packages must not be visible here
                "sees_httpx": importlib.util.find_spec("httpx") is not None,
                "sees_slugify": importlib.util.find_spec("slugify") is not None,
            }
        )
    )
