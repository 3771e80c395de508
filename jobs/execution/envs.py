"""Dependency environments of skills (seed ``003_…``: PEP 723 / requirements.txt build a venv).

A Python script with a PEP 723 block (``# /// script`` … ``dependencies = [...]``), or a
skill folder with ``requirements.txt`` (or ``[project] dependencies`` in ``pyproject.toml``),
runs in its own virtual environment; a Node skill with ``package.json`` + a lockfile runs
with its own ``node_modules``. An environment is keyed by the content hash of what it
installs plus the runtime version, lives under ``<data_dir>/envs/<kind>-<hash>``, is shared
by every skill with the same set and replaced by a new one when the set changes.

Builds use ``uv`` (``venv`` + ``pip`` when it is missing) and ``npm ci --ignore-scripts``,
under a file lock (two workers never build the same environment at once) and a timeout.
The venvs are created without system site-packages: the worker's own packages are not
visible to a skill.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import fcntl
import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import logging
import os
import re
import shutil
import sys
import time
import tomllib
import types
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jobs import phases
from jobs.envelope import failure
from jobs.execution import env_store
from jobs.execution.env_store import INFO, READY, Lease, Policy, PruneReport
from jobs.skill import ExecType, Skill

__all__ = [
    "PREPARING",
    "BuildFailed",
    "EnvManager",
    "EnvSpec",
    "Prepared",
    "import_failure",
    "spec_for",
]

log = logging.getLogger(__name__)

CREATE_VENV = "creating the virtual environment"
PREPARING = "preparing environment"  # the job's phase while its environment is built
DEFAULT_TIMEOUT_SEC = 600.0
MAX_KEY_LINE = 300
_PEP723 = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_NO_MODULE = re.compile(r"(ModuleNotFoundError|ImportError): (?:No module named '([^']+)'|(.*))")
_NODE_NO_MODULE = re.compile(r"Cannot find (?:module|package) '([^']+)'")
#: makes ESM ``import`` honour NODE_PATH (loaded with ``node --import``; Node >= 18.19)
NODE_ESM_HOOK = Path(__file__).with_name("node_paths.mjs")
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

    @property
    def dirname(self) -> str:
        return f"{'py' if self.kind == 'python' else 'node'}-{self.key}"


@dataclass(frozen=True)
class Prepared:
    """A built environment: the interpreter and search paths a skill process gets. It is
    held (``lease``) until :meth:`release`: the cleanup never removes it meanwhile."""

    spec: EnvSpec
    path: Path
    lease: Lease | None = None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    @property
    def bin_dir(self) -> Path:
        if self.spec.kind == "python":
            return self.path / "bin"
        return self.path / "node_modules" / ".bin"

    @property
    def python(self) -> str | None:
        return str(self.path / "bin" / "python") if self.spec.kind == "python" else None

    @property
    def node_path(self) -> str | None:
        return str(self.path / "node_modules") if self.spec.kind == "node" else None

    def site_packages(self) -> list[str]:
        if self.spec.kind != "python":
            return []
        return [str(p) for p in sorted((self.path / "lib").glob("python*/site-packages"))]

    def apply(self, argv: list[str], env: MutableMapping[str, str]) -> list[str]:
        """Point a skill command at this environment: the venv's Python instead of the
        worker's (and first on ``PATH``), or ``NODE_PATH`` at the cached ``node_modules``."""
        env["PATH"] = os.pathsep.join(p for p in (str(self.bin_dir), env.get("PATH")) if p)
        if self.spec.kind == "python":
            env["VIRTUAL_ENV"] = str(self.path)
            if argv and argv[0] == sys.executable and self.python:
                return [self.python, *argv[1:]]
            return argv
        env["NODE_PATH"] = os.pathsep.join(p for p in (self.node_path, env.get("NODE_PATH")) if p)
        if node_has_register():  # ES modules ignore NODE_PATH: a resolve hook reads it
            hook = f'--import "{NODE_ESM_HOOK.as_uri()}"'
            env["NODE_OPTIONS"] = " ".join(p for p in (hook, env.get("NODE_OPTIONS")) if p)
        return argv


