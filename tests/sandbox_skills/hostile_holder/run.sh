#!/bin/sh
touch "$SKILL_WORKSPACE/holder_started"
sleep 1.5
echo '{"text": "held"}'
