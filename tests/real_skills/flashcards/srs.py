"""Spaced-repetition helper: which cards of a deck are due."""

import argparse


def build_parser():
    p = argparse.ArgumentParser(prog="srs", description="Show due flashcards.")
    p.add_argument("--deck", required=True, help="deck name")
    p.add_argument("--limit", type=int, default=3)
    return p


def main():
    args = build_parser().parse_args()
    cards = [f"{args.deck} card {i}" for i in range(1, args.limit + 1)]
    print(f"{len(cards)} cards due in {args.deck}:")
    for c in cards:
        print(f"  * {c}")


if __name__ == "__main__":
    main()
