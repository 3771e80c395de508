import argparse

import slugify_not_declared  # noqa: F401

if __name__ == "__main__":
    argparse.ArgumentParser().parse_args()
