"""The sandbox of skills: bubblewrap (``bwrap``) around every untrusted skill process.

One module owns bwrap. A sandboxed process gets new user, pid, mount, ipc, uts, cgroup and
network namespaces (and may make no user namespace of its own), ``--die-with-parent`` and
its own ``/proc``: when the run ends its pid namespace is torn down, so nothing it started
(``setsid``, double fork, ``nohup``) outlives it, and it dies with the worker. It sees:

* the system read-only (``/usr``, ``/bin``, ``/lib*``, ``/etc``) with every entry of
  ``/etc`` that other users may not read (``shadow``, ssh host keys, private TLS keys)
  replaced by an empty one — inside, the skill's id maps to the worker's, so what the
  worker's user owns must simply not be there;
* the interpreter's installation, the skill folder and its dependency environment
  read-only;
* its workspace read-write (bind-mounted at the same path: what it writes belongs to the
  worker, nothing is ever ``chown``-ed) and a private, size-limited ``/tmp``;
* no data dir, no other workspace, no home, no host ``/proc``.

Network: a private network namespace served by ``slirp4netns --disable-host-loopback``
(user-mode networking): the Internet is reachable, the host's loopback (Redis, PostgreSQL,
the web app) is not. ``SKILLJOBS_SANDBOX_NETWORK=none`` gives no network at all.

Limits (``setrlimit`` before bwrap starts, inherited by everything inside): memory (data
segment), CPU time, processes (enforced by the kernel for a non-root worker only), largest
file; the workspace quota is checked when the run ends (:func:`workspace_usage`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from jobs.settings import BUNDLED_SKILLS, Settings
from jobs.skill import Skill

PR_SET_PDEATHSIG = 1
SKILL_UID = 65534  # the id a skill has inside its user namespace ("nobody")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
MASK_DEPTH = 3  # levels of /etc searched for entries other users may not read
NETWORK_MODES = ("slirp4netns", "none")
SLIRP_DNS = "10.0.2.3"
SLIRP_READY_SEC = 15.0  # (each of: the sandbox's loopback up, slirp4netns ready)
BWRAP_READY_SEC = 30.0  # bwrap reports its sandbox's pid
WORKSPACE_WALK_LIMIT = 100_000


class SandboxUnavailable(Exception):
    """The sandbox cannot start here; the message says what to install or enable."""


@dataclass(frozen=True)
class Limits:
    """Per-run resource limits; 0 = no limit."""

    memory_mb: int = 2048
    cpu_sec: int = 3600
    nproc: int = 512
    fsize_mb: int = 1024
    tmp_mb: int = 256
    workspace_mb: int = 2048

    @classmethod
    def from_settings(cls, settings: Settings | None) -> Limits:
        fields = ("memory_mb", "cpu_sec", "nproc", "fsize_mb", "tmp_mb", "workspace_mb")
        values = {f: int(getattr(settings, f"sandbox_{f}", getattr(cls, f))) for f in fields}
        return cls(**values)

    def rlimits(self) -> list[tuple[int, int]]:
        mb = 1 << 20
        pairs = [
            (resource.RLIMIT_DATA, self.memory_mb * mb),
            (resource.RLIMIT_CPU, self.cpu_sec),
            (resource.RLIMIT_NPROC, self.nproc),
            (resource.RLIMIT_FSIZE, self.fsize_mb * mb),
        ]
        return [(which, n) for which, n in pairs if n > 0]


PRLIMIT_OPTIONS = {
    resource.RLIMIT_DATA: "--data",
    resource.RLIMIT_CPU: "--cpu",
    resource.RLIMIT_NPROC: "--nproc",
    resource.RLIMIT_FSIZE: "--fsize",
}


def launcher(limits: Sequence[tuple[int, int]] = (), *, pdeathsig: bool = False) -> list[str]:
    """A command prefix that applies ``limits`` (``prlimit``) and the parent-death signal
    (``setpriv --pdeathsig``) before it execs: unlike a ``preexec_fn``, it lets the worker
    start processes with ``vfork`` (a fork of the whole worker costs milliseconds). Empty
    when the tools are missing: :func:`child_setup` does it then."""
    out: list[str] = []
    if pdeathsig:
        setpriv = _tool("setpriv")
        if setpriv is None:
            return []
        out += [setpriv, "--pdeathsig", "KILL"]
    if limits:
        prlimit = _tool("prlimit")
        if prlimit is None:
            return []
        out += [prlimit, *(f"{PRLIMIT_OPTIONS[w]}={n}" for w, n in limits if w in PRLIMIT_OPTIONS)]
    return out


_TOOLS: dict[str, str | None] = {}


def _tool(name: str) -> str | None:
    if name not in _TOOLS:
        _TOOLS[name] = shutil.which(name)
    return _TOOLS[name]


def _prctl(option: int, arg: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, arg, 0, 0, 0))


def child_setup(limits: Sequence[tuple[int, int]] = ()) -> Callable[[], None]:
    """A ``preexec_fn``: die with the worker (``PR_SET_PDEATHSIG``) and apply ``limits``
    (never raising a limit the worker itself already has lower)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def setup() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the worker died between fork and prctl
            os._exit(1)
        for which, n in limits:
            _soft, hard = resource.getrlimit(which)
            cap = n if hard == resource.RLIM_INFINITY else min(n, hard)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(which, (cap, cap))

    return setup


