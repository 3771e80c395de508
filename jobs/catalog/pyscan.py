"""A Python skill file read with ``ast``, never imported (SPEC §1, §2, C6, C27): its entry
function and the shape of it, an in-code literal schema, and whether it is a command-line
script — argparse + ``__main__``, ``sys.argv``, ``SystemExit``, a top-level script with no
function, or a ``main()`` called bare at import (it would run inside the worker)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

ENTRY_NAMES = ("execute", "run", "handler", "main", "handle")
SCHEMA_NAMES = ("input_schema", "INPUT_SCHEMA", "SCHEMA", "schema")


def inspect_python(path: Path) -> dict[str, Any]:
    """What the executor needs from a ``.py`` file, read with ``ast`` (never imported):
    CLI markers, the entry function and its shape, an in-code literal schema."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    info: dict[str, Any] = {
        "argparse": False,
        "main_guard": False,
        "system_exit": False,
        "reads_argv": False,
        "functions": {},
        "schema": None,
        "schema_name": None,
        "schema_problem": None,
    }
    _scan_markers(tree, info)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            info["functions"][node.name] = _function_shape(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            _read_schema(node, info)
    info["entry"] = next((n for n in ENTRY_NAMES if n in info["functions"]), None)
    info["top_level_code"], info["calls_at_import"] = _module_code(tree, info["functions"])
    info["cli_reason"] = _cli_reason(info)
    info["is_cli"] = bool(info["cli_reason"])
    return info


def _scan_markers(tree: ast.Module, info: dict[str, Any]) -> None:
    # sys.argv read only inside the `if __name__ == "__main__":` block (a handler's local
    # test harness) never runs on import: it does not make the file a script.
    guarded = {
        id(inner)
        for top in tree.body
        if isinstance(top, ast.If) and isinstance(top.test, ast.Compare)
        if _is_main_guard(top.test)
        for stmt in top.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in guarded and isinstance(node, ast.Attribute | ast.ImportFrom):
            continue
        if isinstance(node, ast.Import):
            names = {a.name for a in node.names}
            info["argparse"] |= "argparse" in names
        elif isinstance(node, ast.ImportFrom):
            info["argparse"] |= node.module == "argparse"
            if node.module == "sys" and any(a.name == "argv" for a in node.names):
                info["reads_argv"] = True
        elif isinstance(node, ast.Compare) and _is_main_guard(node):
            info["main_guard"] = True
        elif isinstance(node, ast.Attribute) and node.attr == "argv":
            info["reads_argv"] |= isinstance(node.value, ast.Name) and node.value.id == "sys"
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(exc, ast.Name) and exc.id == "SystemExit":
                info["system_exit"] = True


#: functions whose bare call at module level makes the file a script
SCRIPT_MAINS = frozenset({*ENTRY_NAMES, "cli", "app", "entrypoint", "_main"})
_DECLARATIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _module_code(tree: ast.Module, functions: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether the module runs code when imported (a statement that is not an import, a
    definition, a docstring or an assignment of a literal), and the function of its own it
    calls bare at module level (``main()``, ``asyncio.run(main())``, ``sys.exit(main())``)."""
    runs = False
    called: str | None = None
    for stmt in tree.body:
        if isinstance(stmt, _DECLARATIONS):
            continue
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare):
            if _is_main_guard(stmt.test):
                continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and _literal(stmt.value):
            continue
        runs = True
        if isinstance(stmt, ast.Expr) and called is None:
            found = _own_call(stmt.value, functions)
            # a helper run at import (``setup()``) is not the script's main
            called = found if found in SCRIPT_MAINS else None
    return runs, called


def _literal(node: ast.expr | None) -> bool:
    if node is None:
        return True
    try:
        ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return isinstance(node, ast.Name | ast.Attribute)
    return True


def _own_call(node: ast.expr, functions: dict[str, Any]) -> str | None:
    """``f()`` / ``asyncio.run(f())`` / ``sys.exit(f())`` of a function the file defines."""
    if not isinstance(node, ast.Call):
        return None
    if isinstance(node.func, ast.Name) and node.func.id in functions:
        return node.func.id
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("run", "exit"):
        for arg in node.args:
            found = _own_call(arg, functions)
            if found is not None:
                return found
    return None


def _function_shape(node: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    return {
        "is_async": isinstance(node, ast.AsyncFunctionDef),
        "required": len(positional) - len(args.defaults),
        "params": [a.arg for a in positional],
        "defaults": len(args.defaults),
        "lineno": node.lineno,
    }


def _read_schema(node: ast.Assign | ast.AnnAssign, info: dict[str, Any]) -> None:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for t in targets:
        if not (isinstance(t, ast.Name) and t.id in SCHEMA_NAMES and node.value is not None):
            continue
        current = info["schema_name"]
        if current is not None and SCHEMA_NAMES.index(t.id) > SCHEMA_NAMES.index(current):
            continue
        info["schema_name"] = t.id
        try:
            info["schema"] = ast.literal_eval(node.value)
            info["schema_problem"] = None
        except (ValueError, SyntaxError, TypeError):
            info["schema"] = None
            info["schema_problem"] = (
                f"in-code schema {t.id} is not a literal and was not read (put it in schema.json)"
            )


def _cli_reason(info: dict[str, Any]) -> str:
    """Why the file is a command-line script (SPEC §2, C6), or "" for an in-process entry.

    argparse + ``__main__``, a ``raise SystemExit``, any read of ``sys.argv``, or a
    ``__main__`` block whose entry takes no input (or that has no entry function at all):
    such a script would read the host's argv and write into its stdout if run in-process.
    """
    if info.get("calls_at_import"):
        # it would run inside the worker when imported, its printed text lost
        return f"calls {info['calls_at_import']}() at import"
    if info.get("top_level_code") and info["entry"] is None:
        return "top-level script (no entry function)"
    if info["reads_argv"]:
        return "reads sys.argv"
    if info["argparse"] and info["main_guard"]:
        return "argparse + __main__"
    if info["system_exit"]:
        return "raises SystemExit"
    if info["main_guard"]:
        entry = info["entry"]
        if entry is None:
            return "__main__ block, no entry function"
        if not info["functions"][entry]["params"]:
            return f"__main__ block, {entry}() takes no input"
    return ""


def entry_arity_problem(name: str, fn: dict[str, Any]) -> str | None:
    """The one binding rule for entry functions, shared by the loader (runtime) and
    ``skills check``: 0, 1 or 2 required positional parameters (f(), f(input),
    f(input, ctx)); more can never be bound."""
    if fn["required"] <= 2:
        return None
    params = ", ".join(fn["params"])
    return (
        f"{name}() requires {fn['required']} positional parameters ({params}); an entry "
        "gets at most 2: async def execute(input_data, runtime_context)"
    )


def _is_main_guard(node: ast.Compare) -> bool:
    parts = [node.left, *node.comparators]
    names = any(isinstance(p, ast.Name) and p.id == "__name__" for p in parts)
    main = any(isinstance(p, ast.Constant) and p.value == "__main__" for p in parts)
    return names and main


# --------------------------------------------------------------------------- helpers


__all__ = ["ENTRY_NAMES", "SCHEMA_NAMES", "entry_arity_problem", "inspect_python"]
