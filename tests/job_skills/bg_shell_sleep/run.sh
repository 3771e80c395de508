#!/bin/sh
# Writes its pid and a child's pid, then sleeps: cancellation must kill both.
sleep 300 &
echo "$$ $!" > "$SKILL_WORKSPACE/pids"
wait
