"""The runtime context skills receive: fixed segment, config layers, background context.

Skills read a plain dict (they expect one); this module owns its vocabulary so that the
chat line, the workers and the chains all build it the same way.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs.crypto import is_secret_key
from jobs.models import JobRow

if TYPE_CHECKING:
    from _typeshed import ConvertibleToFloat

# SPEC §3 / skill spec §4.2: always present, typed empty value when unknown.
FIXED_SEGMENT: dict[str, Any] = {
    "raw_input": "",
    "attachments": [],
    "actor_name": "",
    "actor_emp_no": "",
    "actor_department": "",
    "actor_department_path": "",
    "actor_position": "",
    "actor_title": "",
    "actor_phone": "",
    "actor_email": "",
    "actor_tags": [],
    "actor_key": "",
    "channel": "",
    "triggered_at": 0.0,
    "triggered_at_str": "",
    "actor_id": "",
    "actor_is_admin": False,
}

# The ten actor_* vocabulary keys (call_skill passes exactly these through, plus EXTRA_KEYS).
ACTOR_KEYS: tuple[str, ...] = (
    "actor_name",
    "actor_emp_no",
    "actor_department",
    "actor_department_path",
    "actor_position",
    "actor_title",
    "actor_phone",
    "actor_email",
    "actor_tags",
    "actor_key",
)
EXTRA_KEYS: tuple[str, ...] = ("actor_id", "actor_is_admin")

# Admin proxy fill (§4.4): identity keys cleared when an admin fills in for someone.
ADMIN_CLEARED: tuple[str, ...] = (
    "actor_title",
    "actor_department",
    "actor_department_path",
    "actor_position",
    "actor_tags",
    "actor_key",
    "actor_id",
    "actor_emp_no",
)

# Context handed to a callee by call_skill (§9.1 `_CALL_PASS_BASE`).
CALL_PASS_BASE: tuple[str, ...] = (
    "role_id",
    "session_id",
    "user_id",
    "team_id",
    "org_id",
    "team_role",
    "is_admin",
    "channel",
    "chat_mode",
    "workspace_dir",
    "channel_registry",
    "db_factory",
    "abort_signal",
    "allow_sql",
)
CALL_PASS_KEYS: tuple[str, ...] = CALL_PASS_BASE + ACTOR_KEYS + EXTRA_KEYS

# Where in the chat platform a request came from, beyond the person: the conversation
# (a group chat or thread id), its kind when the chat layer says it, and the message that
# asked. A background job keeps them, so its result goes back to that conversation.
# ``message_thread_id``: the Telegram forum topic (or a Feishu thread, ``thread_id``) the
# request came from: the result is posted in that topic, not the group's general thread.
ORIGIN_KEYS: tuple[str, ...] = (
    "conversation_id",
    "conversation_type",
    "message_id",
    "message_thread_id",
    "thread_id",
)

# Platform keys: never taken from configs, never treated as secrets by name.
PLATFORM_KEYS: frozenset[str] = frozenset(
    {
        *CALL_PASS_BASE,
        *ORIGIN_KEYS,
        "skill_configs",
        "skill_args",
        "db",
        "provider",
        "call_skill",
        "request",
    }
)
VOCABULARY: frozenset[str] = frozenset(FIXED_SEGMENT) | PLATFORM_KEYS

# Objects that only live inside this process (never serialized into SKILL_CONTEXT or a job).
LIVE_KEYS: frozenset[str] = frozenset(
    {"db", "db_factory", "call_skill", "provider", "abort_signal", "request", "channel_registry"}
)

_ATTACHMENT_KEYS = ("type", "att_type", "filename", "local_path", "url")
_LIST_KEYS = frozenset(k for k, v in FIXED_SEGMENT.items() if isinstance(v, list))
_STR_KEYS = frozenset(k for k, v in FIXED_SEGMENT.items() if isinstance(v, str))


def _str(v: object) -> str:
    return "" if v is None else v if isinstance(v, str) else str(v)


def _truthy(v: object) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in {"1", "true", "yes", "on"}
    return bool(v)


def _float(v: ConvertibleToFloat | None) -> float:
    if v is None or v == "":
        return 0.0
    try:
        return float(v)
    except (TypeError, ValueError):  # (text that is no number, or a value of another type)
        return 0.0


def normalize_attachment(item: object) -> dict[str, str]:
    """One attachment → ``{type, att_type, filename, local_path, url}`` (§4.7)."""
    if isinstance(item, str):
        item = {"url": item} if "://" in item else {"local_path": item}
    if not isinstance(item, Mapping):
        item = {}
    kind = _str(item.get("type") or item.get("att_type") or item.get("media") or "")
    local = _str(item.get("local_path") or item.get("path") or "")
    url = _str(item.get("url") or "")
    name = _str(item.get("filename") or item.get("name") or "")
    if not name and (local or url):
        name = os.path.basename((local or url).split("?", 1)[0].rstrip("/"))
    kind = kind or "file"
    return {"type": kind, "att_type": kind, "filename": name, "local_path": local, "url": url}


def _tags(v: object) -> list[str]:
    if v in (None, ""):
        return []
    if isinstance(v, str):
        return [t.strip() for t in v.split(",") if t.strip()]
    if isinstance(v, (list, tuple, set)):
        return [_str(t) for t in v if t not in (None, "")]
    return [_str(v)]


def fixed_segment(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The fixed segment from any mapping: vocabulary keys only, typed empties, triggered_at
    as float seconds + ``YYYY-MM-DD HH:MM`` UTC, admin proxy fill, normalized attachments."""
    out: dict[str, Any] = {}
    for key in FIXED_SEGMENT:
        v = raw.get(key)
        if key in _STR_KEYS:
            out[key] = _str(v)
        elif key == "actor_tags":
            out[key] = _tags(v)
        elif key in _LIST_KEYS:
            out[key] = [normalize_attachment(a) for a in v] if isinstance(v, (list, tuple)) else []
        elif key == "actor_is_admin":
            out[key] = _truthy(v)
        else:
            out[key] = _float(v)
    if out["triggered_at"] and not out["triggered_at_str"]:
        out["triggered_at_str"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime(out["triggered_at"]))
    elif out["triggered_at_str"] and not out["triggered_at"]:
        try:
            import calendar

            out["triggered_at"] = float(
                calendar.timegm(time.strptime(out["triggered_at_str"][:16], "%Y-%m-%d %H:%M"))
            )
        except ValueError:
            pass
    if out["actor_is_admin"]:
        for key in ADMIN_CLEARED:
            out[key] = [] if key in _LIST_KEYS else ""
    return out


