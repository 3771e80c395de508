"""What a skill declares it needs installed (seed ``003_…``), and what it forgot to.

A Python script with a PEP 723 block (``# /// script`` … ``dependencies = [...]``), a skill
folder with ``requirements.txt`` (or ``[project] dependencies`` in ``pyproject.toml``), or a
Node skill with ``package.json`` + a lockfile: :func:`spec_for` reads that into an
:class:`EnvSpec` whose key is the content hash of what it installs plus the runtime version
(``jobs.execution.envs`` builds it). A ``ModuleNotFoundError`` / ``ImportError`` (or Node's
"Cannot find module/package") becomes a configuration failure saying how to declare it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jobs.envelope import failure
from jobs.skill import ExecType, Skill

__all__ = [
    "BuildFailed",
    "EnvSpec",
    "describe",
    "import_failure",
    "missing_module",
    "node_has_register",
    "pep723_dependencies",
    "spec_for",
]

_PEP723 = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_NO_MODULE = re.compile(r"(ModuleNotFoundError|ImportError): (?:No module named '([^']+)'|(.*))")
_NODE_NO_MODULE = re.compile(r"Cannot find (?:module|package) '([^']+)'")
_LOCKFILES = ("package-lock.json", "npm-shrinkwrap.json")
Kind = Literal["python", "node"]


class BuildFailed(Exception):
    """An environment could not be built; ``package`` and ``key_line`` name why."""

    def __init__(self, message: str, *, package: str = "", key_line: str = "") -> None:
        super().__init__(message)
        self.package = package
        self.key_line = key_line

    def envelope(self, skill_name: str) -> dict[str, Any]:
        """The job's failure: a configuration problem that no re-run fixes."""
        return failure(
            f"skill {skill_name!r}: its dependency environment could not be built: {self}",
            error_type="config",
            non_retriable=True,
            skill=skill_name,
            package=self.package or None,
        )


@dataclass(frozen=True)
class EnvSpec:
    """What one skill needs installed, and where it was declared."""

    kind: Kind
    source: str  # "PEP 723 block in x.py", "requirements.txt", "package-lock.json", …
    requirements: tuple[str, ...]  # Python requirement lines; empty for Node
    files: tuple[tuple[str, bytes], ...]  # Node: package.json + lockfile contents
    key: str  # content hash + runtime version: the environment's directory name
    # Node: the skill's code is (or loads) ES modules, which need the resolve hook
    # (NODE_PATH does not reach them); not part of the key — CommonJS skills share it
    esm: bool = False

    @property
    def dirname(self) -> str:
        return f"{'py' if self.kind == 'python' else 'node'}-{self.key}"


# --- what a skill declares --------------------------------------------------------------


def _runtime_tag(kind: Kind) -> str:
    if kind == "python":
        v = sys.version_info
        return f"{sys.implementation.name}-{v.major}.{v.minor}"
    # the major version decides binary compatibility of node_modules
    return "node-" + (str(node_version()[0]) if node_version() else "none")


@functools.cache
def node_version() -> tuple[int, ...]:
    """The installed Node's version, () when there is none (asked once per process)."""
    import subprocess

    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        return ()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        parts = re.findall(r"\d+", out.stdout)[:3]
        return tuple(int(p) for p in parts)
    return ()


def node_has_register() -> bool:
    """Whether ``node --import`` and ``module.register`` exist (Node 18.19+, 20.6+)."""
    v = node_version()
    return v >= (20, 6) or (18, 19) <= v < (19,)


def _hash(kind: Kind, parts: list[bytes]) -> str:
    h = hashlib.sha256(_runtime_tag(kind).encode())
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:20]


def pep723_dependencies(text: str) -> list[str] | None:
    """The ``dependencies`` of a PEP 723 ``script`` block, or None without a block."""
    for m in _PEP723.finditer(text):
        if m.group("type") != "script":
            continue
        body = "".join(
            line[2:] if line.startswith("# ") else line[1:]
            for line in m.group("content").splitlines(keepends=True)
        )
        try:
            meta = tomllib.loads(body)
        except tomllib.TOMLDecodeError as exc:
            raise BuildFailed(f"the PEP 723 block is not valid TOML: {exc}") from exc
        deps = meta.get("dependencies") or []
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            raise BuildFailed("the PEP 723 block's dependencies must be a list of strings")
        return [d.strip() for d in deps if d.strip()]
    return None


def _requirement_lines(text: str) -> list[str]:
    lines = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _pyproject_dependencies(path: Path) -> list[str]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []
    deps = (data.get("project") or {}).get("dependencies") or []
    return [d for d in deps if isinstance(d, str) and d.strip()]


_Stamp = tuple[int, int, int] | None
#: what a Python skill declares, by the identity of the files it is read from
_PY_SPECS: dict[tuple[str, _Stamp, _Stamp, _Stamp], EnvSpec | None] = {}


def _stamp(path: str) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def _python_spec(skill: Skill) -> EnvSpec | None:
    """:func:`_read_python_spec`, read again only when one of its files changed: three
    ``stat`` calls per run instead of reading and parsing the entry file."""
    entry = skill.entry
    folder = os.fspath(skill.path)
    script = os.fspath(entry) if entry is not None and entry.suffix == ".py" else ""
    key = (
        f"{folder}\0{script}",
        _stamp(script) if script else None,
        _stamp(os.path.join(folder, "requirements.txt")),
        _stamp(os.path.join(folder, "pyproject.toml")),
    )
    try:
        return _PY_SPECS[key]
    except KeyError:
        pass
    spec = _read_python_spec(skill)
    if len(_PY_SPECS) >= 1024:
        _PY_SPECS.clear()
    _PY_SPECS[key] = spec
    return spec


