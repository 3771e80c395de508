#!/usr/bin/env bash
echo "curl -H 'Authorization: Bearer $LEAKY_API_KEY'" >&2
if [ "$1" = "--fail" ]; then
  echo "auth failed for $LEAKY_API_KEY" >&2
  exit 1
fi
printf '{"ok": true, "token": "%s", "note": "used %s", "len": %d}\n' "$LEAKY_API_KEY" "$LEAKY_API_KEY" "${#LEAKY_API_KEY}"
