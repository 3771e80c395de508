import sys
import warnings


def main():
    warnings.warn("pkg_resources is deprecated as an API", DeprecationWarning, stacklevel=1)
    warnings.warn("the default of 'strict' will change", FutureWarning, stacklevel=1)
    print("Opening scan.pdf (3 pages)")
    print("Detected image-based PDF, use --vision mode instead")
    sys.exit(1)


if __name__ == "__main__":
    warnings.simplefilter("always")
    main()