# --- the view of the filesystem -------------------------------------------------------------


def _masked(root: str, depth: int) -> list[tuple[str, bool]]:
    """Entries under ``root`` that other users may not read: (path, is_dir)."""
    found: list[tuple[str, bool]] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return found
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        need = stat.S_IROTH | (stat.S_IXOTH if is_dir else 0)
        if st.st_mode & need != need:
            found.append((entry.path, is_dir))
        elif is_dir and depth > 1:
            found += _masked(entry.path, depth - 1)
    return found


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _install_root(program: str) -> str | None:
    """The installation a program lives in (``…/bin/x`` → ``…``), when it is outside the
    system directories (a pyenv Python, a Node of nvm, a uv binary)."""
    found = shutil.which(program) if "/" not in program else program
    if not found:
        return None
    real = os.path.realpath(found)
    parent = os.path.dirname(real)
    root = os.path.dirname(parent) if os.path.basename(parent) == "bin" else parent
    return None if _under(real, SYSTEM_DIRS) or root in ("", "/") else root


@dataclass
class Plan:
    """What one sandboxed process sees: ``ro`` and ``rw`` are bound at their own paths."""

    cwd: str
    ro: list[str] = field(default_factory=list)
    rw: list[str] = field(default_factory=list)
    network: bool = True
    tmp_mb: int = 256