def channel_of(raw: Mapping[str, Any]) -> str:
    """``fixed_segment(raw)["channel"]`` without building the rest of the segment."""
    return _str(raw.get("channel"))


def config_key(key: str) -> str:
    """Stored/looked-up form of a config key: ``--api-token`` → ``api_token`` (case kept)."""
    return key.strip().lstrip("-").replace("-", "_")


def flatten_configs(skill: str, configs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The four injection layers (§5.1): ``skill_configs[<skill>]``, flattened
    ``skill_configs``, ``skill_args`` and top-level copies (platform keys never shadowed)."""
    values = {config_key(str(k)): v for k, v in (configs or {}).items()}
    out: dict[str, Any] = {k: v for k, v in values.items() if k not in VOCABULARY}
    out["skill_configs"] = {**values, skill: dict(values)}
    out["skill_args"] = dict(values)
    return out


def _present(v: object) -> bool:
    return v is not None and str(v).strip() != ""


RESERVED_PREFIX = "SKILLJOBS_"  # the worker's own settings: never a skill's config


def lookup_config(ctx: Mapping[str, Any], skill: str, key: str, default: object = None) -> Any:
    """A config value by the §5.1 order — the skill's own configuration only, never the
    worker's environment; ``default`` when missing. ``SKILLJOBS_*`` names are never a
    skill's configuration (the worker's own settings)."""
    if key.strip().upper().startswith(RESERVED_PREFIX):
        return default
    names = [config_key(key)]
    lower = names[0].lower()
    if lower != names[0]:
        names.append(lower)
    sc = ctx.get("skill_configs") or {}
    own = sc.get(skill) if isinstance(sc, Mapping) else None
    layers = (
        own if isinstance(own, Mapping) else {},
        sc if isinstance(sc, Mapping) else {},
        ctx.get("skill_args") or {},
        ctx,
    )
    for name in names:
        for layer in layers:
            v = layer.get(name) if isinstance(layer, Mapping) else None
            if _present(v) and not (layer is ctx and name in VOCABULARY):
                return v
    return default


def background_context(
    origin: Mapping[str, Any],
    *,
    skill: str,
    configs: Mapping[str, Any] | None,
    segment: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a queued job runs with (SPEC §3 + §11). JSON-serializable: the job row stores it.

    ``db``/``db_factory``/``workspace_dir``/``provider``/``call_skill`` are added by the
    executor at run time; ``team_role``/``request``/``channel_registry`` are absent on purpose.
    ``segment``: ``fixed_segment(origin)`` when the caller has built it already.
    """
    ctx: dict[str, Any] = flatten_configs(skill, configs)
    ctx.update(fixed_segment(origin) if segment is None else segment)
    ctx.update(
        role_id=_str(origin.get("role_id")),
        org_id=_str(origin.get("org_id")),
        session_id=_str(origin.get("session_id")),
        is_admin=_truthy(origin.get("is_admin")),
        chat_mode=True,
        user_id="",
        team_id="",
        abort_signal=None,
    )
    if _str(origin.get("locale")):
        ctx["locale"] = _str(origin.get("locale"))  # the language of what the job says (C14)
    for key in ORIGIN_KEYS:  # where the result goes back to (delivery.router.origin_of)
        if _str(origin.get(key)).strip():
            ctx[key] = _str(origin.get(key)).strip()
    return ctx


