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


# Upward edges still waiting to be handed in the way the runner is handed its Finisher and
# its Notices: the "cancelled" notice an operator's cancel sends through delivery. Each pair
# is listed here so that no new one can appear unnoticed.
KNOWN_UPWARD = frozenset({("jobs.queue.control", "delivery.notices")})


@pytest.mark.slow
def test_every_import_points_down_the_layers() -> None:
    upward = sorted(
        f"{name} ({LAYERS[_layer(name)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})"
        for name, deps in _graph().items()
        for dep in deps
        if _layer(dep) > _layer(name) and (name, dep) not in KNOWN_UPWARD
    )
    assert upward == []


@pytest.mark.slow
def test_the_known_upward_edges_still_exist() -> None:
    """An edge handed in (or gone) leaves this list, so the list only ever shrinks."""
    graph = _graph()
    assert sorted(e for e in KNOWN_UPWARD if e[1] not in graph.get(e[0], set())) == []


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
    """Modules directly in ``jobs/`` import nothing at import time from its subpackages nor
    from the other packages (``Services`` builds the catalog and the executor on demand)."""
    for name, deps in _graph(top_only=True).items():
        if name.count(".") != 1 or not name.startswith("jobs."):
            continue
        above = {d for d in deps if d.count(".") > 1 or not d.startswith("jobs")}
        assert not above, f"{name} imports {sorted(above)}"


def test_no_hidden_imports_of_our_modules() -> None:
    pattern = re.compile(r"import_module|suppress\(ImportError\)|__import__\(")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _modules().values()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