class Sandbox:
    """Builds bwrap command lines and starts sandboxed processes (one per process)."""

    def __init__(
        self,
        *,
        network: str = "slirp4netns",
        limits: Limits | None = None,
        bwrap: str | None = None,
    ) -> None:
        if network not in NETWORK_MODES:
            raise SandboxUnavailable(
                f"SKILLJOBS_SANDBOX_NETWORK={network!r} is not known "
                f"(use one of: {', '.join(NETWORK_MODES)})"
            )
        self.network = network
        self.limits = limits or Limits()
        self.bwrap = bwrap or shutil.which("bwrap")
        self.slirp = shutil.which("slirp4netns")
        self._probe: str | bool | None = False  # False: not probed; None: works; str: why not
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings | None) -> Sandbox:
        network = str(getattr(settings, "sandbox_network", "slirp4netns") or "slirp4netns")
        return cls(network=network.strip().lower(), limits=Limits.from_settings(settings))

    # --- availability ---------------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the sandbox cannot start here (None: it can); probed once per process."""
        with self._lock:
            if self._probe is False:
                self._probe = self._check()
            assert not isinstance(self._probe, bool)  # probed: None or why not
            return self._probe

    def _check(self) -> str | None:
        if self.bwrap is None:
            return (
                "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get "
                "install bubblewrap) or mark this skill's folder trusted"
            )
        if self.network == "slirp4netns" and self.slirp is None:
            return (
                "slirp4netns is not installed (the network of sandboxed skills): install it "
                "(apt-get install slirp4netns) or set SKILLJOBS_SANDBOX_NETWORK=none"
            )
        argv = self.argv(["/bin/true"], Plan(cwd="/", network=False))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap cannot start: {exc}"
        if done.returncode != 0:
            why = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            return (
                f"bubblewrap cannot create its namespaces here ({why[0]}): enable "
                "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0; in Docker run with --security-opt "
                "seccomp=unconfined or a profile allowing clone/unshare of user namespaces, "
                "and --security-opt apparmor=unconfined where AppArmor applies)"
            )
        return None

    # --- command lines --------------------------------------------------------------------

    @cached_property
    def _system(self) -> list[str]:
        """The bind arguments every sandbox shares (computed once per process)."""
        out: list[str] = []
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                out += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                out += ["--ro-bind", d, d]
        for path, is_dir in _masked("/etc", MASK_DEPTH):
            out += ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]
        return out

    @cached_property
    def _runtimes(self) -> list[str]:
        """Our interpreter's installation (a virtualenv, its base Python), bound after the
        private ``/tmp``: an installation under ``/tmp`` would be hidden by it otherwise."""
        out: list[str] = []
        runtimes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}
        for root in sorted(runtimes):
            if not _under(root, SYSTEM_DIRS):
                out += ["--ro-bind", root, root]
        return out

    def argv(
        self, command: list[str], plan: Plan, *, info_fd: int = -1, block_fd: int = -1
    ) -> list[str]:
        """``command`` under bwrap as ``plan`` describes."""
        assert self.bwrap is not None
        out = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns"]
        out += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        out += ["--uid", str(SKILL_UID), "--gid", str(SKILL_UID), "--hostname", "skill"]
        out += self._system
        out += ["--proc", "/proc", "--dev", "/dev"]
        if plan.tmp_mb > 0:
            out += ["--size", str(plan.tmp_mb << 20)]
        out += ["--perms", "1777", "--tmpfs", "/tmp"]
        out += self._runtimes
        binds = set(self._system) | set(self._runtimes)
        extra = [_install_root(command[0])] if command else []
        for path in [*extra, *plan.ro]:
            if path and os.path.exists(path) and path not in binds:
                binds.add(path)
                out += ["--ro-bind", path, path]
        for path in plan.rw:
            if path:
                out += ["--bind", path, path]
        if plan.network and self.network == "slirp4netns" and _loopback_dns():
            out += ["--ro-bind", _slirp_resolv(), "/etc/resolv.conf"]
        if info_fd >= 0:
            out += ["--info-fd", str(info_fd), "--block-fd", str(block_fd)]
        out += ["--chdir", plan.cwd, "--", *command]
        return out

    def wants_network(self, plan: Plan) -> bool:
        return plan.network and self.network == "slirp4netns"

    # --- starting ---------------------------------------------------------------------------

    async def spawn(
        self,
        command: list[str],
        plan: Plan,
        start: Callable[..., Any],
        abort: Callable[[Any], None] = lambda started: None,
    ) -> tuple[Any, Callable[[], None]]:
        """Start ``command`` sandboxed through ``start(argv, pass_fds=…)`` (a coroutine that
        starts the process); returns what ``start`` returned and a function that stops the
        network helper. Without network the process starts directly.

        When the network cannot be attached, or the caller is cancelled meanwhile,
        ``abort(started)`` ends the process (it never runs unsupervised) and the helper,
        should it start after all, is stopped as soon as it is up."""
        if not self.wants_network(plan):
            return await start(self.argv(command, plan), pass_fds=()), _nothing
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        try:
            started = await start(
                self.argv(command, plan, info_fd=info_w, block_fd=block_r),
                pass_fds=(info_w, block_r),
            )
        except BaseException:
            for fd in (info_r, info_w, block_r, block_w):
                os.close(fd)
            raise
        os.close(info_w)
        os.close(block_r)
        # One thread owns both remaining ends until it returns: a descriptor is never
        # closed here while that thread may still read or write it (its number could be
        # reused by a concurrent run meanwhile).
        attach = asyncio.ensure_future(asyncio.to_thread(self._attach, info_r, block_w))
        try:
            stop = await asyncio.shield(attach)
        except BaseException:
            abort(started)
            if not attach.done():
                attach.add_done_callback(_stop_late)
            raise
        return started, stop

    def _attach(self, info_r: int, block_w: int) -> Callable[[], None]:
        """(In a thread.) Attach the network to the sandbox bwrap reports on ``info_r``,
        then let it go on (``block_w``); closes both."""
        try:
            try:
                pid = _child_pid(info_r)
            finally:
                os.close(info_r)
            stop = self._slirp(pid)
            try:
                os.write(block_w, b"1")
            except OSError as exc:  # bwrap is gone already: its run reports why
                stop()
                raise SandboxUnavailable("bubblewrap exited before its sandbox was ready") from exc
            return stop
        finally:
            os.close(block_w)

    def run_sync(
        self, command: list[str], plan: Plan, *, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` sandboxed to the end (blocking; for builds in a worker thread).
        Raises ``subprocess.TimeoutExpired`` after ``timeout`` (the sandbox killed)."""
        net = self.wants_network(plan)
        info_r, info_w = os.pipe() if net else (-1, -1)
        block_r, block_w = os.pipe() if net else (-1, -1)
        fds = (info_w, block_r) if net else ()
        argv = self.argv(command, plan, info_fd=info_w, block_fd=block_r)
        stop = _nothing
        with subprocess.Popen(
            argv,
            cwd=plan.cwd,
            env=env,
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
            preexec_fn=child_setup(self.limits.rlimits()),
        ) as proc:
            try:
                if net:
                    os.close(info_w)
                    os.close(block_r)
                    try:
                        stop = self._slirp(_child_pid(info_r))
                    finally:
                        os.close(info_r)
                    os.write(block_w, b"1")
                    os.close(block_w)
                    block_w = -1
                out, err = proc.communicate(timeout=timeout)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
            finally:
                if block_w >= 0:
                    os.close(block_w)
                stop()
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def _slirp(self, pid: int) -> Callable[[], None]:
        """Attach slirp4netns to the sandbox's network namespace; wait until it is up."""
        assert self.slirp is not None
        _await_loopback(pid)
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()  # closed by us (or our death): slirp4netns exits
        argv = [self.slirp, "--configure", "--mtu=65520", "--disable-host-loopback"]
        argv += ["--ready-fd", str(ready_w), "--exit-fd", str(exit_r)]
        if os.geteuid() == 0:
            # bwrap run by root makes the network namespace before its user namespace:
            # join only the former (a user namespace joined first has no say over it)
            argv += ["--netns-type=path", f"/proc/{pid}/ns/net", "tap0"]
        else:
            argv += [str(pid), "tap0"]
        try:
            helper = subprocess.Popen(
                argv,
                pass_fds=(ready_w, exit_r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=child_setup(),
            )
        finally:
            os.close(ready_w)
            os.close(exit_r)
        os.set_blocking(ready_r, True)
        ok = _read_ready(ready_r, helper)
        os.close(ready_r)

        stop = _Helper(helper, exit_w)

        if not ok:
            stop()
            raise SandboxUnavailable(
                "slirp4netns did not start the sandbox's network: install a working "
                "slirp4netns, or set SKILLJOBS_SANDBOX_NETWORK=none"
            )
        return stop


def _nothing() -> None:
    return None


class _Helper:
    """Stops a run's slirp4netns: :meth:`release` (at once, in any thread) closes the
    descriptor whose end makes it exit; calling the object releases it too, then reaps it
    (blocking: in a worker thread)."""

    def __init__(self, proc: subprocess.Popen[bytes], exit_w: int) -> None:
        self.proc = proc
        self._exit_w = exit_w
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            fd, self._exit_w = self._exit_w, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __call__(self) -> None:
        self.release()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def release(stop: Callable[[], None]) -> None:
    """Let a run's network helper exit now, without waiting for it (the thread pool may be
    busy starting other sandboxes)."""
    if isinstance(stop, _Helper):
        stop.release()


_LATE: set[asyncio.Future[None]] = set()  # helpers of abandoned runs being stopped


def _stop_late(attach: asyncio.Future[Callable[[], None]]) -> None:
    """The network of a run abandoned while it was being attached came up after all: stop
    its helper (in a thread: it waits for the helper to exit)."""
    if attach.cancelled() or attach.exception() is not None:
        return
    release(attach.result())
    stopping = asyncio.get_running_loop().run_in_executor(None, attach.result())
    _LATE.add(stopping)
    stopping.add_done_callback(_LATE.discard)


def _await_loopback(pid: int) -> None:
    """Wait until bwrap has brought up the sandbox's loopback: slirp4netns touches the
    loopback too, and bwrap refuses to start when the two do it at once."""
    import time

    deadline = time.monotonic() + SLIRP_READY_SEC
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/net/fib_trie", "rb") as fh:
                if b"127.0.0.1" in fh.read():
                    return
        except OSError:
            return  # gone already: the run reports why
        time.sleep(0.0005)


def _read_ready(fd: int, helper: subprocess.Popen[bytes]) -> bool:

    if not _readable(fd, SLIRP_READY_SEC):
        helper.kill()
        return False
    return os.read(fd, 1) == b"1"


def _readable(fd: int, wait: float) -> bool:
    """Whether ``fd`` has data (or EOF) within ``wait`` seconds (``poll``: a busy worker's
    descriptors may be numbered past what ``select`` takes)."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(wait * 1000))))


def _child_pid(fd: int, wait: float | None = None) -> int:
    """The sandbox's pid from bwrap's ``--info-fd`` JSON (waiting at most ``wait`` seconds,
    :data:`BWRAP_READY_SEC` by default)."""
    import time

    wait = BWRAP_READY_SEC if wait is None else wait
    deadline = time.monotonic() + wait
    data = b""
    while b"}" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not _readable(fd, left):
            raise SandboxUnavailable(
                f"bubblewrap did not report its sandbox within {wait:.0f}s "
                "(the host is overloaded?)"
            )
        chunk = os.read(fd, 4096)
        if not chunk:
            raise SandboxUnavailable("bubblewrap exited before its sandbox was ready")
        data += chunk
    return int(json.loads(data[: data.index(b"}") + 1])["child-pid"])


def _loopback_dns() -> bool:
    """The host resolves names through a loopback server (systemd-resolved, dnsmasq): the
    sandbox, which cannot reach the host's loopback, asks slirp4netns's resolver instead."""
    try:
        text = Path("/etc/resolv.conf").read_text()
    except OSError:
        return True
    servers = [ln.split()[1] for ln in text.splitlines() if ln.startswith("nameserver ")]
    return not servers or all(s.startswith("127.") or s == "::1" for s in servers)


_RESOLV: list[str] = []


def _slirp_resolv() -> str:
    if not _RESOLV:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="skilljobs-resolv-")
        os.write(fd, f"nameserver {SLIRP_DNS}\n".encode())
        os.close(fd)
        os.chmod(path, 0o644)
        _RESOLV.append(path)
    return _RESOLV[0]


# --- after the run ----------------------------------------------------------------------------


def workspace_usage(root: str) -> int:
    """Bytes of regular files under ``root`` (no symlink followed; at most
    :data:`WORKSPACE_WALK_LIMIT` entries counted)."""
    total = 0
    seen = 0
    stack = [root]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                if seen > WORKSPACE_WALK_LIMIT:
                    return total
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    return total


# --- trust ------------------------------------------------------------------------------------


def sandbox_mode(settings: Settings | None) -> str:
    """``bwrap`` or ``none``; anything else is refused when a skill runs."""
    return str(getattr(settings, "sandbox", "bwrap") or "bwrap").strip().lower()


def trust(skill_path: str | os.PathLike[str], settings: Settings | None) -> tuple[bool, str]:
    """Whether a skill folder runs without the sandbox, and why (the operator's word)."""
    if sandbox_mode(settings) == "none":
        return True, "SKILLJOBS_SANDBOX=none: every skill is trusted"
    folder = _resolved(str(skill_path))
    dirs = getattr(settings, "trusted_skill_dirs", None)
    if dirs is None:
        dirs = [BUNDLED_SKILLS]
    for i, d in enumerate(dirs):
        root = _resolved(str(d))
        if folder == root or folder.startswith(root.rstrip("/") + "/"):
            if i == 0:
                return True, "a bundled skill"
            return True, f"under the trusted path {d}"
    return False, "not under a trusted path: runs in the sandbox"


_RESOLVED: dict[str, str] = {}


def _resolved(path: str) -> str:
    found = _RESOLVED.get(path)
    if found is None:
        if len(_RESOLVED) > 4096:
            _RESOLVED.clear()
        found = _RESOLVED[path] = os.path.realpath(path)
    return found


IN_PROCESS_REASON = (
    "not under a trusted path: its execute(input, ctx) handler runs in the sandbox "
    "(call_skill and the model through the worker; no database)"
)


def run_mode(skill: Skill, settings: Settings | None) -> tuple[str, str]:
    """``(sandboxed | trusted, why)`` for a loaded skill: what ``skills check`` and
    ``doctor`` report. An in-process handler of an untrusted path is sandboxed too: it runs
    in :mod:`jobs.execution.sandbox_runner`, never inside the worker."""
    trusted, why = trust(skill.path, settings)
    if trusted:
        return "trusted", why
    if getattr(getattr(skill, "exec_type", None), "value", "") == "python":
        return "sandboxed", IN_PROCESS_REASON
    return "sandboxed", why
