import sys
import zipfile
from pathlib import Path

if __name__ == "__main__":
    src = Path(sys.argv[1])
    out = Path(sys.argv[2] if len(sys.argv) > 2 else ".") / f"{src.name}.skill"
    with zipfile.ZipFile(out, "w") as zf:
        for p in src.rglob("*"):
            zf.write(p, p.relative_to(src.parent))
    print(out)
