"""Print the text given on the command line."""

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description="print a text")
    parser.add_argument("--text", required=True)
    print(parser.parse_args().text)


if __name__ == "__main__":
    main()