# --- what a skill declares --------------------------------------------------------------


def _runtime_tag(kind: Kind) -> str:
    if kind == "python":
        v = sys.version_info
        return f"{sys.implementation.name}-{v.major}.{v.minor}"
    # the major version decides binary compatibility of node_modules
    return "node-" + (str(_node_version()[0]) if _node_version() else "none")


@functools.cache
def _node_version() -> tuple[int, ...]:
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
    v = _node_version()
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


def _python_spec(skill: Skill) -> EnvSpec | None:
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
    return EnvSpec("node", lock.name, (), files, _hash("node", [f[1] for f in files]))


def spec_for(skill: Skill) -> EnvSpec | None:
    """The environment the skill needs, or None when it runs with the worker's runtime."""
    if skill.exec_type is ExecType.NODE:
        return _node_spec(skill)
    if skill.exec_type in (ExecType.PYTHON, ExecType.PYTHON_CLI, ExecType.SHELL):
        return _python_spec(skill)
    return None


# --- building ---------------------------------------------------------------------------


@contextlib.contextmanager
def _file_lock(path: Path, timeout: float) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` across processes (polled, so it can time out)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise BuildFailed(
                        f"another process has been building this environment for over {timeout:g} s"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def find_uv() -> str | None:
    """The ``uv`` binary: the one installed with this distribution, else on ``PATH``."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        from uv import find_uv_bin

        return str(find_uv_bin())
    return shutil.which("uv")


def _build_environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLJOBS_", "PYTHON"))}
    for k in ("VIRTUAL_ENV", "CONDA_PREFIX", "UV_PROJECT_ENVIRONMENT"):
        env.pop(k, None)
    env.update(UV_NO_PROGRESS="1", PIP_DISABLE_PIP_VERSION_CHECK="1", NO_COLOR="1")
    return env


def key_line(output: str) -> str:
    """The line of a uv / pip / npm error output that says what went wrong."""
    lines = [ln.strip(" ×╰─▶│|\t") for ln in output.splitlines()]
    lines = [ln for ln in lines if ln]
    markers = (
        "Because ",
        "No matching distribution",
        "Could not find a version",
        "not found in the package registry",
        "npm error 404",
        "npm ERR! 404",
        "error:",
        "ERROR:",
        "npm error",
        "npm ERR!",
    )
    for marker in markers:
        for ln in lines:
            if marker in ln:
                return ln.removeprefix("cause: ")[:MAX_KEY_LINE]
    return (lines[-1] if lines else "(no output)")[:MAX_KEY_LINE]


def _package_in(line: str, spec: EnvSpec) -> str:
    names = [m.group(1) for r in spec.requirements if (m := _REQ_NAME.match(r))]
    if spec.kind == "node":
        for _name, content in spec.files[:1]:
            with contextlib.suppress(ValueError):
                pkg = json.loads(content)
                for field in ("dependencies", "devDependencies", "optionalDependencies"):
                    names.extend(pkg.get(field) or {})
    low = line.lower()
    for name in sorted(names, key=len, reverse=True):
        if name.lower() in low or name.lower().replace("_", "-") in low:
            return name
    return names[0] if len(names) == 1 else ""


class EnvManager:
    """Builds and finds the environments under ``root`` (``<data_dir>/envs``)."""

    def __init__(
        self,
        root: Path,
        *,
        timeout: float = DEFAULT_TIMEOUT_SEC,
        uv: str | Literal[False] | None = None,
    ) -> None:
        self.root = Path(root)
        self.timeout = timeout
        # None: look it up; False: never use uv (venv + pip)
        self.uv = find_uv() if uv is None else (uv or None)
        self._ready: set[Path] = set()

    @classmethod
    def from_settings(cls, settings: Any) -> EnvManager:
        if settings is None:
            import tempfile

            return cls(Path(tempfile.gettempdir()) / "skilljobs-envs")
        timeout = float(getattr(settings, "skill_env_timeout_sec", DEFAULT_TIMEOUT_SEC))
        return cls(Path(settings.data_dir).resolve() / "envs", timeout=timeout)

    def path_of(self, spec: EnvSpec) -> Path:
        return self.root / spec.dirname

    def state(self, skill: Skill) -> str:
        """``none`` (no dependencies), ``ready``, ``missing`` or ``invalid: …``."""
        try:
            spec = spec_for(skill)
        except BuildFailed as exc:
            return f"invalid: {exc}"
        if spec is None:
            return "none"
        return "ready" if (self.path_of(spec) / READY).is_file() else "missing"

    def is_ready(self, spec: EnvSpec) -> bool:
        # one stat per run: an environment removed meanwhile (cleanup) is built again
        path = self.path_of(spec)
        if (path / READY).is_file():
            self._ready.add(path)
            return True
        self._ready.discard(path)
        return False

    def forget(self, spec: EnvSpec) -> None:
        self._ready.discard(self.path_of(spec))

    async def prepare(self, skill: Skill) -> Prepared | None:
        """The skill's environment, built first if missing (off the event loop), and held
        for the caller (``Prepared.release`` when the run is over). A job's run shows
        ``preparing environment`` while it is built (:mod:`jobs.phases`)."""
        spec = spec_for(skill)
        if spec is None:
            return None
        for _ in range(3):  # a cleanup may remove it between the build and the hold
            try:
                lease = await Lease.take(self.root, spec.dirname, self.timeout)
            except (OSError, TimeoutError) as exc:
                raise BuildFailed(f"cannot use the environment {spec.dirname}: {exc}") from exc
            if self.is_ready(spec):
                return Prepared(spec, self.path_of(spec), lease)
            lease.release()
            await self._build_now(skill, spec)
        raise BuildFailed(f"the environment {spec.dirname} was removed again while starting")

    async def _build_now(self, skill: Skill, spec: EnvSpec) -> None:
        log.info("skill %s: %s (%s)", skill.name, PREPARING, spec.source)
        t0 = time.monotonic()
        await phases.report(PREPARING, spec.source)
        try:
            await asyncio.to_thread(self.build, spec)
        finally:
            await phases.report(None, "")
        log.info("skill %s: environment ready in %.1f s", skill.name, time.monotonic() - t0)

    def build(self, spec: EnvSpec) -> Path:
        """Build the environment unless another process did meanwhile (blocking)."""
        path = self.path_of(spec)
        with _file_lock(self.root / f"{spec.dirname}.lock", self.timeout):
            if (path / READY).is_file():
                self._ready.add(path)
                return path
            if path.exists():
                shutil.rmtree(path)  # a build that died half-way
            path.mkdir(parents=True)
            try:
                if spec.kind == "python":
                    self._build_python(spec, path)
                else:
                    self._build_node(spec, path)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            info = {"source": spec.source, "requirements": list(spec.requirements)}
            (path / INFO).write_text(json.dumps(info, indent=1))
            (path / READY).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self._ready.add(path)
        return path

    def _step(self, argv: list[str], spec: EnvSpec, *, cwd: Path | None, what: str) -> None:
        import subprocess

        try:
            res = subprocess.run(
                argv,
                cwd=cwd,
                env=_build_environ(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BuildFailed(f"{what} did not finish within {self.timeout:g} s") from None
        except OSError as exc:
            raise BuildFailed(f"{what}: cannot start {argv[0]}: {exc}") from exc
        if res.returncode != 0:
            line = key_line(res.stderr + "\n" + res.stdout)
            package = _package_in(line, spec) if what != CREATE_VENV else ""
            named = f" (package {package!r})" if package else ""
            raise BuildFailed(
                f"{what} failed{named}: {line} — fix the dependency in {spec.source}",
                package=package,
                key_line=line,
            )

    def _build_python(self, spec: EnvSpec, path: Path) -> None:
        reqs = path / "requirements.in"
        python = str(path / "bin" / "python")
        if self.uv:
            self._step(
                [self.uv, "venv", "--quiet", "--python", sys.executable, str(path)],
                spec,
                cwd=None,
                what=CREATE_VENV,
            )
            install = [self.uv, "pip", "install", "--quiet", "--python", python, "-r", str(reqs)]
        else:
            self._step(
                [sys.executable, "-m", "venv", str(path)],
                spec,
                cwd=None,
                what=CREATE_VENV,
            )
            install = [python, "-m", "pip", "install", "--quiet", "-r", str(reqs)]
        reqs.write_text("\n".join(spec.requirements) + "\n", encoding="utf-8")
        self._step(install, spec, cwd=None, what="installing " + ", ".join(spec.requirements))

    def _build_node(self, spec: EnvSpec, path: Path) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise BuildFailed("npm is not installed on this host (needed for package.json)")
        for name, content in spec.files:
            (path / name).write_bytes(content)
        self._step(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
            spec,
            cwd=path,
            what=f"npm ci ({spec.source})",
        )


# --- cleanup -------------------------------------------------------------------------------


def declared(skills: Iterable[Skill]) -> set[str]:
    """The environment names the given skills declare (unreadable declarations skipped)."""
    names = set()
    for skill in skills:
        with contextlib.suppress(BuildFailed, OSError):
            spec = spec_for(skill) if skill.runnable else None
            if spec is not None:
                names.add(spec.dirname)
    return names


def cleanup(
    settings: Any,
    *,
    dry_run: bool = False,
    policy: Policy | None = None,
    now: float | None = None,
) -> PruneReport:
    """Remove the environments under the data dir that ``settings`` (or ``policy``) let go,
    never one in use (blocking: run it in a thread). The skills of the configured skill
    folders say which environments are still declared."""
    from jobs.catalog.loader import load_registry

    wanted: set[str] | None
    try:
        wanted = declared(load_registry(settings.skill_dirs))
    except Exception:  # cannot tell what is declared: that rule stays off this time
        log.warning("skill environments cleanup: the skills did not load", exc_info=True)
        wanted = None
    root = EnvManager.from_settings(settings).root
    report = env_store.prune(
        root, policy or Policy.from_settings(settings), wanted=wanted, dry_run=dry_run, now=now
    )
    for env, why in report.removed:
        log.info("skill environment %s %s: %s", env.name, "would go" if dry_run else "removed", why)
    return report


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


def describe(spec: EnvSpec | None) -> Mapping[str, Any]:
    """A JSON-able summary for ``skills list`` / ``skills check``."""
    if spec is None:
        return {}
    return {"kind": spec.kind, "source": spec.source, "requirements": list(spec.requirements)}


_pinned: dict[Path, Prepared] = {}
_sites_of: dict[Path, tuple[str, ...]] = {}
#: the site-packages of the in-process skill running in this context (its own environment)
_SITES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "skilljobs_skill_sites", default=()
)


class _SkillEnvFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: a top-level import the worker's own packages do not
    satisfy is looked up in the environment of the in-process skill making it — never in
    another skill's (a package another skill already imported stays in ``sys.modules``)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None:
            return None  # a submodule: its package's own __path__ finds it
        sites = _SITES.get()
        if not sites:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, list(sites))


_FINDER = _SkillEnvFinder()


@contextlib.contextmanager
def exposed(prepared: Prepared | None) -> Iterator[None]:
    """In-process skills: while the skill imports and runs in this context (threads and
    tasks it starts from there included), its environment's packages are importable,
    after the worker's own (a skill cannot replace a package the platform runs on). The
    environment stays held for the process's life: its modules may be loaded any time."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    sites: tuple[str, ...] = ()
    if prepared is not None:
        if prepared.path in _pinned:
            prepared.release()  # held already
        else:
            _pinned[prepared.path] = prepared
        sites = _sites_of.get(prepared.path) or ()
        if not sites:
            sites = _sites_of[prepared.path] = tuple(prepared.site_packages())
    token = _SITES.set(sites)
    try:
        yield
    finally:
        _SITES.reset(token)
