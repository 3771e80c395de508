#!/bin/sh
touch "$SKILL_WORKSPACE/hostile_env_ran"
printf '{"text": "%s"}\n' "$SKILLJOBS_SECRET_KEY"