# ``conversation_type`` values that mean a one-to-one chat (Feishu ``p2p``, Telegram
# ``private``, DingTalk ``1``…): its ``conversation_id`` is the person's own chat.
DIRECT_CONVERSATIONS = frozenset({"p2p", "private", "single", "direct", "user", "1"})


def group_conversation(ctx: Mapping[str, Any]) -> str:
    """The group conversation a context names (``conversation_id`` without a ``chat:``
    prefix), or "" when it names none: no id, a one-to-one ``conversation_type``, or the
    person's own id (a Telegram private chat's id is the user's)."""
    conv = _str(ctx.get("conversation_id")).strip()
    if conv[:5].lower() == "chat:":
        conv = conv[5:].strip()
    if not conv or conv == _str(ctx.get("actor_key")).strip():
        return ""
    if _str(ctx.get("conversation_type")).strip().lower() in DIRECT_CONVERSATIONS:
        return ""
    return conv


def workspace_dir(
    root: str | os.PathLike[str], role_id: str | None, session_id: str | None
) -> Path | None:
    """``<root>/<role_id>/<session_id or "shared">``; None when ``role_id`` is empty.

    Ids are used as single path segments: separators and ``..`` cannot escape the root.
    """
    role = _segment(role_id)
    if not role:
        return None
    return Path(root) / role / (_segment(session_id) or "shared")


def results_dir(root: str | os.PathLike[str], role_id: str | None, session_id: str | None) -> Path:
    """Where a job's results are post-processed: its workspace (:func:`workspace_dir`), or
    ``<root>/<session_id or "shared">`` for a job without a role (it has no workspace)."""
    return workspace_dir(root, role_id, session_id) or (
        Path(root) / (_segment(session_id) or "shared")
    )


# Channels whose results go to a chat session, not to a person's ``actor_key``.
SESSION_CHANNELS = frozenset({"web", "web_admin"})


def recipient_segment(channel: str, actor_key: str) -> str:
    """``<channel>-<hash of actor_key>``: the workspace segment of one person on one
    third-party channel (a valid single path segment whatever the key contains)."""
    ch = re.sub(r"[^a-z0-9_]", "_", _str(channel).strip().lower())[:32] or "channel"
    digest = hashlib.sha256(_str(actor_key).encode("utf-8")).hexdigest()[:20]
    return f"{ch}-{digest}"


