"""``empty_when``: when a step's result counts as empty beyond the built-in guard.

The built-in guard (``chains.guard``) treats ``0`` and ``False`` as values, so a seed-style
"nothing today" result — ``sql_query``'s ``{"rows": [], "row_count": 0, "sql": "…"}``, or
``{"total": 0, "rows": []}`` — does not stop a chain. A schedule (for every step) or a step
may name what empty means for its results:

* ``"total == 0"``, ``"row_count <= 0"``, ``"status == \\"none\\""`` — a field compared with a
  JSON literal (``==`` ``!=`` ``<`` ``<=`` ``>`` ``>=``);
* ``"rows"`` or ``"rows is empty"`` — a named field that is missing or empty (``None``,
  ``""``, ``[]``, ``{}``);
* several rules joined by ``or`` (or given as a list): any one makes the result empty.

A field is a dotted path (``data.rows``, ``pageInfo.total``); a path that is not at the top
of the result is also looked up under its ``data`` (where envelopes keep their payload).
A comparison whose field is missing does not match.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chains.guard import is_empty_output

_PATH = r"[A-Za-z_][\w\-]*(?:\.(?:[A-Za-z_][\w\-]*|\d+))*"
_COMPARE = re.compile(rf"^\s*({_PATH})\s*(==|!=|<=|>=|<|>)\s*(.+?)\s*$")
_IS_EMPTY = re.compile(rf"^\s*({_PATH})(?:\s+is\s+empty)?\s*$", re.IGNORECASE)
_OR = re.compile(r"\s+or\s+", re.IGNORECASE)
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MISSING = object()


class RuleError(ValueError):
    """An ``empty_when`` rule that cannot be read."""


@dataclass(frozen=True)
class Rule:
    path: tuple[str, ...]
    op: str | None = None  # None: "the field is empty"
    value: Any = None

    def matches(self, out: object) -> bool:
        found = _lookup(out, self.path)
        if self.op is None:
            return found is _MISSING or is_empty_output(found)
        if found is _MISSING or isinstance(found, bool) != isinstance(self.value, bool):
            return False
        try:
            return bool(_OPS[self.op](found, self.value))
        except TypeError:  # e.g. "abc" < 3: not this rule
            return False


def _lookup(out: object, path: tuple[str, ...]) -> Any:
    for root in (out, out.get("data") if isinstance(out, dict) else None):
        cur: Any = root
        for part in path:
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
                cur = cur[int(part)]
            else:
                cur = _MISSING
                break
        if cur is not _MISSING:
            return cur
    return _MISSING


def parse(spec: str | list[str] | None) -> list[Rule]:
    """The rules of an ``empty_when`` value (a string, ``or``-joined, or a list of them)."""
    if spec is None:
        return []
    texts = [spec] if isinstance(spec, str) else list(spec)
    rules: list[Rule] = []
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            raise RuleError("empty_when: a rule must be a non-empty string")
        for part in _OR.split(text.strip()):
            rules.append(_rule(part))
    return rules


def _rule(text: str) -> Rule:
    m = _COMPARE.match(text)
    if m is not None:
        path, op, raw = m.groups()
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise RuleError(
                f'empty_when {text!r}: {raw!r} is not a JSON value (numbers, "text", true, '
                "false, null)"
            ) from None
        if isinstance(value, dict | list):
            raise RuleError(f"empty_when {text!r}: compare with a number, text, true/false/null")
        return Rule(tuple(path.split(".")), op, value)
    m = _IS_EMPTY.match(text)
    if m is not None:
        return Rule(tuple(m.group(1).split(".")))
    raise RuleError(
        f"empty_when {text!r}: write FIELD == VALUE (e.g. total == 0), FIELD (a list field "
        "that must not be empty, e.g. rows) or several joined by 'or'"
    )


def is_empty(out: object, rules: list[Rule]) -> bool:
    """The built-in guard, or any of ``rules``."""
    return is_empty_output(out) or any(r.matches(out) for r in rules)


__all__ = ["Rule", "RuleError", "is_empty", "parse"]
