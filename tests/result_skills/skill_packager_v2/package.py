import sys

if __name__ == "__main__":
    print("Packaging skill: demo")
    print("Validating skill...")
    print("")
    print("ERROR: SKILL.md frontmatter has no 'description'")
    print("ERROR: name 'Demo' must be lowercase")
    print("Please fix the validation errors before packaging.")
    sys.exit(1)
