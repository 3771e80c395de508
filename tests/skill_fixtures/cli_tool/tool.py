import argparse
import json


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sub")
    print(json.dumps({"ok": True, "sub": parser.parse_args().sub}))


if __name__ == "__main__":
    main()
