"""The import graph of our packages: every import (module level, inside functions and
under ``TYPE_CHECKING``) points down the layer order in README.md ("Where things are"), there are no
cycles and no hidden imports."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jobs", "chains", "delivery", "dashboard")

# The layer order, lowest first (README.md, "Where things are"). A module belongs to the layer of
# the longest prefix naming it; it may import its own layer and the layers below.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("jobs",),  # the ground floor: the modules directly in jobs/
    ("delivery.net", "jobs.catalog"),  # URL policy + pinned fetch; skill folders
    ("jobs.execution",),  # the one code path that runs a skill
    ("jobs.services", "jobs.finishing"),  # the process's connections, the finisher protocol
    ("jobs.queue",),  # a job's life: dispatch, broker, store, runner
    ("delivery",),  # results to channels
    ("chains",),  # scheduled chains of skills, delivered through delivery
    ("jobs.queue.worker",),  # wiring: hands delivery's finisher to the runner, runs chains
    ("jobs.cli", "chains.cli", "dashboard"),  # the edges: the command and the web app
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" in path.parts:
                continue  # alembic loads these by path
            found[_module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: dict[str, Path], *, top_only: bool = False) -> set[str]:
    """Our modules ``path`` imports anywhere in the file (inside functions and under
    ``TYPE_CHECKING`` too), or with ``top_only`` only what runs at import time."""
    out: set[str] = set()

    def resolve(name: str) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)

    def visit(node: ast.AST) -> None:
        if top_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return
        if top_only and isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                resolve(full if full in modules else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return found


@functools.cache  # read-only, and parsing every module is a second each time
def _graph(*, top_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = _imports(path, modules, top_only=top_only)
        # a package's own modules importing the package __init__ is not a cycle
        graph[name] = {d for d in deps if d != name and not name.startswith(d + ".")}
    return graph


def _layer(module: str) -> int:
    """The index in ``LAYERS`` of the longest prefix naming ``module``."""
    best, length = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > length:
                best, length = i, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS and the README"
    return best


@pytest.mark.slow
def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def _upward(graph: dict[str, set[str]], known: frozenset[tuple[str, str]]) -> list[str]:
    """The imports of ``graph`` that point up the layers and are not in ``known``."""
    return sorted(
        f"{name} ({LAYERS[_layer(name)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})"
        for name, deps in graph.items()
        for dep in deps
        if _layer(dep) > _layer(name) and (name, dep) not in known
    )


def _stale(graph: dict[str, set[str]], known: frozenset[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges of ``known`` that ``graph`` no longer has."""
    return sorted(e for e in known if e[1] not in graph.get(e[0], set()))


# Upward edges still waiting to be handed in the way the runner is handed its Finisher and
# its Notices, each listed so that no new one can appear unnoticed. None is left.
KNOWN_UPWARD: frozenset[tuple[str, str]] = frozenset()


@pytest.mark.slow
def test_every_import_points_down_the_layers() -> None:
    assert _upward(_graph(), KNOWN_UPWARD) == []


@pytest.mark.slow
def test_the_known_upward_edges_still_exist() -> None:
    """An edge handed in (or gone) leaves this list, so the list only ever shrinks."""
    assert _stale(_graph(), KNOWN_UPWARD) == []


def test_an_upward_edge_is_found_unless_known_and_a_known_one_must_exist() -> None:
    graph = {"jobs.queue.control": {"delivery.notices", "jobs.models"}, "delivery.notices": set()}
    edge = ("jobs.queue.control", "delivery.notices")
    assert _upward(graph, frozenset()) == [
        "jobs.queue.control (jobs.queue) imports delivery.notices (delivery)"
    ]
    assert _upward(graph, frozenset({edge})) == []
    assert _stale(graph, frozenset({edge})) == []
    assert _stale({"jobs.queue.control": {"jobs.models"}}, frozenset({edge})) == [edge]


def test_the_layer_check_sees_function_level_and_type_checking_imports(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from delivery.router import deliver_result\n"
        "def f():\n    from chains import runner\n"
    )
    modules = {"delivery.router": path, "chains.runner": path, "chains": path}
    assert _imports(path, modules) == {"delivery.router", "chains.runner"}
    assert _imports(path, modules, top_only=True) == set()
    assert _layer("jobs.queue.worker") > _layer("chains") > _layer("jobs.queue")
    assert _layer("delivery.net.fetch") < _layer("jobs.execution.executor")


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.slow
def test_ground_floor_imports_no_room_above_it() -> None:
    """Modules of the ground floor (directly in ``jobs/``, but ``services`` and
    ``finishing``, which sit above execution) import nothing at import time from its
    subpackages nor from the other packages."""
    for name, deps in _graph(top_only=True).items():
        if _layer(name) != 0:
            continue
        above = {d for d in deps if d.count(".") > 1 or not d.startswith("jobs")}
        assert not above, f"{name} imports {sorted(above)}"


# Imports of our modules inside functions hide edges from a reader and cost a lookup per
# call: they are kept for the command line's start-up (``jobs.cli.app`` imports a command's
# module only when it runs), each with a comment saying why.
MAX_FUNCTION_LEVEL_IMPORTS = 15


def _function_level_imports(path: Path) -> list[int]:
    """The lines of ``path`` where a function imports one of our packages."""
    found: list[int] = []

    def ours(name: str) -> bool:
        return name.partition(".")[0] in PACKAGES

    def visit(node: ast.AST, in_function: bool) -> None:
        if in_function and isinstance(node, ast.Import):
            if any(ours(alias.name) for alias in node.names):
                found.append(node.lineno)
        elif in_function and isinstance(node, ast.ImportFrom):
            if node.module and node.level == 0 and ours(node.module):
                found.append(node.lineno)
        inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(path.read_text()), False)
    return found


def _has_reason(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line or the line before it."""
    return "#" in lines[lineno - 1] or lines[lineno - 2].strip().startswith("#")


def test_few_function_level_imports_each_with_its_reason() -> None:
    found = {
        f"{path.relative_to(ROOT)}:{n}": _has_reason(path.read_text().splitlines(), n)
        for path in _modules().values()
        for n in _function_level_imports(path)
    }
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, sorted(found)
    assert [where for where, reason in sorted(found.items()) if not reason] == []


def test_function_level_imports_are_found_with_their_reasons(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "import json\n"
        "from jobs import models\n"
        "def f():\n"
        "    import os\n"
        "    from jobs.queue import store  # lazy: the database\n"
        "    class C:\n"
        "        def g(self):\n"
        "            # lazy: the web app\n"
        "            import dashboard.app\n"
        "async def h():\n"
        "    from chains import runner\n"
    )
    assert _function_level_imports(path) == [5, 9, 11]
    lines = path.read_text().splitlines()
    assert [_has_reason(lines, n) for n in (5, 9, 11)] == [True, True, False]


def test_no_hidden_imports_of_our_modules() -> None:
    pattern = re.compile(r"import_module|suppress\(ImportError\)|__import__\(")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _modules().values()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
