"""Chains as graphs (pure): which steps wait for which, in what order they may run.

A chain is a line unless a step says ``needs``: then every step waits for exactly the
steps its ``needs`` lists (none: it starts with the run), independent steps run side by
side, and a step may refer only to the steps it waits for, directly or not. A step with
``for_each: "$steps.<id>.<path>"`` runs once per item of that list (``$item`` in its
input); its output is the list of the items' outputs, in order (the fan-in).

Item runs are recorded as step rows of their own: row ``idx`` = ``ITEM_BASE * (step + 1) +
item``, ``step_id`` = ``<id>[<item>]`` (:func:`item_idx`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chains.refs import REF_RE

#: row index of an item run: ITEM_BASE * (step index + 1) + item number
ITEM_BASE = 1_000_000
#: items a for_each step runs at most by default, and the highest ``max_items`` allowed
DEFAULT_MAX_ITEMS = 1000
MAX_ITEMS_CAP = 100_000
DEFAULT_PARALLEL = 4
MAX_PARALLEL = 64


def item_idx(step: int, item: int) -> int:
    return ITEM_BASE * (step + 1) + item


def item_of(idx: int) -> tuple[int, int] | None:
    """(step index, item number) of an item row's ``idx``; None for a step's own row."""
    if idx < ITEM_BASE:
        return None
    return idx // ITEM_BASE - 1, idx % ITEM_BASE


@dataclass(frozen=True)
class Graph:
    ids: tuple[str, ...]
    deps: tuple[tuple[int, ...], ...]  # the steps each one waits for
    explicit: bool  # some step says ``needs``
    for_each: tuple[str | None, ...]

    @property
    def is_graph(self) -> bool:
        """Run by the graph runner (needs or for_each somewhere), not as a plain line."""
        return self.explicit or any(f is not None for f in self.for_each)

    def ancestors(self, i: int) -> frozenset[int]:
        seen: set[int] = set()
        todo = list(self.deps[i])
        while todo:
            j = todo.pop()
            if j not in seen:
                seen.add(j)
                todo.extend(self.deps[j])
        return frozenset(seen)

    def descendants(self, i: int) -> frozenset[int]:
        return frozenset(j for j in range(len(self.ids)) if i in self.ancestors(j))

    def prev(self, i: int) -> int | None:
        """The single step ``i`` waits for (``$prev``, ``passthrough``), else None."""
        return self.deps[i][0] if len(self.deps[i]) == 1 else None

    def source_of(self, i: int) -> int | None:
        """The step whose output a ``for_each`` step iterates over."""
        ref = self.for_each[i]
        m = REF_RE.fullmatch(ref) if ref else None
        if m is None or not m.group("step"):
            return None
        name = m.group("step")
        return self.ids.index(name) if name in self.ids else None

    def levels(self) -> list[list[int]]:
        """Steps by depth (roots first): the columns the dashboard draws."""
        depth: dict[int, int] = {}

        def d(i: int) -> int:
            if i not in depth:
                depth[i] = 1 + max((d(j) for j in self.deps[i]), default=-1)
            return depth[i]

        out: dict[int, list[int]] = {}
        for i in range(len(self.ids)):
            out.setdefault(d(i), []).append(i)
        return [out[k] for k in sorted(out)]


class GraphError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def build(
    ids: Sequence[str], needs: Sequence[Sequence[str] | None], for_each: Sequence[str | None]
) -> Graph:
    """The graph of a chain; :class:`GraphError` names unknown or cyclic needs and
    ``for_each`` values that are not a reference to a step it waits for."""
    explicit = any(n is not None for n in needs)
    problems: list[str] = []
    deps: list[tuple[int, ...]] = []
    for i, wanted in enumerate(needs):
        label = f"step {i} ({ids[i]})"
        if not explicit:
            deps.append((i - 1,) if i > 0 else ())
            continue
        mine: list[int] = []
        for name in wanted or ():
            if name == ids[i]:
                problems.append(f"{label}: needs itself")
            elif name not in ids:
                problems.append(f"{label}: needs unknown step {name!r}")
            elif ids.index(name) not in mine:
                mine.append(ids.index(name))
        deps.append(tuple(mine))
    graph = Graph(tuple(ids), tuple(deps), explicit, tuple(for_each))
    if not problems:
        problems += _cycles(graph)
    if not problems:
        for i, ref in enumerate(for_each):
            if ref is None:
                continue
            src = graph.source_of(i)
            label = f"step {i} ({ids[i]})"
            if src is None:
                problems.append(
                    f"{label}: for_each must be one reference to a step's list, like "
                    f'"$steps.<id>.rows" (got {ref!r})'
                )
            elif src not in graph.ancestors(i):
                problems.append(
                    f"{label}: for_each refers to step {ids[src]!r}, which it does not wait "
                    "for" + (f": add {ids[src]!r} to its needs" if explicit else "")
                )
    if problems:
        raise GraphError(problems)
    return graph


def _cycles(graph: Graph) -> list[str]:
    state: dict[int, int] = {}  # 1: on the path, 2: done

    def visit(i: int, path: list[int]) -> list[int] | None:
        state[i] = 1
        for j in graph.deps[i]:
            if state.get(j) == 1:
                return [*path[path.index(j) :], j] if j in path else [i, j]
            if state.get(j) is None and (found := visit(j, [*path, j])) is not None:
                return found
        state[i] = 2
        return None

    for i in range(len(graph.ids)):
        if state.get(i) is None and (cycle := visit(i, [i])) is not None:
            names = " → ".join(graph.ids[k] for k in cycle)
            return [f"needs form a cycle: {names}"]
    return []


__all__ = [
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_PARALLEL",
    "ITEM_BASE",
    "MAX_ITEMS_CAP",
    "MAX_PARALLEL",
    "Graph",
    "GraphError",
    "build",
    "item_idx",
    "item_of",
]
