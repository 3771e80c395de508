"""Rules the platform applies to a skill's input before it runs (seed ``001_…`` §3.3, §3.4).

* **Attachment ids.** The model sees the turn's attachments as ``img_1``, ``file_1``, … (an
  image counts as ``img``, anything else as ``file``; numbered per kind in ``attachments``
  order, or the attachment's own ``id`` when the chat layer gives one). A value, or a list
  item, that *is* such an id becomes that attachment's ``local_path``; inside ``code``,
  ``command``, ``script``, ``cmd``, ``instruction``, ``shell`` and ``bash`` strings every
  id is replaced too (POSIX slashes, quoted when the path has spaces). List fields are
  de-duplicated. An id that names no attachment is refused (recoverable, naming it).
* **force_raw_prompt.** A generator skill declaring ``force_raw_prompt: true`` gets the
  person's own words (``raw_input``) in the first required string field of its schema —
  not when the request is delegated (an ``orgdeleg:`` session, ``delegated`` in the context,
  a ``call_skill`` callee) and not when ``raw_input`` is empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jobs.envelope import failure
from jobs.skill import Skill

__all__ = ["Refused", "UnknownAttachment", "apply", "attachment_ids", "first_required_string"]

SUBSTRING_FIELDS = frozenset({"code", "command", "script", "cmd", "instruction", "shell", "bash"})
ORGDELEG_PREFIX = "orgdeleg:"
_ID_SHAPE = re.compile(r"(?<![A-Za-z0-9_])(?:img|file)_\d+(?![A-Za-z0-9_])")
_QUOTES = "\"'"
MAX_DEPTH = 32


class Refused(Exception):
    """The input cannot run as given; ``envelope`` is the recoverable failure to return."""

    def __init__(self, envelope: dict[str, Any]) -> None:
        super().__init__(envelope.get("error"))
        self.envelope = envelope


class UnknownAttachment(ValueError):
    def __init__(self, ref: str, field: str, known: list[str]) -> None:
        super().__init__(f"{field}: {ref!r} is not an attachment of this turn")
        self.ref, self.field, self.known = ref, field, known


def _kind(att: Mapping[str, Any]) -> str:
    kind = str(att.get("type") or att.get("att_type") or "").lower()
    return "img" if kind.startswith(("image", "img", "photo", "picture")) else "file"


def attachment_ids(attachments: object) -> dict[str, str]:
    """id → path of each attachment (``local_path``, else its ``url``)."""
    out: dict[str, str] = {}
    counts: dict[str, int] = {}
    for att in attachments if isinstance(attachments, list | tuple) else ():
        if not isinstance(att, Mapping):
            continue
        kind = _kind(att)
        counts[kind] = counts.get(kind, 0) + 1
        where = str(att.get("local_path") or att.get("url") or "").strip()
        if not where:
            continue
        explicit = str(att.get("id") or "").strip()
        out[explicit or f"{kind}_{counts[kind]}"] = where.replace("\\", "/")
    return out


def _quoted(path: str, text: str, start: int, end: int) -> str:
    if " " not in path and "\t" not in path:
        return path
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    if before in _QUOTES and before == after:
        return path  # already inside quotes: open("img_1")
    if '"' in path:
        return "'" + path.replace("'", "'\\''") + "'"
    return f'"{path}"'


class _Substitution:
    def __init__(self, ids: dict[str, str]) -> None:
        self.ids = ids
        explicit = sorted((k for k in ids if not _ID_SHAPE.fullmatch(k)), key=len, reverse=True)
        parts = [re.escape(k) for k in explicit] + [_ID_SHAPE.pattern]
        self.token = re.compile(
            "|".join(f"(?<![A-Za-z0-9_])(?:{p})(?![A-Za-z0-9_])" for p in parts)
        )

    def whole(self, value: object, field: str) -> Any:
        if isinstance(value, str):
            ref = value.strip()
            if ref in self.ids:
                return self.ids[ref]
            if _ID_SHAPE.fullmatch(ref):
                raise UnknownAttachment(ref, field, sorted(self.ids))
        return value

    def inside(self, text: str, field: str) -> str:
        def one(m: re.Match[str]) -> str:
            ref = m.group(0)
            if ref not in self.ids:
                raise UnknownAttachment(ref, field, sorted(self.ids))
            return _quoted(self.ids[ref], text, m.start(), m.end())

        return self.token.sub(one, text)

    def walk(self, value: object, field: str, depth: int = 0) -> Any:
        if depth > MAX_DEPTH:
            return value
        if isinstance(value, Mapping):
            return {k: self.field(str(k), v, f"{field}.{k}", depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            items = [self.walk(v, f"{field}[{i}]", depth + 1) for i, v in enumerate(value)]
            if any(isinstance(v, str) and v.strip() in self.ids for v in value):
                deduped: list[Any] = []
                for v in items:
                    if v not in deduped:
                        deduped.append(v)
                return deduped
            return items
        return self.whole(value, field)

    def field(self, key: str, value: object, where: str, depth: int = 0) -> Any:
        if key.lower() in SUBSTRING_FIELDS and isinstance(value, str):
            return self.inside(value, where)
        return self.walk(value, where, depth)


def substitute_attachments(data: dict[str, Any], attachments: object) -> dict[str, Any]:
    """A copy of ``data`` with attachment ids replaced (raises UnknownAttachment)."""
    sub = _Substitution(attachment_ids(attachments))
    return {k: sub.field(k, v, k) for k, v in data.items()}


def first_required_string(schema: object) -> str | None:
    """The first name in ``required`` whose property is a string."""
    if not isinstance(schema, Mapping):
        return None
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    for name in schema.get("required") or ():
        prop = props.get(name)
        kind = prop.get("type") if isinstance(prop, Mapping) else None
        if kind == "string" or (isinstance(kind, list) and "string" in kind):
            return str(name)
    return None


def is_delegated(ctx: Mapping[str, Any], depth: int = 0) -> bool:
    """The request came from upstream (another organization's agent, another skill), not
    from the person typing."""
    if depth > 0 or ctx.get("delegated") is True or ctx.get("is_delegated") is True:
        return True
    return any(
        str(ctx.get(k) or "").startswith(ORGDELEG_PREFIX)
        for k in ("external_id", "session_id", "actor_key")
    )


def _schema_of(skill: Skill, data: Mapping[str, Any]) -> Any:
    sub = data.get("_subcommand")
    if sub not in (None, "") and isinstance(skill.cli_command_schemas.get(str(sub)), dict):
        return skill.cli_command_schemas[str(sub)]
    return skill.input_schema


def raw_prompt(
    skill: Skill, data: dict[str, Any], ctx: Mapping[str, Any], depth: int = 0
) -> dict[str, Any]:
    """``force_raw_prompt``: the person's words in the first required string field."""
    if not skill.force_raw_prompt or is_delegated(ctx, depth):
        return data
    raw = ctx.get("raw_input")
    if not isinstance(raw, str) or not raw.strip():
        return data
    name = first_required_string(_schema_of(skill, data))
    if name is None:
        return data
    return {**data, name: raw}


def apply(
    skill: Skill, data: dict[str, Any], ctx: Mapping[str, Any], *, depth: int = 0
) -> dict[str, Any]:
    """The input the skill runs with; Refused when it names an attachment the turn does not
    have (a recoverable error: the model can correct the id)."""
    try:
        out = substitute_attachments(data, ctx.get("attachments"))
    except UnknownAttachment as exc:
        known = ", ".join(exc.known) or "none"
        raise Refused(
            failure(
                f"input field {exc.field!r} names attachment {exc.ref!r}, which this turn does not "
                f"have (attachments: {known})",
                error_type="recoverable",
                skill=skill.name,
                unknown_attachment=exc.ref,
                need_param=[exc.field.split(".", 1)[0].split("[", 1)[0]],
            )
        ) from exc
    return raw_prompt(skill, out, ctx, depth)
