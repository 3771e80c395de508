"""The result envelope: what every skill run turns into, whichever line ran it.

``normalize`` makes any return value a JSON-safe dict and flips "fake successes"
(``ok``/``success`` explicitly ``False``) into failures with a meaningful reason;
``failure`` builds a failure envelope; ``offload`` swaps a large successful result for a
small receipt and writes the full result into the workspace.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import json
import logging
import math
import os
import re
import secrets
import uuid
from collections.abc import Mapping
from decimal import Decimal
from pathlib import PurePath
from typing import Any, TypeGuard

import pydantic_core

from jobs.context import workspace_dir
from jobs.jsontext import JSON
from jobs.settings import Settings

log = logging.getLogger(__name__)

OFFLOAD_THRESHOLD = 12_000
DISPLAY_MD_MAX = 15_000
PASS_STR_MAX = 500
PASS_DICT_MAX = 1_000
SAMPLE_ITEMS = 3
SAMPLE_ITEM_MAX = 300
SCHEMA_KEYS_MAX = 20
MEDIA_LIST_KEYS = ("images", "videos", "files", "audios")
MEDIA_SCALAR_KEYS = ("filename", "local_path", "download_url", "abs_url", "media")
MEDIA_LIST_MAX = 12_000
MEDIA_OTHER_MAX = 2_000
BYTES_INLINE_MAX = 1_000_000  # larger binary payloads must be written to the workspace

RECOVERABLE_TYPES = frozenset({"recoverable", "retryable", "need_input", "need_param"})
RECEIPT_KEYS = ("ok", "offloaded", "skill", "path", "chars", "schema_keys", "_hint")


class NotSerializable(ValueError):
    """A skill returned a value that has no JSON form."""


# --------------------------------------------------------------------------- serialization


def to_jsonable(value: object) -> JSON:
    """A JSON-safe copy of ``value`` (raises ``NotSerializable`` naming the bad spot)."""
    try:
        # Fast path: plain JSON data only needs a canonical copy (C encoder/decoder).
        copy: JSON = json.loads(json.dumps(value, ensure_ascii=False, allow_nan=False))
        return copy
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return _convert(value, "result", set())
    except RecursionError:
        raise NotSerializable("result is nested too deeply to serialize") from None


def _convert(value: object, where: str, seen: set[int]) -> JSON:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, enum.Enum):
        return _convert(value.value, where, seen)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Decimal):
        return _decimal(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID | PurePath):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _binary(bytes(value), where)
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if id(value) in seen:
            raise NotSerializable(f"{where} refers back to itself (circular reference)")
        seen.add(id(value))
        try:
            if isinstance(value, Mapping):
                return {_key(k, where): _convert(v, f"{where}.{k}", seen) for k, v in value.items()}
            items = value
            if isinstance(value, set | frozenset):
                items = sorted(value, key=repr)
            return [_convert(v, f"{where}[{i}]", seen) for i, v in enumerate(items)]
        finally:
            seen.discard(id(value))
    raise NotSerializable(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__} object, which has "
        "no JSON form; return plain data (dict, list, str, number, bool, None)"
    )


def _decimal(value: Decimal) -> JSON:
    if not value.is_finite():
        return str(value)
    if value == value.to_integral_value():
        return int(value)
    as_float = float(value)
    # Keep the exact digits when a float would lose them (money, high precision).
    return as_float if Decimal(repr(as_float)) == value else str(value)


def _binary(raw: bytes, where: str) -> dict[str, Any]:
    if len(raw) > BYTES_INLINE_MAX:
        raise NotSerializable(
            f"{where} is {len(raw):,} bytes of binary data; write it to a file in the "
            "workspace and return its filename instead"
        )
    return {
        "encoding": "base64",
        "data": base64.b64encode(raw).decode("ascii"),
        "bytes": len(raw),
        "note": "binary data returned by the skill, encoded as base64",
    }


def _key(key: object, where: str) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "null"
    if isinstance(key, int | float | Decimal | uuid.UUID | enum.Enum):
        return str(key.value if isinstance(key, enum.Enum) else key)
    if isinstance(key, dt.date | dt.datetime):
        return key.isoformat()
    raise NotSerializable(f"{where} has a key of type {type(key).__qualname__}; keys must be text")


# --------------------------------------------------------------------------- the envelope


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or value in ([], {})


def _reason(value: object) -> str:
    return value.strip() if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def normalize(raw: object, skill: str) -> dict[str, Any]:
    """Any return value → a JSON-safe envelope dict with ``ok`` set consistently.

    Non-dict → ``{"result": value}``. ``ok is False`` or ``success is False`` is a
    failure (missing/None is not); the reason is taken from ``error``/``msg`` (ok=False)
    or ``stderr``/``error``/``msg``/``user_message`` (success=False). A non-zero ``code``
    alone does not make a failure.
    """
    if dataclasses.is_dataclass(raw) and not isinstance(raw, type):
        raw = dataclasses.asdict(raw)
    try:
        data = to_jsonable(raw)
    except NotSerializable as exc:
        return failure(
            f"skill {skill!r} returned a result that cannot be stored: {exc}",
            error_type="config",
            non_retriable=True,
            skill=skill,
        )
    env: dict[str, Any] = data if isinstance(data, dict) else {"result": data}

    if env.get("ok") is False:
        sources: tuple[str, ...] = ("error", "msg")
        flag = "ok: false"
    elif env.get("success") is False:
        sources = ("stderr", "error", "msg", "user_message")
        flag = "success: false"
    else:
        env["ok"] = True
        return env

    reason = next((_reason(env[k]) for k in sources if not _blank(env.get(k))), "")
    if not reason:
        reason = f"skill {skill!r} reported a failure ({flag}) without saying why"
    env["error"] = reason
    env["ok"] = False
    if env.get("success") is True:
        env["success"] = False
    return env


def failure(error: str, *, error_type: str | None = None, **extra: Any) -> dict[str, Any]:
    """A failure envelope: ``{"ok": False, "error": ..., "error_type"?: ..., **extra}``."""
    env: dict[str, Any] = {"ok": False, "error": error.strip() or "the skill run failed"}
    if error_type:
        env["error_type"] = error_type
    env.update(extra)
    return env


def is_failure(env: object) -> TypeGuard[dict[str, Any]]:
    """``ok`` or ``success`` explicitly ``False`` (missing or ``None`` is not failure)."""
    return isinstance(env, dict) and (env.get("ok") is False or env.get("success") is False)


def is_recoverable(env: object) -> bool:
    """A failure the caller can fix by changing the input (fed back, not budgeted)."""
    if not is_failure(env):
        return False
    if str(env.get("error_type") or "").lower() in RECOVERABLE_TYPES:
        return True
    if env.get("need_param") not in (None, "", False):
        return True
    return any(env.get(flag) is True for flag in ("recoverable", "retryable", "need_input"))


def is_non_retriable(env: object) -> bool:
    """``non_retriable`` only counts on failures that are not recoverable."""
    return is_failure(env) and not is_recoverable(env) and env.get("non_retriable") is True


def is_partial(env: object) -> bool:
    """Success with ``completed: False`` or a ``warning``."""
    if not isinstance(env, dict) or is_failure(env):
        return False
    if env.get("success") is not True and env.get("ok") is not True:
        return False
    return env.get("completed") is False or not _blank(env.get("warning"))


# --------------------------------------------------------------------------- offload

_unsafe_name = re.compile(r"[^A-Za-z0-9_\-]+")


def _encode(value: object) -> bytes:
    """Compact UTF-8 JSON (Rust encoder: offloading a multi-MB result stays in budget)."""
    return pydantic_core.to_json(value, fallback=str)


def _chars(data: bytes, limit: int | None = None) -> int:
    """Characters in UTF-8 ``data``; with ``limit``, exact only up to the limit."""
    if data.isascii():
        return len(data)
    if limit is not None and len(data) > 4 * limit:
        return len(data)  # > limit whatever the characters are
    return len(data.decode("utf-8"))


def offload(
    env: dict[str, Any], workspace: str | os.PathLike[str] | None, skill: str
) -> dict[str, Any]:
    """A successful result over 12,000 JSON chars → file in ``<workspace>/.toolout/`` +
    receipt. Failures, small results and calls without a workspace are returned as is."""
    if not isinstance(env, dict) or is_failure(env) or env.get("offloaded") is True:
        return env
    if workspace is None or str(workspace) == "":
        return env
    # Encode each top-level value once: the sizes drive the receipt and the same bytes are
    # written to the file, so a large result is serialized exactly one time.
    parts = [(k, _encode(str(k)), _encode(v)) for k, v in env.items()]
    total = 1 + sum(_chars(kb) + 1 + _chars(vb) + 1 for _, kb, vb in parts)
    if total <= OFFLOAD_THRESHOLD:
        return env

    from pathlib import Path

    folder = Path(workspace) / ".toolout"
    safe = _unsafe_name.sub("_", skill).strip("_") or "skill"
    path = folder / f"toolout_{safe}_{secrets.token_hex(4)}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(b"{")
            for i, (_, kb, vb) in enumerate(parts):
                fh.write(b"," + kb if i else kb)
                fh.write(b":")
                fh.write(vb)
            fh.write(b"}")
    except OSError as exc:
        log.warning("could not offload the result of %s to %s: %s", skill, folder, exc)
        return env

    receipt: dict[str, Any] = {
        "ok": True,
        "offloaded": True,
        "skill": skill,
        "path": str(path),
        "chars": total,
        "schema_keys": [str(k) for k in list(env)[:SCHEMA_KEYS_MAX]],
        "_hint": (
            f"The full result ({total:,} chars) was saved to {path}; read that file "
            "for the complete data. Lists are summarized here as <key>_count and "
            "<key>_sample (first items)."
        ),
    }
    for key, _, encoded in parts:
        if key not in RECEIPT_KEYS:
            _keep(receipt, key, env[key], encoded)
    return receipt


def _keep(receipt: dict[str, Any], key: str, value: object, encoded: bytes) -> None:
    """What of one top-level field the receipt carries (SPEC §5)."""
    if key == "display_md" and isinstance(value, str):
        receipt[key] = _cut_md(value)
    elif key in MEDIA_LIST_KEYS and _chars(encoded, MEDIA_LIST_MAX) < MEDIA_LIST_MAX:
        receipt[key] = value
    elif key in MEDIA_SCALAR_KEYS and _chars(encoded, MEDIA_OTHER_MAX) < MEDIA_OTHER_MAX:
        receipt[key] = value
    elif key == "warning" and isinstance(value, str):
        receipt[key] = value[:PASS_STR_MAX]  # a partial result stays visibly partial
    elif isinstance(value, list):
        if value:
            receipt[f"{key}_count"] = len(value)
            receipt[f"{key}_sample"] = [_sample(v) for v in value[:SAMPLE_ITEMS]]
        else:
            receipt[key] = []
    elif isinstance(value, str):
        if len(value) <= PASS_STR_MAX:
            receipt[key] = value
    elif isinstance(value, dict):
        if _chars(encoded, PASS_DICT_MAX) <= PASS_DICT_MAX:
            receipt[key] = value
    elif value is None or isinstance(value, bool | int | float):
        receipt[key] = value


def offload_sync(settings: Settings, env: object, ctx: Mapping[str, Any], skill: str) -> Any:
    """The sync line's answer (C4): a large successful result becomes its receipt, the full
    result written into the caller's workspace exactly as a background job's would be."""
    if not isinstance(env, dict) or is_failure(env):
        return env
    workspace = ctx.get("workspace_dir")
    if not workspace and settings is not None:
        workspace = workspace_dir(
            settings.resolved_workspace_root,
            str(ctx.get("role_id") or ""),
            str(ctx.get("session_id") or ""),
        )
    return offload(env, workspace, skill)


def _cut_md(text: str) -> str:
    if len(text) <= DISPLAY_MD_MAX:
        return text
    marker = "\n\n…(truncated; the full text is in the offloaded file)"
    return text[: DISPLAY_MD_MAX - len(marker)] + marker


def _sample(item: object) -> Any:
    if isinstance(item, str):
        return item if len(item) <= SAMPLE_ITEM_MAX else item[:SAMPLE_ITEM_MAX] + "…"
    encoded = _encode(item).decode("utf-8")
    if len(encoded) <= SAMPLE_ITEM_MAX:
        return item
    return encoded[:SAMPLE_ITEM_MAX] + "…"
