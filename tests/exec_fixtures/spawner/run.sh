#!/usr/bin/env bash
# Leaves children behind and then hangs: every one of them must be killed.
DUR=$(echo "$SKILL_INPUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["dur"])')
sleep "$DUR" &
(sleep "$DUR" &)
bash -c "sleep $DUR" &
sleep "$DUR"
