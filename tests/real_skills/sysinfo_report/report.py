import os
import platform
import sys


def main():
    verbose = "--verbose" in sys.argv[1:]
    cwd = os.getcwd()
    print("System report")
    print(f"python: {platform.python_version()}")
    print(f"cpus: {os.cpu_count()}")
    print(f"argv: {' '.join(sys.argv[1:]) or '(none)'}")
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"cwd is the skill folder: {os.path.abspath(cwd) == here}")
    if verbose:
        print(f"platform: {platform.platform()}")
    with open("sysinfo.log", "w") as fh:  # a scratch file in the working directory
        fh.write("report written\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
