#!/usr/bin/env bash
DUR=$(echo "$SKILL_INPUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dur"])')
sleep "$DUR" &
echo '{"ok": true, "left": "a child behind"}'
