#!/bin/sh
# argv: --token DIGITS
setsid sleep "60.$2" </dev/null >/dev/null 2>&1 &
sleep "61.$2"
echo '{"text": "slept"}'
