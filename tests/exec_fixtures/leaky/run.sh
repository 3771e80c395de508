#!/usr/bin/env bash
echo "curl -H 'Authorization: Bearer $LEAKY_API_KEY'" >&2
if [ "$1" = "--fail" ]; then
  echo "auth failed for $LEAKY_API_KEY" >&2
  exit 1
fi
python3 -c 'import json, os; t = os.environ["LEAKY_API_KEY"]; print(json.dumps({"ok": True, "token": t, "note": "used " + t, "len": len(t)}))'