def job_segment(job: JobRow) -> str:
    """The workspace segment of a queued job: its session, else (third-party channels) its
    recipient, else ``shared``. Two people never share a background workspace."""
    session = _segment(getattr(job, "session_id", ""))
    if session:
        return session
    channel = _str(getattr(job, "channel", "")).strip().lower()
    actor = _str(getattr(job, "actor_key", "")).strip()
    orgdeleg = _str(getattr(job, "external_id", "")).startswith("orgdeleg:")
    if channel and channel not in SESSION_CHANNELS and actor and not orgdeleg:
        return recipient_segment(channel, actor)
    return "shared"


def job_workspace(root: str | os.PathLike[str], job: JobRow) -> Path | None:
    """Where a queued job's skill runs: ``<root>/<role_id>/<job segment>``; None without a
    role (such a job has no workspace)."""
    # Looked up several times per job and the same for every job of a session: memoized
    # by what it is made of (a Path is immutable).
    key = (
        os.fspath(root),
        getattr(job, "role_id", ""),
        getattr(job, "session_id", ""),
        getattr(job, "channel", ""),
        getattr(job, "actor_key", ""),
        _str(getattr(job, "external_id", "")).startswith("orgdeleg:"),
    )
    try:
        return _JOB_WORKSPACES[key]
    except KeyError:
        pass
    role = _segment(key[1])
    path = Path(root) / role / job_segment(job) if role else None
    if len(_JOB_WORKSPACES) >= 4096:
        _JOB_WORKSPACES.clear()
    _JOB_WORKSPACES[key] = path
    return path


_JOB_WORKSPACES: dict[tuple[Any, ...], Path | None] = {}


def job_results_dir(root: str | os.PathLike[str], job: JobRow) -> Path:
    """Where a queued job's results are post-processed: its workspace, or
    ``<root>/<job segment>`` for a job without a role."""
    return job_workspace(root, job) or Path(root) / job_segment(job)


