#!/usr/bin/env bash
echo "started the long part" >&2
sleep 30
