import sys

if __name__ == "__main__":
    for i in range(30):
        print(f"progress line {i}")
    print("ERROR: quota exceeded for project demo, please contact an administrator")
    sys.exit(1)
