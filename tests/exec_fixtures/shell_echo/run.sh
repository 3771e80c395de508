#!/usr/bin/env bash
echo "log line" >&2
printf '{"ok": true, "args": "%s", "input": %s}\n' "$*" "$SKILL_INPUT"
