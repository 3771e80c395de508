"""Dependency environments of skills (seed ``003_…``: PEP 723 / requirements.txt build a venv).

A Python script with a PEP 723 block (``# /// script`` … ``dependencies = [...]``), or a
skill folder with ``requirements.txt`` (or ``[project] dependencies`` in ``pyproject.toml``),
runs in its own virtual environment; a Node skill with ``package.json`` + a lockfile runs
with its own ``node_modules`` (what is declared: ``env_specs``; what is on disk and its
cleanup: ``env_store``). An environment is keyed by the content hash of what it
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
import importlib.abc
import importlib.machinery
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from jobs import phases
from jobs.catalog.loader import load_registry
from jobs.execution import env_store
from jobs.execution.env_specs import (
    BuildFailed,
    EnvSpec,
    describe,
    import_failure,
    missing_module,
    node_has_register,
    pep723_dependencies,
    spec_for,
)
from jobs.execution.env_store import INFO, READY, Lease, Policy, PruneReport
from jobs.execution.sandbox import Plan, Sandbox, SandboxUnavailable, sandbox_mode, trust
from jobs.settings import Settings
from jobs.skill import Skill

__all__ = [  # what a skill declares comes from env_specs, re-exported here
    "PREPARING",
    "READY",
    "BuildFailed",
    "EnvManager",
    "EnvSpec",
    "Prepared",
    "cleanup",
    "declared",
    "describe",
    "exposed",
    "import_failure",
    "missing_module",
    "pep723_dependencies",
    "spec_for",
]

log = logging.getLogger(__name__)

CREATE_VENV = "creating the virtual environment"
BUILD_TMP_MB = 2048  # the private /tmp of a sandboxed build (its download cache is there)
PREPARING = "preparing environment"  # the job's phase while its environment is built
DEFAULT_TIMEOUT_SEC = 600.0
MAX_KEY_LINE = 300
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
#: makes ESM ``import`` honour NODE_PATH (loaded with ``node --import``; Node >= 18.19)
NODE_ESM_HOOK = Path(__file__).with_name("node_paths.mjs")


@dataclass(frozen=True)
class Prepared:
    """A built environment: the interpreter and search paths a skill process gets. It is
    held (``lease``) until :meth:`release`: the cleanup never removes it meanwhile."""

    spec: EnvSpec
    path: Path
    lease: Lease | None = None
    esm_hook: Path | None = None  # Node ES modules: the resolve hook, next to the environments

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
        if self.esm_hook is not None:  # ES modules ignore NODE_PATH: the hook reads it
            hook = f'--import "{self.esm_hook.as_uri()}"'
            env["NODE_OPTIONS"] = " ".join(p for p in (hook, env.get("NODE_OPTIONS")) if p)
        return argv


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
    env["COLUMNS"] = "1000"  # uv wraps its errors at the terminal width: keep each on one line
    return env


# What a sandboxed build is told of the deployment: where the package index is and how to
# reach it, nothing else. uv reads neither pip.conf nor PIP_* variables, so the pip names
# are handed to it under its own (UV_INDEX_URL, UV_FIND_LINKS…) as well.
INDEX_NAMES = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_TRUSTED_HOST",
    "PIP_CERT",
    "PIP_DEFAULT_TIMEOUT",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
    "UV_FIND_LINKS",
    "UV_NATIVE_TLS",
    "UV_HTTP_TIMEOUT",
    "NPM_CONFIG_REGISTRY",
    "npm_config_registry",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
)
UV_FROM_PIP = {
    "PIP_INDEX_URL": "UV_INDEX_URL",
    "PIP_EXTRA_INDEX_URL": "UV_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS": "UV_FIND_LINKS",
}


def sandboxed_build_environ(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a sandboxed build: built from nothing but the index and proxy
    settings (``source``: the worker's environment)."""
    src = os.environ if source is None else source
    env = {k: src[k] for k in INDEX_NAMES if src.get(k)}
    for pip_name, uv_name in UV_FROM_PIP.items():
        if pip_name in env and uv_name not in env:
            env[uv_name] = (
                env[pip_name].replace(" ", "\n") if uv_name == "UV_INDEX" else env[pip_name]
            )
    env.update(
        PATH=src.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        LANG="C.UTF-8",
        HOME="/tmp",
        TMPDIR="/tmp",
        UV_CACHE_DIR="/tmp/uv-cache",  # per build: one build cannot poison another's cache
        UV_LINK_MODE="copy",
        npm_config_cache="/tmp/npm-cache",
        UV_NO_PROGRESS="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        NO_COLOR="1",
    )
    return env


