#!/bin/sh
printf '{"text": "ran", "uid": %s}\n' "$(id -u)"
