"""Text that can be stored and sent: the checks made where text comes in (SPEC C24).

NUL cannot be stored in a PostgreSQL ``text``/``jsonb`` value and a lone UTF-16 surrogate
cannot be encoded as UTF-8 at all, so neither may enter through an identity or a request
head: such a field is refused (400, naming it) on both databases alike. A skill's *input*
is data the person typed or a model wrote: its lone surrogates become U+FFFD (and the
receipt says where), nothing is refused for them.

Context identity fields are typed: strings (an integer id is taken as its decimal text),
no longer than their columns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ID_FIELDS", "FieldProblem", "context_problem", "text_problem"]

#: context fields that are ids (stored in columns of these lengths, used as chat ids)
ID_FIELDS: dict[str, int] = {
    "channel": 64,
    "role_id": 128,
    "org_id": 128,
    "session_id": 255,
    "external_id": 255,
    "actor_key": 255,
    "actor_id": 255,
    # a reply's anchor: part of a delivery's recipient (512 characters in all)
    "conversation_id": 128,
    "conversation_type": 32,
    "message_id": 64,
}
#: any other text of the context (names, locale, raw input…) up to this many characters
MAX_CONTEXT_TEXT = 100_000
MAX_DEPTH = 64

_BAD = re.compile("[\x00\ud800-\udfff]")


class FieldProblem(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def text_problem(value: str) -> str | None:
    """Why ``value`` is not storable text (NUL, a lone surrogate), or None."""
    m = _BAD.search(value)
    if m is None:
        return None
    if m.group() == "\x00":
        return f"contains a NUL character (at {m.start()})"
    return f"contains invalid Unicode (a lone surrogate U+{ord(m.group()):04X} at {m.start()})"


def _walk(value: object, where: str, depth: int) -> None:
    if isinstance(value, str):
        if (bad := text_problem(value)) is not None:
            raise FieldProblem(where, f"context field {where!r} {bad}")
        if len(value) > MAX_CONTEXT_TEXT:
            raise FieldProblem(
                where, f"context field {where!r} is longer than {MAX_CONTEXT_TEXT:,} characters"
            )
        return
    if depth > MAX_DEPTH:
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = str(k)
            if (bad := text_problem(key)) is not None:
                raise FieldProblem(where, f"a key of context field {where!r} {bad}")
            _walk(v, f"{where}.{key}", depth + 1)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _walk(v, f"{where}[{i}]", depth + 1)


def context_problem(ctx: Mapping[str, Any]) -> FieldProblem | None:
    """The first problem of a dispatched context, or None; integer ids are rewritten to
    their text in place (``ctx`` must be a dict the caller owns)."""
    for name, limit in ID_FIELDS.items():
        v = ctx.get(name)
        if v is None:
            continue
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
            if isinstance(ctx, dict):
                ctx[name] = v
        if not isinstance(v, str):
            return FieldProblem(
                name, f"context field {name!r} must be a string, got {type(v).__name__}"
            )
        if len(v) > limit:
            return FieldProblem(
                name, f"context field {name!r} is longer than {limit} characters ({len(v)})"
            )
    try:
        for key, value in ctx.items():
            k = str(key)
            if (bad := text_problem(k)) is not None:
                raise FieldProblem("context", f"a context key {bad}")
            _walk(value, k, 1)
    except FieldProblem as exc:
        return exc
    return None
