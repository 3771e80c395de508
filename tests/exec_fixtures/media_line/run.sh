#!/usr/bin/env bash
printf 'PNGDATA' > "$SKILL_WORKSPACE/chart.png"
echo "rendered the chart" >&2
echo "chart ready"
echo "$SKILL_WORKSPACE/chart.png"
echo "MEDIA_URL: https://cdn.example.com/clip.mp4"
