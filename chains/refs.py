"""Step input resolution for chains (pure: no I/O).

A step's input is built, lowest precedence first, from:

* ``passthrough: true`` — the previous step's output (a dict) as the input;
* ``template`` — ``{"field": "text {name}"}``, placeholders filled from the previous
  step's output (falling back to the step's own explicit input);
* ``input`` — explicit values, which may hold references:
  ``$steps.<id|index>.<path>`` (any earlier step) and ``$prev.<path>`` (the previous one).

A string that is exactly one reference keeps the JSON type of what it points at; a
reference inside a longer string is interpolated. Paths walk dict keys and list indexes
(``data.rows.0.name`` or ``data.rows[0].name``). Anything that does not resolve —
including a ``{name}`` or ``$steps.`` left in the literal text — raises
:class:`UnresolvedReference` naming it, before the step runs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "StepRefs",
    "UnresolvedReference",
    "find_references",
    "resolve_input",
    "resolve_reference",
    "static_errors",
]

_SEG = r"(?:\.[A-Za-z0-9_\-]+|\[\d+\])"
REF_RE = re.compile(
    rf"\$(?:steps\.(?P<step>[A-Za-z0-9_\-]+)|(?P<prev>prev)\b|(?P<item>item)\b)(?P<path>{_SEG}*)"
)
PLACEHOLDER_RE = re.compile(rf"\{{(?P<name>[A-Za-z_][A-Za-z0-9_\-]*{_SEG}*)\}}")
_TOKEN_RE = re.compile(f"{REF_RE.pattern}|{PLACEHOLDER_RE.pattern}")
_LEFTOVER_STEPS = "$steps."


class UnresolvedReference(ValueError):
    """A reference or placeholder that does not resolve; ``reference`` names it."""

    def __init__(self, reference: str, reason: str) -> None:
        super().__init__(f"unresolved reference {reference}: {reason}")
        self.reference = reference
        self.reason = reason


@dataclass(frozen=True)
class StepRefs:
    """What resolution needs to know about a step definition."""

    id: str
    input: Mapping[str, Any]
    template: Mapping[str, Any]
    passthrough: bool = False
    #: the ids of the steps it waits for (None: the step before it, as in a line)
    needs: tuple[str, ...] | None = None
    #: ``$steps.<id>.<path>``: a list the step runs once per item of (``$item`` in it)
    for_each: str | None = None


class _NoItem:
    """No ``$item`` here (the step has no ``for_each``)."""


NO_ITEM: Any = _NoItem()


def _segments(path: str) -> list[str]:
    return [s for s in re.split(r"[.\[\]]+", path) if s]


def _walk(value: object, segments: Sequence[str], ref: str) -> Any:
    here = value
    for i, seg in enumerate(segments):
        where = ".".join(segments[:i]) or "the output"
        if isinstance(here, Mapping):
            if seg not in here:
                raise UnresolvedReference(ref, f"no key {seg!r} in {where}")
            here = here[seg]
        elif isinstance(here, list):
            try:
                here = here[int(seg)]
            except (ValueError, IndexError):
                raise UnresolvedReference(
                    ref, f"no item {seg!r} in {where} (a list of {len(here)})"
                ) from None
        else:
            raise UnresolvedReference(ref, f"{where} is {type(here).__name__}, not an object")
    return here


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


class _Resolver:
    """References of step ``index``: to the steps in ``allowed`` (the earlier ones in a
    line, the ones it waits for — directly or not — in a graph), ``$prev`` to ``prev``, and
    ``$item`` to the item of a ``for_each`` step."""

    def __init__(
        self,
        index: int,
        ids: Sequence[str],
        outputs: Sequence[Any] | Mapping[int, Any],
        *,
        allowed: frozenset[int] | None = None,
        prev: int | None = None,
        item: object = NO_ITEM,
    ) -> None:
        self.index = index
        self.ids = list(ids)
        self.outputs = outputs if isinstance(outputs, Mapping) else dict(enumerate(outputs))
        self.allowed = frozenset(range(index)) if allowed is None else allowed
        self.prev = (index - 1 if index > 0 else None) if allowed is None else prev
        self.item = item

    def target(self, m: re.Match[str]) -> int:
        ref = m.group(0)
        if m.group("prev"):
            if self.prev is None:
                raise UnresolvedReference(ref, "no single previous step (use $steps.<id>)")
            return self.prev
        name = m.group("step")
        pos = self.ids.index(name) if name in self.ids else int(name) if name.isdigit() else -1
        if pos in self.allowed:
            return pos
        raise UnresolvedReference(ref, f"no earlier step {name!r}")

    def lookup(self, m: re.Match[str]) -> Any:
        if m.group("item"):
            if self.item is NO_ITEM:
                raise UnresolvedReference(m.group(0), "$item is only set in a for_each step")
            return _walk(self.item, _segments(m.group("path")), m.group(0))
        pos = self.target(m)
        if pos not in self.outputs:
            raise UnresolvedReference(m.group(0), f"step {self.ids[pos]!r} has no output")
        return _walk(self.outputs[pos], _segments(m.group("path")), m.group(0))

    def placeholder(self, m: re.Match[str], sources: Sequence[Any]) -> Any:
        segs = _segments(m.group("name"))
        for src in sources:
            try:
                return _walk(src, segs, m.group(0))
            except UnresolvedReference:
                continue
        raise UnresolvedReference(m.group(0), "no such field in the previous step's output")

    def string(self, s: str, sources: Sequence[Any] | None) -> Any:
        """Resolve references in ``s``; in template mode (``sources`` given) also fill
        ``{field}`` placeholders from ``sources``."""
        pattern = REF_RE if sources is None else _TOKEN_RE
        whole = pattern.fullmatch(s)
        if whole:
            return self.token(whole, sources)
        parts: list[str] = []
        last = 0
        for m in pattern.finditer(s):
            parts.append(_check_literal(s[last : m.start()]))
            parts.append(_text(self.token(m, sources)))
            last = m.end()
        parts.append(_check_literal(s[last:]))
        return "".join(parts)

    def token(self, m: re.Match[str], sources: Sequence[Any] | None) -> Any:
        if sources is not None and m.re is _TOKEN_RE and m.group("name"):
            return self.placeholder(m, sources)
        return self.lookup(m)

    def value(self, v: object, sources: Sequence[Any] | None = None) -> Any:
        if isinstance(v, str):
            return self.string(v, sources)
        if isinstance(v, Mapping):
            return {k: self.value(x, sources) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x, sources) for x in v]
        return v


def _check_literal(text: str) -> str:
    """Literal text of a value must not hold a reference left unresolved."""
    if _LEFTOVER_STEPS in text:
        bad = text[text.index(_LEFTOVER_STEPS) :].split()[0]
        raise UnresolvedReference(bad, "malformed step reference")
    m = PLACEHOLDER_RE.search(text)
    if m:
        raise UnresolvedReference(m.group(0), "placeholder left unfilled")
    return text


def resolve_input(
    index: int,
    steps: Sequence[StepRefs],
    outputs: Sequence[Any] | Mapping[int, Any],
    *,
    allowed: frozenset[int] | None = None,
    prev_step: int | None = None,
    item: object = NO_ITEM,
) -> dict[str, Any]:
    """The input for ``steps[index]`` given the outputs of the steps before it (a list in
    step order, or step index → output). In a graph, ``allowed`` are the steps it may
    refer to and ``prev_step`` its single need (``$prev``, ``passthrough``, ``template``);
    ``item``: the item of a ``for_each`` step (``$item``, and ``{field}`` placeholders).

    Precedence: explicit ``input`` > ``template`` > ``passthrough``.
    Raises :class:`UnresolvedReference` when anything does not resolve.
    """
    step = steps[index]
    resolver = _Resolver(
        index, [s.id for s in steps], outputs, allowed=allowed, prev=prev_step, item=item
    )
    prev = resolver.outputs.get(resolver.prev) if resolver.prev is not None else None
    explicit = resolver.value(dict(step.input))
    data: dict[str, Any] = {}
    if step.passthrough:
        if resolver.prev is None:
            raise UnresolvedReference("passthrough", "the step has no single previous step")
        if isinstance(prev, Mapping):
            data.update(prev)
        elif prev is not None:
            data["result"] = prev
    if step.template:
        first = [] if item is NO_ITEM else [item]
        sources = [s for s in (*first, prev, explicit) if s is not None]
        for key, value in step.template.items():
            data[key] = resolver.value(value, sources)
    data.update(explicit)
    return data


def resolve_reference(
    text: str,
    index: int,
    steps: Sequence[StepRefs],
    outputs: Mapping[int, Any],
    *,
    allowed: frozenset[int],
) -> Any:
    """The value one reference (a ``for_each``) stands for, for step ``index``."""
    resolver = _Resolver(index, [s.id for s in steps], outputs, allowed=allowed)
    return resolver.value(text)


def find_references(value: object) -> Iterator[re.Match[str]]:
    """Every ``$steps``/``$prev`` reference in a (nested) value."""
    if isinstance(value, str):
        yield from REF_RE.finditer(value)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from find_references(v)
    elif isinstance(value, list):
        for v in value:
            yield from find_references(v)


def static_errors(
    steps: Sequence[StepRefs],
    allowed: Sequence[frozenset[int]] | None = None,
    prev: Sequence[int | None] | None = None,
) -> list[str]:
    """Creation-time checks: references to unknown or later steps (in a graph, ``allowed``:
    to steps it does not wait for), ``$prev`` or ``passthrough`` without a previous step,
    ``$item`` outside a ``for_each`` step. Each message names the step and the reference."""
    errors: list[str] = []
    ids = [s.id for s in steps]
    single = "" if prev is None else "single "
    for i, step in enumerate(steps):
        label = f"step {i} ({step.id})"
        mine = frozenset(range(i)) if allowed is None else allowed[i]
        before = (i - 1 if i > 0 else None) if prev is None else prev[i]
        if step.passthrough and before is None:
            errors.append(f"{label}: passthrough needs a {single}previous step")
        for m in find_references([dict(step.input), dict(step.template)]):
            problem = _reference_problem(m, i, step, ids, mine, before, graph=allowed is not None)
            if problem:
                errors.append(f"{label}: {problem}")
        for text in _strings([dict(step.input), dict(step.template)]):
            stripped = REF_RE.sub("", text)
            if _LEFTOVER_STEPS in stripped:
                errors.append(f"{label}: malformed reference in {text!r}")
    return errors


def _reference_problem(
    m: re.Match[str],
    i: int,
    step: StepRefs,
    ids: Sequence[str],
    mine: frozenset[int],
    before: int | None,
    *,
    graph: bool,
) -> str | None:
    ref = m.group(0)
    if m.group("item"):
        return None if step.for_each is not None else f"{ref} is only set in a for_each step"
    if m.group("prev"):
        if before is not None:
            return None
        if graph:
            return f"{ref} refers to a single previous step; there is none (use $steps.<id>)"
        return f"{ref} refers to a previous step; there is none"
    name = m.group("step")
    if name in ids:
        pos = ids.index(name)
    elif name.isdigit() and int(name) < len(ids):
        pos = int(name)
    else:
        return f"{ref} refers to unknown step {name!r}"
    if pos == i:
        return f"{ref} refers to itself; only earlier steps can be used"
    if pos in mine:
        return None
    if not graph:
        return f"{ref} refers to later step {ids[pos]!r}; only earlier steps can be used"
    return (
        f"{ref} refers to step {ids[pos]!r}, which it does not wait for: add {ids[pos]!r} "
        "to its needs"
    )


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
