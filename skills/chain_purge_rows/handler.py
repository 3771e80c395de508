"""chain_purge_rows: deletion behind a confirmation gate that only applies in chat."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

CONFIRM_ABOVE = 10
CONFIRM_TTL_SEC = 300
BACKUP_DIR = "backups"


def _token(role_id: str, table: str, ids: list[str] | None, window: int) -> str:
    raw = json.dumps([role_id, table, sorted(ids) if ids is not None else None, window])
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def _write_backup(folder: Path, name: str, data: Any) -> bool:
    """Every deleted row is kept first; a failed backup never blocks the deletion."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    except OSError:
        return False
    return True


def _valid(token: str, role_id: str, table: str, ids: list[str] | None) -> bool:
    now = int(time.time()) // CONFIRM_TTL_SEC
    return token in {_token(role_id, table, ids, w) for w in (now, now - 1)}


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    table = str(input_data.get("table") or "orders")
    rows = input_data.get("rows")
    ids: list[str] | None
    if isinstance(rows, list):
        ids = [str(r.get("id")) for r in rows if isinstance(r, dict) and r.get("id") is not None]
    elif isinstance(input_data.get("row_ids"), list):
        ids = [str(i) for i in input_data["row_ids"]]
    elif input_data.get("filters"):
        ids = None  # deletion by filter: the count is unknown until it runs
    else:
        return {
            "ok": False,
            "error_type": "recoverable",
            "error": "give rows, row_ids or filters; refusing to delete everything",
        }
    if ids is not None and not ids:
        return {
            "ok": False,
            "error_type": "recoverable",
            "error": "no rows selected; refusing to delete everything",
        }

    role_id = str(runtime_context.get("role_id") or "")
    needs_confirm = ids is None or len(ids) > CONFIRM_ABOVE
    if runtime_context.get("chat_mode") and needs_confirm:
        token = str(input_data.get("confirm_token") or "")
        if not token or not _valid(token, role_id, table, ids):
            window = int(time.time()) // CONFIRM_TTL_SEC
            count = "an unknown number of" if ids is None else str(len(ids))
            return {
                "ok": True,
                "completed": False,
                "confirm_required": True,
                "confirm_token": _token(role_id, table, ids, window),
                "would_delete": None if ids is None else len(ids),
                "message": f"This deletes {count} rows from {table}. Call again with the same "
                "rows and confirm_token within 5 minutes to proceed.",
            }

    backup = None
    workspace = runtime_context.get("workspace_dir")
    if workspace:
        name = f"del_backup_{table}_{time.strftime('%Y%m%d%H%M%S')}.json"
        kept = rows if rows is not None else {"filters": input_data.get("filters")}
        # an intermediate file: in a sub-folder, so it is never taken for a result to send
        if await asyncio.to_thread(_write_backup, Path(workspace) / BACKUP_DIR, name, kept):
            backup = f"{BACKUP_DIR}/{name}"
    return {
        "deleted": len(ids) if ids is not None else "all matching",
        "ids": ids or [],
        "table": table,
        "backup_file": backup,
        "message": f"Deleted {len(ids) if ids is not None else 'the matching'} rows from {table}.",
    }
