#!/bin/sh
# disk_usage: free/used space of the disk holding a folder, as one JSON object on stdout.
set -u

target=""
while [ $# -gt 0 ]; do
    case "$1" in
        --path) target="${2:-}"; shift 2 ;;
        --path=*) target="${1#--path=}"; shift ;;
        *) echo "disk_usage: ignoring argument $1" >&2; shift ;;
    esac
done
[ -n "$target" ] || target="${SKILL_WORKSPACE:-.}"

json_string() {
    # JSON-escape backslashes, quotes and control characters of $1.
    printf '%s' "$1" | awk 'BEGIN { ORS = "" } {
        gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\r/, "\\r");
        if (NR > 1) print "\\n"; print }'
}

if [ ! -d "$target" ]; then
    printf '{"ok": false, "error": "folder %s does not exist", "error_type": "recoverable", "need_param": "path"}\n' \
        "$(json_string "$target")"
    exit 0
fi

# POSIX df output: Filesystem 1024-blocks Used Available Capacity Mounted-on
set -- $(df -Pk "$target" | awk 'NR == 2 { print $2, $3, $4, $5 }')
total_kb="${1:-0}"; used_kb="${2:-0}"; free_kb="${3:-0}"; percent="${4:-0%}"
percent="${percent%\%}"
folder_kb=$(du -sk "$target" 2>/dev/null | awk '{ print $1 }')
folder_kb="${folder_kb:-0}"

printf '{"ok": true, "path": "%s", "total_kb": %s, "used_kb": %s, "free_kb": %s, "used_percent": %s, "folder_kb": %s, "message": "%s KB free of %s KB (%s%% used); folder uses %s KB"}\n' \
    "$(json_string "$target")" "$total_kb" "$used_kb" "$free_kb" "$percent" "$folder_kb" \
    "$free_kb" "$total_kb" "$percent" "$folder_kb"
