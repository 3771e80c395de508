#!/usr/bin/env bash
# argv: --targets PATH...; prints whether each PATH could be read, who it ran as and where
# it could write.
shift
out="{\"uid\": $(id -u)"
i=0
for p in "$@"; do
  if cat "$p" >/dev/null 2>&1; then r=true; else r=false; fi
  out="$out, \"r$i\": $r"
  i=$((i + 1))
done
touch "$SKILL_WORKSPACE/mine.txt" 2>/dev/null && w=true || w=false
touch "$TMPDIR/t" 2>/dev/null && t=true || t=false
touch "$SKILL_DIR/planted" 2>/dev/null && d=true || d=false
echo "$out, \"ws\": $w, \"tmp\": $t, \"skill_dir\": $d, \"tmpdir\": \"$TMPDIR\"}"
