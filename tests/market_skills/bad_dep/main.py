import argparse

if __name__ == "__main__":
    argparse.ArgumentParser().parse_args()
    print("{}")
