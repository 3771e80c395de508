#!/usr/bin/env bash
# Reads its input from SKILL_INPUT (JSON) and prints plain text, like most shell skills.
set -euo pipefail
team=$(python3 -c 'import json,os; print(json.loads(os.environ.get("SKILL_INPUT","{}")).get("team","core"))')
echo "Stand-up notes for team ${team}"
echo "- merged: retry budget for transient failures"
echo "- merged: dashboard filters by skill"
echo "- in review: Feishu card rendering"
echo "notes written" >&2
