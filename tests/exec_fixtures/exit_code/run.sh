#!/usr/bin/env bash
echo '{"ok": true, "but": "exit code wins"}'
echo "Traceback: the database said no" >&2
exit 3