def _local_sources(env: Mapping[str, str]) -> list[str]:
    """Local folders a build reads packages from (find-links, CA files): bound read-only."""
    out: list[str] = []
    for name in ("PIP_FIND_LINKS", "UV_FIND_LINKS", "SSL_CERT_FILE", "SSL_CERT_DIR", "PIP_CERT"):
        for part in env.get(name, "").split():
            path = part.removeprefix("file://")
            if path.startswith("/") and os.path.exists(path):
                out.append(path)
    return out


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
        sandbox: Sandbox | None = None,
    ) -> None:
        self.root = Path(root)
        self.timeout = timeout
        # None: look it up; False: never use uv (venv + pip)
        self.uv = find_uv() if uv is None else (uv or None)
        # builds of untrusted skills run in this sandbox (None: as the worker)
        self.sandbox = sandbox
        self.settings: Settings | None = None
        self._local = threading.local()  # what the build running in this thread may do
        self._ready: set[Path] = set()
        self._hook: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None) -> EnvManager:
        if settings is None:
            import tempfile

            return cls(Path(tempfile.gettempdir()) / "skilljobs-envs")
        timeout = float(getattr(settings, "skill_env_timeout_sec", DEFAULT_TIMEOUT_SEC))
        box = None
        if sandbox_mode(settings) != "none":
            with contextlib.suppress(SandboxUnavailable):
                box = Sandbox.from_settings(settings)
        made = cls(Path(settings.data_dir).resolve() / "envs", timeout=timeout, sandbox=box)
        made.settings = settings
        return made

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

    def esm_hook(self) -> Path:
        """The resolve hook's copy in the environments folder, where a skill process can
        read it whatever user or sandbox it runs under (written once per process)."""
        if self._hook is None:
            text = NODE_ESM_HOOK.read_bytes()
            dest = self.root / NODE_ESM_HOOK.name
            with contextlib.suppress(OSError):
                if dest.read_bytes() == text:
                    self._hook = dest
                    return dest
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
            tmp.write_bytes(text)
            tmp.chmod(0o644)
            os.replace(tmp, dest)
            self._hook = dest
        return self._hook

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
                try:
                    hook = self.esm_hook() if spec.esm and node_has_register() else None
                except OSError as exc:
                    lease.release()
                    raise BuildFailed(f"cannot write the Node resolve hook: {exc}") from exc
                return Prepared(spec, self.path_of(spec), lease, hook)
            lease.release()
            await self._build_now(skill, spec)
        raise BuildFailed(f"the environment {spec.dirname} was removed again while starting")

    async def _build_now(self, skill: Skill, spec: EnvSpec) -> None:
        log.info("skill %s: %s (%s)", skill.name, PREPARING, spec.source)
        t0 = time.monotonic()
        await phases.report(PREPARING, spec.source)
        sandboxed = not trust(skill.path, self.settings)[0]
        folder = str(skill.path)
        try:
            await asyncio.to_thread(self.build, spec, source_dir=folder, sandboxed=sandboxed)
        finally:
            await phases.report(None, "")
        log.info("skill %s: environment ready in %.1f s", skill.name, time.monotonic() - t0)

    def build(self, spec: EnvSpec, *, source_dir: str = "", sandboxed: bool = True) -> Path:
        """Build the environment unless another process did meanwhile (blocking).
        ``sandboxed``: in the sandbox, writing only the environment's folder and reading
        only the system, the interpreter and ``source_dir`` (the skill's folder). An
        untrusted build whose sandbox cannot start is refused."""
        path = self.path_of(spec)
        self._local.building = (sandboxed, os.path.realpath(source_dir) if source_dir else "")
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
        sandboxed, source_dir = getattr(self._local, "building", (False, ""))
        try:
            if sandboxed:
                res = self._sandboxed_step(argv, spec, cwd=cwd, source_dir=source_dir)
            else:
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

    def _sandboxed_step(
        self, argv: list[str], spec: EnvSpec, *, cwd: Path | None, source_dir: str
    ) -> subprocess.CompletedProcess[str]:
        if self.sandbox is None:
            self.sandbox = Sandbox()  # the defaults: built without settings
        box = self.sandbox
        problem = box.problem()
        if problem is not None:
            raise BuildFailed(
                f"the skill is not trusted and its build sandbox cannot start: {problem}"
            )
        env = sandboxed_build_environ()
        path = str(self.path_of(spec))
        ro = [source_dir, *_local_sources(env)]
        if self.uv:
            ro.append(os.path.dirname(os.path.realpath(self.uv)))
        plan = Plan(cwd=str(cwd or path), ro=ro, rw=[path], tmp_mb=BUILD_TMP_MB)
        try:
            return box.run_sync(argv, plan, env=env, timeout=self.timeout)
        except SandboxUnavailable as exc:
            raise BuildFailed(str(exc)) from exc

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
    settings: Settings,
    *,
    dry_run: bool = False,
    policy: Policy | None = None,
    now: float | None = None,
) -> PruneReport:
    """Remove the environments under the data dir that ``settings`` (or ``policy``) let go,
    never one in use (blocking: run it in a thread). The skills of the configured skill
    folders say which environments are still declared."""

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
