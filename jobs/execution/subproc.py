"""Subprocess skills (Python CLI, shell, inline shell, Node, Ruby, Go): argv, environment,
process-group lifetime and stdout parsing (SPEC §2, §11; skill spec subprocess chapter).

Every skill process gets its own session (process group). Whatever happens — normal exit,
timeout, output flood, cancellation — the whole group is killed before we return, so a
skill that leaves ``sleep 300 &`` behind leaves no orphan.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.context import FIXED_SEGMENT, LIVE_KEYS, PLATFORM_KEYS, lookup_config
from jobs.crypto import is_secret_key
from jobs.execution.sandbox import Plan, Sandbox, child_setup, launcher
from jobs.execution.sandbox import release as sandbox_release
from jobs.execution.skill_output import (
    ERROR_TAIL,
    LOG_CAP,
    decode,
    log_tail,
    media_kind,
    parse_stdout,
)
from jobs.skill import ExecType, Skill

__all__ = [
    "ERROR_TAIL",
    "LOG_CAP",
    "OUTPUT_CAP",
    "ArgumentRefused",
    "SetupError",
    "build_args",
    "build_command",
    "build_env",
    "decode",
    "log_tail",
    "media_kind",
    "parse_names",
    "parse_stdout",
    "run_process",
]

OUTPUT_CAP = 16 * 1024 * 1024  # bytes read from stdout and from stderr, each
KILL_GRACE_SEC = 2.0  # SIGTERM → SIGKILL


_SAFE_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VOCAB = frozenset(FIXED_SEGMENT) | PLATFORM_KEYS


class SetupError(Exception):
    """The skill cannot be started (missing runtime, bad subcommand); message is user-facing."""


@dataclass
class ProcessResult:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflow: str | None = None  # "stdout" / "stderr" when a stream exceeded the cap
    quota: str | None = None  # why the run's workspace is over its quota


# --- command line -----------------------------------------------------------------------


def _runtime(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise SetupError(
        f"the {names[0]!r} runtime is not installed on this host (needed to run this skill)"
    )


def _placeholders(text: str, *, workspace: str, skill_dir: str) -> str:
    return text.replace("{baseDir}", skill_dir).replace("{workspace}", workspace)


def _quoted(value: str) -> str:
    return shlex.quote(value) if value else value


def interpreter(skill: Skill) -> list[str]:
    """The program prefix for the skill's exec type (raises SetupError if unavailable)."""
    et = skill.exec_type
    if et is ExecType.INLINE_SHELL:
        if not skill.command:
            raise SetupError("inline_shell skill declares no exec.primary.command")
        return [_runtime("bash", "sh"), "-c"]
    entry = skill.entry
    if entry is None or not Path(entry).is_file():
        raise SetupError(f"the skill's script {str(entry or '(none)')!r} does not exist")
    e = str(Path(entry).resolve())  # the process runs in the workspace, not here
    if et is ExecType.PYTHON_CLI or (et is ExecType.PYTHON):
        return [sys.executable, e]
    if et is ExecType.SHELL:
        return [_runtime("bash", "sh"), e]
    if et is ExecType.NODE:
        return [_runtime("node", "nodejs"), e]
    if et is ExecType.RUBY:
        return [_runtime("ruby"), e]
    if et is ExecType.GO:
        if e.endswith(".go"):
            return [_runtime("go"), "run", e]
        if os.access(e, os.X_OK):
            return [e]
        raise SetupError(f"go skill entry {e!r} is neither a .go file nor an executable")
    raise SetupError(f"exec type {et!s} is not run as a subprocess")


def skill_dir(skill: Skill) -> str:
    """The skill folder as an absolute path (the process runs in the workspace)."""
    return str(Path(skill.path).resolve())


_FLAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_OPTION_LIKE = re.compile(r"-+[A-Za-z_]")  # "--file=/x", "-f": read as an option, not a value

# Checks one rendered value: (input key, the argv item as the program will see it,
# "positional" for an x-cli-positional value | "flag" for a flag's value or list item);
# raises to refuse. The executor passes its file confinement.
ArgCheck = Callable[[str, str, str], None]