def _read_python_spec(skill: Skill) -> EnvSpec | None:
    entry = skill.entry
    if entry is not None and entry.suffix == ".py" and entry.is_file():
        text = entry.read_text(encoding="utf-8", errors="replace")
        if "# /// script" in text:
            deps = pep723_dependencies(text)
            if deps is not None:
                return _py(f"PEP 723 block in {entry.name}", deps)
    folder = Path(skill.path)
    req = folder / "requirements.txt"
    if req.is_file():
        return _py("requirements.txt", _requirement_lines(req.read_text(encoding="utf-8")))
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        deps = _pyproject_dependencies(pyproject)
        if deps:
            return _py("pyproject.toml", deps)
    return None


def _py(source: str, deps: list[str]) -> EnvSpec | None:
    if not deps:
        return None  # nothing to install: the worker's interpreter as before
    reqs = tuple(deps)
    return EnvSpec("python", source, reqs, (), _hash("python", [r.encode() for r in reqs]))


def _node_spec(skill: Skill) -> EnvSpec | None:
    folder = Path(skill.path)
    pkg = folder / "package.json"
    if not pkg.is_file():
        return None
    lock = next((folder / n for n in _LOCKFILES if (folder / n).is_file()), None)
    if lock is None:
        return None  # `npm ci` needs a lockfile; without one the skill runs as it is
    files = (("package.json", pkg.read_bytes()), (lock.name, lock.read_bytes()))
    key = _hash("node", [f[1] for f in files])
    return EnvSpec("node", lock.name, (), files, key, esm=_uses_esm(skill.entry, folder))


def _uses_esm(entry: Path | None, folder: Path) -> bool:
    """Whether Node loads the entry as an ES module (``.mjs``, or ``"type": "module"`` in
    the nearest package.json) or the entry imports dynamically (``import(``): only those
    runs pay for the resolve hook (a loader thread at start-up)."""
    if entry is None:
        return True  # cannot tell: the hook makes both kinds work
    if entry.suffix in (".mjs", ".mts"):
        return True
    with contextlib.suppress(OSError):
        if "import(" in entry.read_text(encoding="utf-8", errors="replace"):
            return True
    if entry.suffix in (".cjs", ".cts"):
        return False
    here, top = entry.resolve().parent, folder.resolve()
    while here == top or top in here.parents:  # the nearest package.json inside the skill
        pkg = here / "package.json"
        if pkg.is_file():
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(pkg.read_text(encoding="utf-8"))
                return isinstance(data, dict) and data.get("type") == "module"
            return False
        here = here.parent
    return False


def spec_for(skill: Skill) -> EnvSpec | None:
    """The environment the skill needs, or None when it runs with the worker's runtime."""
    if skill.exec_type is ExecType.NODE:
        return _node_spec(skill)
    if skill.exec_type in (ExecType.PYTHON, ExecType.PYTHON_CLI, ExecType.SHELL):
        return _python_spec(skill)
    return None


# --- a skill that imports what it did not declare -----------------------------------------


def missing_module(text: str) -> str | None:
    """The module a ``ModuleNotFoundError``/``ImportError`` (or Node's "Cannot find
    module") in ``text`` names, or None."""
    found = list(_NO_MODULE.finditer(text))
    if found:
        m = found[-1]  # the last one is what ended the run
        return m.group(2) or (m.group(3) or "").strip() or "?"
    n = _NODE_NO_MODULE.search(text)
    return n.group(1) if n else None


def import_failure(skill: Skill, text: str) -> dict[str, Any] | None:
    """A ``config``/``non_retriable`` failure when ``text`` (stderr or an exception) shows a
    missing module: which one, and how to declare it. None otherwise."""
    module = missing_module(text)
    if module is None:
        return None
    if skill.exec_type is ExecType.NODE:
        how = (
            f"add it to the skill's package.json dependencies and ship package-lock.json "
            f"(npm install {module.split('/')[0]})"
        )
    elif (own := _own_module(skill, module.split(".")[0])) is not None:
        # the skill's own folder or a sibling file: installing a package of that name would
        # be wrong (and a dependency-confusion risk)
        how = (
            f"{own} is the skill's own code, not a package to install: the script runs as "
            "`python <entry>` with only its own folder on the import path, so import its "
            "sibling files by their own name (or move the entry next to them)"
        )
    else:
        top = module.split(".")[0]
        how = (
            f'declare it in a PEP 723 block (# /// script / # dependencies = ["{top}"] / '
            f"# ///) or in requirements.txt next to SKILL.md (the PyPI name may differ from "
            f"the module name)"
        )
    return failure(
        f"skill {skill.name!r} needs the module {module!r}, which is not installed: {how}",
        error_type="config",
        non_retriable=True,
        skill=skill.name,
        missing_module=module,
    )


def _own_module(skill: Skill, top: str) -> str | None:
    """The skill's folder or file that provides the module ``top`` (``scripts/``,
    ``helpers.py`` beside the entry…), as a path inside the skill, or None."""
    if not top or top in ("?", ".") or not top.isidentifier():
        return None
    root = Path(skill.path)
    places = [root, root / "scripts"]
    if skill.entry is not None:
        places.insert(0, Path(skill.entry).parent)
    for place in places:
        for candidate in (place / top, place / f"{top}.py"):
            if candidate.exists():
                try:
                    return candidate.relative_to(root).as_posix() + ("/" * candidate.is_dir())
                except ValueError:
                    return candidate.name
    return None


def describe(spec: EnvSpec | None) -> Mapping[str, Any]:
    """A JSON-able summary for ``skills list`` / ``skills check``."""
    if spec is None:
        return {}
    return {"kind": spec.kind, "source": spec.source, "requirements": list(spec.requirements)}
