#!/bin/sh
# argv: --target DIR: flip sub/ between a folder and a symlink to DIR, in the background
target="$2"
cd "$SKILL_WORKSPACE" || exit 1
mkdir -p sub.d && touch sub.d/a sub.d/b
ln -sfn "$target" sub
setsid sh -c "while :; do rm -f sub; mv sub.d sub 2>/dev/null; mv sub sub.d; ln -sfn '$target' sub; done" \
  </dev/null >/dev/null 2>&1 &
sleep 0.2
echo '{"text": "swapping"}'
