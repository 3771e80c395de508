puts '{"ok": true}'
