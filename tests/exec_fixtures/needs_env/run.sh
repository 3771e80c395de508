#!/usr/bin/env bash
printf '{"ok": true, "token_len": %d}\n' "${#SJT_EXEC_TOKEN}"