_SAFE_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _segment(value: str | None) -> str:
    """An id as one path segment that is also safe in a shell command: ``[A-Za-z0-9._-]``
    ids are kept; any other id becomes its safe characters plus a hash of the whole id (so
    ``a/b`` and ``a_b`` never share a directory)."""
    s = _str(value).strip()
    if not s:
        return ""
    if _SAFE_SEGMENT.fullmatch(s) and s not in {".", ".."}:
        return s
    digest = hashlib.sha256(s.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", s)[:48]
    return f"{safe}-{digest}"


_SECRET_NAME: dict[str, bool] = {}
MIN_SCRUB_LEN = 6  # shorter values are too likely to be ordinary words or numbers


def _is_secret_name(key: str) -> bool:
    hit = _SECRET_NAME.get(key)
    if hit is None:
        hit = key not in VOCABULARY and is_secret_key(key)
        if len(_SECRET_NAME) < 10_000:
            _SECRET_NAME[key] = hit
    return hit


def secret_values(ctx: Mapping[str, Any], skill: str) -> list[str]:
    """The secret config values a run can see (secret-named keys in the four config
    layers), longest first — what must never come back out in a log or an error."""
    found: set[str] = set()
    sc = ctx.get("skill_configs")
    own = sc.get(skill) if isinstance(sc, Mapping) else None
    for layer in (ctx, own, sc, ctx.get("skill_args")):
        if not isinstance(layer, Mapping):
            continue
        for key, value in layer.items():
            if isinstance(value, str) and len(value) >= MIN_SCRUB_LEN and isinstance(key, str):
                if _is_secret_name(key):
                    found.add(value)
    return sorted(found, key=lambda v: (-len(v), v))


_CREDENTIAL_WORDS = frozenset(
    "password passwd passphrase secret token authorization auth credential credentials "
    "apikey cookie".split()
)
_KEY_KINDS = frozenset("api access private secret app client license signing encryption".split())
_CAMEL_SPLIT = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def is_credential_name(key: str) -> bool:
    """A key that names a credential for certain (``api_key``, ``password``,
    ``Authorization``, ``accessToken``), not merely one containing "key" (``keywords``)."""
    words = _CAMEL_SPLIT.sub("_", key).replace("-", "_").lower().split("_")
    if any(w in _CREDENTIAL_WORDS for w in words):
        return True
    return len(words) > 1 and words[-1] in ("key", "keys") and words[-2] in _KEY_KINDS


def input_secrets(data: object, depth: int = 0) -> list[str]:
    """The values of credential-named fields of an input (``api_key``, ``password``,
    ``Authorization``…), at any depth: what a skill echoing its input must not hand back."""
    found: list[str] = []
    if depth > 32:
        return found
    if isinstance(data, Mapping):
        for key, value in data.items():
            if isinstance(key, str) and is_credential_name(key) and isinstance(value, str):
                if len(value) >= MIN_SCRUB_LEN:
                    found.append(value)
            elif isinstance(value, Mapping | list):
                found += input_secrets(value, depth + 1)
    elif isinstance(data, list):
        for value in data:
            found += input_secrets(value, depth + 1)
    return found


#: token-named fields that are not credentials: a skill hands them to the model to send back
#: (seed ``001_…``: the confirmation of a destructive call; pagination), so a result keeps them
PROTOCOL_TOKENS = frozenset(
    "confirm_token page_token next_page_token next_token continuation_token sync_token".split()
)


def mask_credentials(
    obj: object, mask: str = "••••••", depth: int = 0, keep: frozenset[str] = frozenset()
) -> Any:
    """``obj`` with the text values of credential-named fields masked, at any depth; the
    names in ``keep`` are left as they are."""
    if depth > 64:
        return obj
    if isinstance(obj, dict):
        return {
            k: (
                mask
                if isinstance(k, str)
                and k not in keep
                and is_credential_name(k)
                and isinstance(v, str)
                and v
                else mask_credentials(v, mask, depth + 1, keep)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [mask_credentials(v, mask, depth + 1, keep) for v in obj]
    return obj


def scrub(obj: object, secrets: list[str], mask: str = "••••••") -> Any:
    """``obj`` with every occurrence of the given secret values replaced by ``mask``."""
    if isinstance(obj, str):
        for s in secrets:
            if s in obj:
                obj = obj.replace(s, mask)
        return obj
    if isinstance(obj, dict):
        return {k: scrub(v, secrets, mask) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v, secrets, mask) for v in obj]
    return obj


# File parameters (skill spec §3.3): values of these fields are resolved against the
# session workspace before the skill runs.
FILE_FIELDS = frozenset(
    "input output file path video audio image src dst inputs files videos images clips "
    "sources paths bgm input_file file_path".split()
)
OUTPUT_FIELDS = frozenset({"output", "dst", "output_path", "out"})


def _resolve_one(value: object, ws: Path, output: bool) -> Any:
    if not isinstance(value, str) or not value.strip() or "://" in value:
        return value
    s = value.strip()
    if os.path.isabs(s) or s.startswith("~"):
        return value  # absolute paths are kept as they are
    name = os.path.basename(s.replace("\\", "/").rstrip("/"))
    if not name or name in {".", ".."}:
        return value
    if output:
        # a file to be written: always lands in the workspace (only file-like values, so
        # an "output": "json" format switch is left alone)
        return str(ws / name) if ("." in name or "/" in s) else value
    candidate = ws / name
    return str(candidate) if candidate.is_file() else value  # missing: keep (clearer error)


def resolve_file_params(input_data: dict[str, Any], workspace: str | None) -> dict[str, Any]:
    """A copy of ``input_data`` with conventional file fields resolved into the workspace:
    absolute paths kept; relative ones reduced to their basename under the workspace
    (output fields unconditionally, others when that file exists)."""
    if not workspace or not any(k in FILE_FIELDS or k in OUTPUT_FIELDS for k in input_data):
        return input_data
    ws = Path(workspace)
    out = dict(input_data)
    for key, value in input_data.items():
        if key not in FILE_FIELDS and key not in OUTPUT_FIELDS:
            continue
        is_out = key in OUTPUT_FIELDS
        if isinstance(value, list):
            seen: list[Any] = []
            for v in (_resolve_one(x, ws, is_out) for x in value):
                if v not in seen:  # list fields are de-duplicated
                    seen.append(v)
            out[key] = seen
        else:
            out[key] = _resolve_one(value, ws, is_out)
    return out
