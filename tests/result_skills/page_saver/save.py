import os
from pathlib import Path

ws = Path(os.environ["SKILL_WORKSPACE"])
out = ws / "page_1.txt"
out.write_text("page one\n")
print("Read /srv/inbox/customer-uploads/scan.pdf")
print(f"Saved page 1 as {out}")
