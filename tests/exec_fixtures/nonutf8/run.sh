#!/usr/bin/env bash
printf 'caf\xe9 \xff\xfe done\n'
