import argparse
import json

RECIPES = [
    {
        "title": "Quick Pasta",
        "url": None,
        "servings": 2,
        "ingredients": ["200 g spaghetti", "2 cloves garlic", "olive oil"],
        "instructions": "Boil the pasta. Fry the garlic in the oil. Toss together.",
    },
    {
        "title": "Tomato Soup",
        "url": None,
        "servings": 4,
        "ingredients": ["1 kg tomatoes", "1 onion", "salt"],
        "instructions": "Roast the tomatoes and the onion, blend, season with salt.",
    },
]


def main():
    parser = argparse.ArgumentParser(prog="recipes")
    sub = parser.add_subparsers(dest="cmd", required=True)
    exp = sub.add_parser("export")
    exp.add_argument("--format", choices=["json", "text"], default="text")
    sub.add_parser("count")
    args = parser.parse_args()
    if args.cmd == "count":
        print(f"{len(RECIPES)} recipes")
    elif args.format == "json":
        print(json.dumps(RECIPES, indent=2))
    else:
        for r in RECIPES:
            print(r["title"])


if __name__ == "__main__":
    main()