class ArgumentRefused(ValueError):
    """An input key or value cannot go on the command line as given (recoverable: the
    model can rename the key or pass the value another way); ``field`` names the key."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def _flag(key: str) -> str:
    if not _FLAG_NAME.match(key):
        raise ArgumentRefused(
            key,
            f"input key {key!r} cannot become a command-line flag: a flag name is letters, "
            "digits, '_' and '-' starting with a letter or '_' (no '=', no leading '-', "
            "no spaces)",
        )
    return "--" + key.replace("_", "-")


def _value(key: str, v: str) -> str:
    """A list item or positional value the program would read as an option is refused."""
    if _OPTION_LIKE.match(v):
        raise ArgumentRefused(
            key,
            f"the value {v[:40]!r} of input {key!r} would be read as a command-line option; "
            "values may not start with '-' followed by a letter",
        )
    return v


def _scalar(v: object) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _subcommand(skill: Skill, sub: object) -> list[str]:
    if not skill.cli_commands:
        return []
    if sub in (None, ""):
        raise SetupError(
            f"this skill needs a subcommand: input._subcommand must be one of {skill.cli_commands}"
        )
    if str(sub) not in skill.cli_commands:
        raise SetupError(f"unknown subcommand {sub!r}; expected one of {skill.cli_commands}")
    return [str(sub)]


def _properties(skill: Skill, sub: object) -> dict[str, Any]:
    schema = skill.input_schema or {}
    sub_schemas = getattr(skill, "cli_command_schemas", None) or {}
    if sub not in (None, "") and isinstance(sub_schemas.get(str(sub)), dict):
        schema = sub_schemas[str(sub)]
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def build_args(
    skill: Skill,
    input_data: Mapping[str, Any],
    *,
    workspace: str = "",
    skill_dir: str = "",
    check: ArgCheck | None = None,
) -> list[str]:
    """Input → argv: ``_subcommand`` first (cli_commands), ``x-cli-positional`` properties
    next, then ``True → --flag``, False/None omitted, lists expanded, dicts as JSON,
    ``key_name → --key-name``; ``{baseDir}`` / ``{workspace}`` placeholders filled.

    Checked as rendered (SPEC C21): flag names only from identifier keys, list items and
    positionals never option-shaped, and ``check`` sees every rendered value with its key
    (ArgumentRefused / the check's own exception refuse the run)."""
    data = dict(input_data)
    sub = data.pop("_subcommand", None)
    args = _subcommand(skill, sub)
    props = _properties(skill, sub)
    positional = [k for k, p in props.items() if isinstance(p, dict) and p.get("x-cli-positional")]
    values: list[tuple[str, int, str]] = []  # (key, index in args, kind) of each value

    def add(key: str, v: object, *, item: bool, kind: str = "flag") -> None:
        text = _scalar(v)
        values.append((key, len(args), kind))
        args.append(_value(key, text) if item else text)

    for key in positional:
        v = data.pop(key, None)
        if v is None:
            continue
        for x in v if isinstance(v, list) else [v]:
            add(key, x, item=True, kind="positional")
    for key, v in data.items():
        if not isinstance(key, str):
            raise ArgumentRefused(str(key), "input keys must be strings")
        if key.startswith("_") or v is None or v is False:
            continue
        if v is True:
            args.append(_flag(key))
        elif isinstance(v, list):
            if v:
                args.append(_flag(key))
                for x in v:
                    add(key, x, item=True)
        else:
            args.append(_flag(key))
            add(key, v, item=False)
    if workspace or skill_dir:
        args = [_placeholders(a, workspace=workspace, skill_dir=skill_dir) for a in args]
    if check is not None:
        for key, i, kind in values:
            check(key, args[i], kind)
    return args


def build_command(
    skill: Skill,
    input_data: Mapping[str, Any],
    *,
    workspace: str,
    skill_dir: str,
    check: ArgCheck | None = None,
) -> list[str]:
    prefix = interpreter(skill)
    args = build_args(skill, input_data, workspace=workspace, skill_dir=skill_dir, check=check)
    if skill.exec_type is ExecType.INLINE_SHELL:
        # the command is shell source: every value put into it is quoted
        command = _placeholders(
            skill.command or "", workspace=_quoted(workspace), skill_dir=_quoted(skill_dir)
        )
        return [*prefix, command, skill.name, *args]
    return [*prefix, *args]


# --- environment ------------------------------------------------------------------------


def _json_ok(v: object) -> bool:
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def subprocess_context(ctx: Mapping[str, Any], skill_name: str) -> dict[str, Any]:
    """SKILL_CONTEXT: the runtime context minus live objects, ``_``-prefixed and
    non-serializable keys, and secret-named values that are not the skill's own configs."""
    sc = ctx.get("skill_configs")
    own_cfg = sc.get(skill_name) if isinstance(sc, Mapping) else None
    own = set(own_cfg or {}) | set(ctx.get("skill_args") or {})
    out: dict[str, Any] = {}
    for key, v in ctx.items():
        if not isinstance(key, str) or key.startswith("_") or key in LIVE_KEYS:
            continue
        if key not in _VOCAB and is_secret_key(key) and key not in own:
            continue
        if key == "skill_configs" and isinstance(v, Mapping):
            v = {k: x for k, x in v.items() if k == skill_name or k in own}
        if _json_ok(v):
            out[key] = v
    return out


# What a skill process sees of the worker's environment: the locale, the clock, the
# program search path and the temp dir. Everything else (cloud credentials, database
# passwords, proxies, this service's own settings) stays in the worker unless the
# operator lists it in SKILLJOBS_SKILL_ENV_PASSTHROUGH.
BASE_ENV_NAMES = ("PATH", "LANG", "LANGUAGE", "TZ", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def base_environ(passthrough: Iterable[str] = ()) -> dict[str, str]:
    """The few host variables every skill gets (``PATH``, ``LANG``/``LC_*``, ``TZ``,
    ``TMPDIR``) plus the operator's ``passthrough`` names; never ``SKILLJOBS_*``."""
    src = os.environ
    out = {k: src[k] for k in BASE_ENV_NAMES if k in src}
    out.update({k: v for k, v in src.items() if k.startswith("LC_")})
    for name in passthrough:
        if name in src and not name.upper().startswith("SKILLJOBS_"):
            out[name] = src[name]
    out.setdefault("PATH", DEFAULT_PATH)
    return out


def passthrough_for(raw: str | None, skill: str) -> tuple[str, ...]:
    """The host variables the operator hands ``skill`` (SKILLJOBS_SKILL_ENV_PASSTHROUGH):
    ``NAME`` for every skill, ``skill:NAME`` for that skill only; never ``SKILLJOBS_*``."""
    out: list[str] = []
    for entry in (raw or "").split(","):
        owner, _, name = entry.strip().rpartition(":")
        if owner and owner.strip() != skill:
            continue
        name = name.strip()
        if name and _SAFE_ENV_KEY.match(name) and not name.upper().startswith("SKILLJOBS_"):
            out.append(name)
    return tuple(out)


def parse_names(raw: str | None) -> tuple[str, ...]:
    """``"A, B"`` → ``("A", "B")``: the variable names of a comma list (invalid names dropped)."""
    names = (n.strip() for n in (raw or "").split(","))
    return tuple(n for n in names if n and _SAFE_ENV_KEY.match(n))


def config_env(skill: Skill, ctx: Mapping[str, Any]) -> dict[str, str]:
    """Credentials for subprocess skills travel as environment variables: the skill's
    ``requires.env`` names and its own env-var-shaped config keys."""

    out: dict[str, str] = {}
    sc = ctx.get("skill_configs")
    own = sc.get(skill.name) if isinstance(sc, Mapping) else None
    for key, v in (own or ctx.get("skill_args") or {}).items():
        if key.startswith("SKILLJOBS_"):
            continue  # the worker's own settings are never a skill's credential
        if _SAFE_ENV_KEY.match(key) and key.upper() == key and v is not None:
            out[key] = v if isinstance(v, str) else _scalar(v)
    for name in skill.requires_env:
        if _SAFE_ENV_KEY.match(name) and name not in out:
            v = lookup_config(ctx, skill.name, name)
            if v is not None:
                out[name] = v if isinstance(v, str) else _scalar(v)
    return out


def build_env(
    skill: Skill,
    ctx: Mapping[str, Any],
    input_data: Mapping[str, Any],
    *,
    workspace: str,
    llm_env: Mapping[str, str] | None = None,
    passthrough: Iterable[str] = (),
    home: str | None = None,
) -> dict[str, str]:
    """The whole environment of a skill process: nothing is inherited implicitly."""
    env = base_environ(passthrough)
    env["HOME"] = home or workspace or tempfile.gettempdir()
    env.update(llm_env or {})
    env.update(config_env(skill, ctx))
    env["SKILL_INPUT"] = json.dumps(input_data, ensure_ascii=False, default=str)
    env["SKILL_CONTEXT"] = json.dumps(subprocess_context(ctx, skill.name), ensure_ascii=False)
    env["SKILL_WORKSPACE"] = workspace
    env["SKILL_DIR"] = skill_dir(skill)
    env.setdefault("PYTHONIOENCODING", "utf-8")
    return env


# --- running ----------------------------------------------------------------------------


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


#: who the skill processes started in this context run for (a job id; set by the runner)
RUN_OWNER: contextvars.ContextVar[str] = contextvars.ContextVar("skill_run_owner", default="")
_LIVE: dict[int, str] = {}  # process group of a running skill → its owner
_STOPPING: set[asyncio.Future[None]] = set()  # network helpers being stopped


def kill_owned(owners: Iterable[str]) -> int:
    """SIGKILL, now, the process groups of the skills running for ``owners`` (a worker that
    lost its leases: a peer may run them again; a sandboxed run's whole pid namespace goes
    with its group). Returns how many groups were killed."""
    wanted = set(owners)
    killed = 0
    for pid, owner in list(_LIVE.items()):
        if owner in wanted:
            kill_group(pid)
            killed += 1
    return killed


async def _read(stream: asyncio.StreamReader, buf: bytearray, cap: int, name: str) -> None:
    """Append ``stream`` to ``buf`` until EOF; what was read survives a cancellation."""
    while True:
        chunk = await stream.read(1 << 16)
        if not chunk:
            return
        buf += chunk
        if len(buf) > cap:
            del buf[cap:]
            raise _Overflow(name)


class _Overflow(Exception):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.stream = stream


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Stream protocol that also reports when the leader exits (``Process.wait()`` only
    returns once every pipe is closed, which a left-behind child can delay forever)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=1 << 16, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _terminate(proc: asyncio.subprocess.Process, exited: asyncio.Future[None]) -> None:
    """SIGTERM the group, SIGKILL it after a grace period, wait for the leader to be reaped."""
    kill_group(proc.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(KILL_GRACE_SEC):
            await asyncio.shield(exited)
    except TimeoutError:
        pass
    kill_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await asyncio.shield(exited)


async def run_process(
    argv: list[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str] | None,
    timeout: float,  # noqa: ASYNC109 - the group must be killed, not just the await
    cap: int = OUTPUT_CAP,
    sandbox: Sandbox | None = None,
    plan: Plan | None = None,
    limits: Sequence[tuple[int, int]] = (),
    pass_fds: Sequence[int] = (),
) -> ProcessResult:
    """Run ``argv`` in its own process group; read stdout/stderr concurrently (each capped).
    ``pass_fds``: descriptors the process inherits (a sandboxed runner's channel).

    With ``sandbox`` (and its ``plan``) the process runs inside bubblewrap. Either way it
    dies with the worker (parent-death signal) and runs under ``limits`` (rlimits).
    Cancellation kills the whole group and re-raises ``CancelledError``.
    """
    loop = asyncio.get_running_loop()
    # bwrap's --die-with-parent holds a sandboxed run to the worker; a bare one gets the
    # parent-death signal. Both through an exec'd prefix when the tools exist (vfork).
    prefix = launcher(limits, pdeathsig=sandbox is None)
    needed = bool(limits) or sandbox is None
    setup = child_setup(limits) if needed and not prefix else None  # (the tools are missing)

    async def start(command: list[str], pass_fds: Sequence[int] = ()) -> Any:
        return await loop.subprocess_exec(
            lambda: _Protocol(loop),
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            preexec_fn=setup,
        )

    inherited = tuple(pass_fds)
    owner = RUN_OWNER.get()
    pids: list[int] = []

    async def run(command: list[str], pass_fds: Sequence[int] = ()) -> Any:
        # Never cancelled half-way: asyncio, cancelled while it connects a new process's
        # pipes, closes the transport and waits for an end that may never be reported (the
        # run hung for good); here the start completes, then the process is ended.
        starting = asyncio.ensure_future(start([*prefix, *command], (*pass_fds, *inherited)))
        try:
            started = await asyncio.shield(starting)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                abort(await starting)
            raise
        pid = started[0].get_pid()
        _LIVE[pid] = owner  # at once: a lost lease kills it while its network is attached
        pids.append(pid)
        return started

    def abort(started: tuple[asyncio.SubprocessTransport, _Protocol]) -> None:
        transport = started[0]
        kill_group(transport.get_pid())
        transport.close()

    stop_net = None
    try:
        if sandbox is not None and plan is not None:
            (transport, protocol), stop_net = await sandbox.spawn(argv, plan, run, abort)
        else:
            transport, protocol = await run(argv)
        return await _supervise(transport, protocol, loop, timeout, cap)
    finally:
        for pid in pids:
            _LIVE.pop(pid, None)
        if stop_net is not None:  # (the run is over: the helper exits without holding it)
            sandbox_release(stop_net)  # now: reaping it may wait for a busy thread pool
            _STOPPING.add(loop.run_in_executor(None, stop_net))
            for f in [f for f in _STOPPING if f.done()]:
                _STOPPING.discard(f)


async def _supervise(
    transport: asyncio.SubprocessTransport,
    protocol: _Protocol,
    loop: asyncio.AbstractEventLoop,
    timeout: float,  # noqa: ASYNC109 - the group is killed at the deadline
    cap: int,
) -> ProcessResult:
    proc = asyncio.subprocess.Process(transport, protocol, loop)
    assert proc.stdout is not None and proc.stderr is not None
    exited = protocol.exited
    out_buf, err_buf = bytearray(), bytearray()
    out_t = asyncio.ensure_future(_read(proc.stdout, out_buf, cap, "stdout"))
    err_t = asyncio.ensure_future(_read(proc.stderr, err_buf, cap, "stderr"))
    timed_out = False
    overflow: _Overflow | None = None
    deadline = loop.time() + timeout
    try:
        pending: set[asyncio.Future[Any]] = {out_t, err_t, exited}
        drain_until: float | None = None
        while pending:
            now = loop.time()
            if drain_until is not None and now >= drain_until:
                break  # a grandchild in another session still holds a pipe: stop reading
            remaining = deadline - now
            if remaining <= 0:
                timed_out = not exited.done()
                break
            if drain_until is not None:
                remaining = min(remaining, drain_until - now)
            done, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            for t in done:
                exc = t.exception()
                if isinstance(exc, _Overflow):
                    overflow = exc
                elif exc is not None:
                    raise exc
            if overflow is not None:
                break
            if exited in done and drain_until is None:
                # The leader is gone: kill what it left behind so the pipes reach EOF.
                kill_group(proc.pid)
                drain_until = loop.time() + KILL_GRACE_SEC
    except BaseException:
        out_t.cancel()
        err_t.cancel()
        await asyncio.shield(_terminate(proc, exited))
        transport.close()
        raise
    if timed_out or overflow is not None:
        await _terminate(proc, exited)
        # the group is dead: let the readers take what is still in the pipes
        await asyncio.wait((out_t, err_t), timeout=KILL_GRACE_SEC)
    else:
        kill_group(proc.pid)
    for t in (out_t, err_t):
        if not t.done():
            t.cancel()
    await asyncio.gather(out_t, err_t, return_exceptions=True)
    transport.close()
    return ProcessResult(
        returncode=transport.get_returncode(),
        stdout=bytes(out_buf),
        stderr=bytes(err_buf),
        timed_out=timed_out,
        overflow=overflow.stream if overflow else None,
    )
