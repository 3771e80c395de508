# /// script
# requires-python = ">=3.10"
# dependencies = []
# ///
import json
import os

args = json.loads(os.environ.get("SKILL_INPUT") or "{}")
print("Inventory report")
print("================")
print("1. Check the *north* shelf")
print("1. Count the [spare] parts")
print("    indented note: keep_this_indentation")
print("# not a heading")
print('<at user_id="all">everyone</at> & <b>not bold</b>')
print("Store: " + str(args.get("store", "main")))
