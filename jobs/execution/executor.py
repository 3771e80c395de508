"""The shared executor: the one code path that runs a skill for the chat line, the workers
and the chains (SPEC §2).

``Executor.execute`` never raises for anything a skill does — unknown skill, load error,
crash, hang, garbage, output flood all become a failure ``Outcome``. The one exception is
cancellation of the awaiting task: the skill is stopped (task cancelled, or the whole
process group killed) and ``CancelledError`` propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from delivery.net.fetch import SafeFetcher
from jobs.catalog.configs import ConfigStore
from jobs.context import (
    PROTOCOL_TOKENS,
    input_secrets,
    lookup_config,
    mask_credentials,
    resolve_file_params,
    scrub,
    secret_values,
    workspace_dir,
)
from jobs.crypto import SecretBox, redact
from jobs.db import DB_UNAVAILABLE, LazySession, Sessions, create_engine, create_sessionmaker
from jobs.envelope import failure, is_failure, normalize
from jobs.execution import compat, envs, inprocess, input_rules, inputs, sandbox, subproc
from jobs.execution.callskill import WALL_DEADLINE, bind_call_skill, within_caller
from jobs.execution.http_skill import run_http
from jobs.execution.provider import (
    Provider,
    llm_env,
    llm_values,
    provider_from,
    role_llm_values,
)
from jobs.execution.sandbox_runner import RunStart
from jobs.execution.skill_output import exit_failure
from jobs.logs import register_secrets
from jobs.models import JobStatus
from jobs.settings import BUNDLED_SKILLS, Settings
from jobs.skill import SUBPROCESS_TIMEOUT_SEC, ExecType, Skill, SkillRegistry, SkillType
from jobs.storable import TEXT_REPLACED, valid_text

log = logging.getLogger(__name__)

#: a role's model: its provider (None: no model configured) and its subprocess variables
LLM = tuple[Provider | None, dict[str, str]]

TRANSIENT_EXC = (*DB_UNAVAILABLE, httpx.TimeoutException, httpx.NetworkError)
TRACE_CAP = 8000  # characters of a raising skill's traceback (and its prints) kept
SUBPROCESS_TYPES = frozenset(
    {
        ExecType.PYTHON_CLI,
        ExecType.SHELL,
        ExecType.INLINE_SHELL,
        ExecType.NODE,
        ExecType.RUBY,
        ExecType.GO,
    }
)
NO_BINS_CHECK = frozenset({"shell", "runtime"})
WORKSPACE_MEMO = 4096
ROLE_LLM_NAME = "@llm"  # where a role's own model binding is configured
ROLE_LLM_TTL_SEC = 30.0
ROLE_LLM_LOOKUP_SEC = 5.0
RUNNER_DRAIN_SEC = 2.0  # a sandboxed runner's last message, read after the process ended


class Printed(NamedTuple):
    """What a run wrote (each capped): a subprocess's stdout and stderr tails; an
    in-process skill's prints (both streams) are its ``stdout``."""

    stdout: str = ""
    stderr: str = ""


@dataclass
class Outcome:
    result: dict[str, Any]  # normalized envelope; failures have ok False + error
    status: JobStatus  # SUCCEEDED, FAILED or TIMED_OUT
    error: str | None
    error_type: str | None
    exception: str | None  # exception class name when the skill raised
    transient: bool  # raised a connection/timeout/OS/database error: worth re-running
    stdout: str  # Printed.stdout, scrubbed of the run's secret values
    stderr: str  # Printed.stderr, scrubbed likewise
    duration_ms: float

    @property
    def log(self) -> str:
        """The run's log: a subprocess's stderr, else what the run printed."""
        return self.stderr or self.stdout


def _secs(n: float) -> str:
    return f"{n:g}"


class Executor:
    """Runs skills. One per process; cheap to call concurrently."""

    def __init__(
        self,
        *,
        settings: Settings | None,
        registry: SkillRegistry,
        sessionmaker: Sessions | None,
        box: SecretBox | None,
        http: httpx.AsyncClient | None = None,
        config_store: ConfigStore | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.sessionmaker = sessionmaker
        self.box = box
        self._http = http
        self._own_http: httpx.AsyncClient | None = None
        self._outbound: SafeFetcher | None = None
        self._skill_engine: AsyncEngine | None = None
        self._sandbox: sandbox.Sandbox | None = None
        self._skill_sessions: Sessions | None = None
        if config_store is None and sessionmaker is not None and box is not None:
            config_store = ConfigStore(sessionmaker, box)
        self.config_store = config_store
        self.llm_default = llm_values(settings) if settings is not None else {}
        self.provider = provider_from(self.llm_default, http)
        self.llm_env = llm_env(self.llm_default)
        # role_id → (valid until, provider, subprocess env): a role's own model binding
        self.role_llm_ttl = ROLE_LLM_TTL_SEC
        self._role_llm: dict[str, tuple[float, Provider | None, dict[str, str]]] = {}
        self._role_llm_pending: dict[str, asyncio.Future[LLM]] = {}
        self._role_providers: list[Provider] = []
        self.workspace_root = settings.resolved_workspace_root if settings is not None else None
        self.env_passthrough = str(getattr(settings, "skill_env_passthrough", "") or "")
        self.envs = envs.EnvManager.from_settings(settings)  # PEP 723 / requirements / npm
        # Handler files and workspaces are re-checked at most this often (seconds): an
        # edited handler is picked up, a deleted workspace re-created, without a stat per run.
        self.entries = inprocess.EntryCache(recheck_sec=1.0)
        self.recheck_sec = 1.0
        self._checked: dict[str, float] = {}
        self._made_dirs: set[str] = set()
        self._workspaces: dict[tuple[Any, Any], str | None] = {}
        self._bins: set[str] = set()

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is not None:
            return self._http
        if self._own_http is None:
            self._own_http = httpx.AsyncClient(timeout=60.0)
        return self._own_http

    def outbound(self) -> SafeFetcher:
        """The client HTTP skills send through: the outbound policy (public https, or the
        hosts of ``SKILLJOBS_FETCH_ALLOW_HOSTS``), each connection to the address checked."""
        if self._outbound is None:
            allow = self.settings.allow_hosts if self.settings is not None else []
            self._outbound = SafeFetcher(allow, timeout=60.0)
        return self._outbound

    async def aclose(self) -> None:
        """Close what the executor opened itself (never the injected client)."""
        if self._own_http is not None:
            await self._own_http.aclose()
            self._own_http = None
        if self._outbound is not None:
            await self._outbound.aclose()
            self._outbound = None
        if self._skill_engine is not None:
            await self._skill_engine.dispose()
            self._skill_engine = self._skill_sessions = None
        for p in (self.provider, *self._role_providers):
            if p is not None:
                await p.aclose()

    # --- public API ---------------------------------------------------------------------

    async def run(
        self,
        skill: Skill | str,
        input_data: dict[str, Any],
        ctx: dict[str, Any],
        *,
        policy_wall_sec: float | None = None,
    ) -> dict[str, Any]:
        return (await self.execute(skill, input_data, ctx, policy_wall_sec=policy_wall_sec)).result

    async def execute(
        self,
        skill: Skill | str,
        input_data: dict[str, Any],
        ctx: dict[str, Any],
        *,
        policy_wall_sec: float | None = None,
    ) -> Outcome:
        return await self._execute(skill, input_data, ctx, policy_wall_sec, depth=0)

    async def execute_nested(
        self, skill: Skill | str, input_data: dict[str, Any], ctx: dict[str, Any], *, depth: int
    ) -> Outcome:
        """Run a skill called by another skill (``call_skill``) at nesting ``depth``."""
        return await self._execute(skill, input_data, ctx, None, depth=depth)

    async def llm_for(self, role_id: str) -> LLM:
        """(provider, subprocess LLM env) for the role: its own binding (configuration under
        ``@llm``: provider, base, key, model) over the ``SKILLJOBS_LLM_*`` default. Looked
        up at most every ``role_llm_ttl`` seconds; a failed lookup means the default."""
        if not role_id or self.config_store is None:
            return self.provider, self.llm_env
        now = time.monotonic()
        hit = self._role_llm.get(role_id)
        if hit is not None and hit[0] > now:
            return hit[1], hit[2]
        # One lookup per role at a time: the jobs that start together (a worker's first
        # slots, a refresh) wait for it instead of each taking a connection for it.
        lookup = self._role_llm_pending.get(role_id)
        if lookup is None:
            lookup = asyncio.ensure_future(self._look_up_llm(role_id, now))
            self._role_llm_pending[role_id] = lookup
            lookup.add_done_callback(lambda _t: self._role_llm_pending.pop(role_id, None))
        return await asyncio.shield(lookup)

    async def _look_up_llm(self, role_id: str, now: float) -> LLM:
        assert self.config_store is not None

        try:
            async with asyncio.timeout(ROLE_LLM_LOOKUP_SEC):
                role_config = await self.config_store.get(role_id, ROLE_LLM_NAME)
        except Exception as exc:  # no database, no table: the default model still works
            log.debug("role %s: model binding not readable: %s", role_id, type(exc).__name__)
            role_config = {}
        values = role_llm_values(self.llm_default, role_config)
        if values is self.llm_default:
            provider, env = self.provider, self.llm_env
        else:
            provider, env = provider_from(values, self._http), llm_env(values)
            if provider is not None:
                self._role_providers.append(provider)
        if len(self._role_llm) >= WORKSPACE_MEMO:
            self._role_llm.clear()
        self._role_llm[role_id] = (now + self.role_llm_ttl, provider, env)
        return provider, env

    # --- the run ------------------------------------------------------------------------

    async def _execute(
        self,
        skill: Skill | str,
        input_data: object,
        ctx: Mapping[str, Any] | None,
        policy_wall_sec: float | None,
        *,
        depth: int,
    ) -> Outcome:
        t0 = time.perf_counter()
        name = skill if isinstance(skill, str) else getattr(skill, "name", None) or repr(skill)
        secrets = secret_values(ctx, name) if isinstance(ctx, Mapping) else []
        # a credential given in the input (api_key, password, Authorization) and echoed
        # back by the skill is masked in the result as it is in the stored input
        secrets += input_secrets(input_data)
        # Every line (chat, background, chains): the run's secret configs join the log
        # filter before the skill can log anything.
        register_secrets(secrets)
        try:
            out = await self._attempt(skill, name, input_data, ctx, policy_wall_sec, depth, t0)
        except Exception as exc:  # the one catch-all: whatever happens becomes an envelope
            log.exception("executor failure while running %s", name)
            env = failure(
                f"skill {name!r} could not be run: {type(exc).__name__}: {exc}", skill=name
            )
            out = self._outcome(env, t0, name=name, exception=type(exc).__name__)
        for env in (self.llm_env, self._role_llm.get(_role_of(ctx), (0, None, {}))[2]):
            if env.get("MYINC_LLM_KEY"):
                secrets.append(env["MYINC_LLM_KEY"])
        if secrets:
            _scrub_outcome(out, secrets)
        out.result = mask_credentials(out.result, keep=PROTOCOL_TOKENS)
        # valid text at the boundary: a lone surrogate (a string cut inside an emoji,
        # undecodable bytes) becomes U+FFFD, and the result says where (C24)
        out.result, replaced = valid_text(out.result)
        if replaced:
            out.result = {**out.result, TEXT_REPLACED: replaced}
        if out.error:
            out.error = str(valid_text(out.error)[0])
            log.info("skill %s: invalid text replaced by U+FFFD in %s", name, replaced)
        if out.status != JobStatus.SUCCEEDED:
            log_outcome(name, out)
        return out

    async def _attempt(
        self,
        skill: Skill | str,
        name: str,
        input_data: object,
        ctx: Mapping[str, Any] | None,
        policy_wall_sec: float | None,
        depth: int,
        t0: float,
    ) -> Outcome:
        found = self.registry.get(skill) if isinstance(skill, str) else skill
        if found is None and isinstance(skill, str) and (fan := self.registry.fanned(skill)):
            found = fan[0]  # <skill>__<sub> (cli_commands fan-out)
            if isinstance(input_data, dict) or input_data is None:
                input_data = {**(input_data or {}), "_subcommand": fan[1]}
        problem = self._refuse(found, name, input_data, ctx)
        if problem is not None:
            return self._outcome(problem, t0, name=name)
        assert isinstance(found, Skill) and isinstance(ctx, Mapping)
        provider, llm = await self.llm_for(_role_of(ctx))
        rc = self._runtime_context(ctx, found, depth, provider)
        wall = within_caller(found.effective_wall_sec(policy_wall_sec))
        deadline = WALL_DEADLINE.set(time.monotonic() + wall)  # what a callee may use (C9)
        printed = Printed()
        try:
            data = (input_data if isinstance(input_data, dict) else None) or {}
            try:  # attachment ids, force_raw_prompt (seed §3.3, §3.4)
                data = input_rules.apply(found, data, rc, depth=depth)
            except input_rules.Refused as refused:
                return self._outcome(refused.envelope, t0, name=name)
            if found.exec_type is not ExecType.HTTP:
                data = resolve_file_params(data, rc.get("workspace_dir"))
                try:
                    inputs.confine(
                        data,
                        workspace=rc.get("workspace_dir"),
                        attachments=_attachments(rc),
                        schema=found.input_schema,
                    )
                except inputs.Refused as refused:
                    return self._outcome(inputs.refusal(refused, name), t0, name=name)
            raw, printed = await self._dispatch(found, data, rc, wall, llm)
        except inprocess.WallExpired as expired:
            env = failure(
                f"skill ran over {_secs(expired.seconds)} s and was stopped",
                skill=name,
                timed_out=True,
            )
            printed = Printed(expired.stdout, expired.log)
            return self._outcome(env, t0, name=name, status=JobStatus.TIMED_OUT, printed=printed)
        except inprocess.Raised as wrapped:
            raised = wrapped.__cause__ or wrapped
            kind = _exc_name(raised)
            if isinstance(raised, ImportError) or (
                isinstance(raised, RaisedInSandbox) and "builtins.ImportError" in raised.types
            ):  # undeclared dependency: no re-run fixes it
                missing = envs.import_failure(found, f"{kind}: {raised}")
                if missing is not None:
                    return self._outcome(missing, t0, name=name, exception=kind)
            transient = _is_transient(raised)
            # the operator gets the traceback and what the skill printed (the attempt, the
            # job's result); the person gets the exception's message (C26)
            trace = _trace_of(raised)[-TRACE_CAP:]
            stdout = wrapped.stdout if isinstance(wrapped, inprocess.Raised) else ""
            message = str(raised).strip() or kind
            log.warning("skill %s raised %s:\n%s", name, kind, trace)
            env = failure(
                f"skill {name!r} raised {kind}: {raised}".rstrip(": "),
                error_type="transient" if transient else None,
                skill=name,
                user_message=message[:600],
                stdout_tail=stdout[-TRACE_CAP:].strip(),
                stderr_tail=trace.strip(),
            )
            return self._outcome(
                env,
                t0,
                name=name,
                exception=kind,
                transient=transient,
                printed=Printed(stdout, trace),
            )
        finally:
            WALL_DEADLINE.reset(deadline)
            db = rc.get("db")
            if isinstance(db, LazySession) and db.opened and db is not ctx.get("db"):
                await asyncio.shield(db.close())
        return self._outcome(normalize(raw, name), t0, name=name, printed=printed)

    def _refuse(
        self, skill: Skill | None, name: str, input_data: object, ctx: Mapping[str, Any] | None
    ) -> dict[str, Any] | None:
        """A failure envelope when the skill must not run at all, else None."""
        if skill is None:
            return failure(
                f"unknown skill {name!r}: no skill folder with that name is loaded",
                error_type="config",
                non_retriable=True,
                skill=name,
            )
        if not isinstance(skill, Skill):
            return failure(f"not a skill: {type(skill).__name__}", skill=name)
        if skill.error:
            return failure(
                f"skill {name!r} failed to load: {skill.error}",
                error_type="config",
                non_retriable=True,
                skill=name,
            )
        if skill.skill_type is not SkillType.HANDLER or skill.exec_type is ExecType.NONE:
            return failure(
                f"skill {name!r} is a {skill.skill_type.value} document, not code: "
                "there is nothing to execute" + (f"; {skill.hint}" if skill.hint else ""),
                error_type="config",
                non_retriable=True,
                skill=name,
            )
        if input_data is not None and not isinstance(input_data, dict):
            return failure(
                f"input for {name!r} must be a JSON object, got {type(input_data).__name__}",
                error_type="recoverable",
                skill=name,
            )
        if not isinstance(ctx, Mapping):
            return failure("the runtime context must be a mapping", skill=name)
        missing = [n for n in skill.requires_env if lookup_config(ctx, name, n) is None]
        if missing:
            return failure(
                f"skill {name!r} is not configured: {', '.join(missing)} missing (set with "
                f"`skilljobs config set ROLE {name} {missing[0]} VALUE`)",
                error_type="config",
                needs_config=missing,
                skill=name,
            )
        if skill.exec_mode not in NO_BINS_CHECK:
            bins = [b for b in skill.requires_bins if not self._has_bin(b)]
            if bins:
                return failure(
                    f"skill {name!r} needs program(s) not installed on this host: "
                    f"{', '.join(bins)}",
                    error_type="config",
                    needs_bins=bins,
                    non_retriable=True,
                    skill=name,
                )
        return None

    def _has_bin(self, name: str) -> bool:
        if name in self._bins:
            return True
        if shutil.which(name):
            self._bins.add(name)  # only hits are cached: an install is picked up at once
            return True
        return False

    def _outcome(
        self,
        env: dict[str, Any],
        t0: float,
        *,
        name: str,
        status: JobStatus | None = None,
        exception: str | None = None,
        transient: bool = False,
        printed: Printed = Printed(),
    ) -> Outcome:
        failed = is_failure(env)
        if status is None:
            status = JobStatus.FAILED if failed else JobStatus.SUCCEEDED
        outcome = Outcome(
            result=env,
            status=status,
            error=str(env.get("error")) if failed else None,
            error_type=env.get("error_type") if failed else None,
            exception=exception,
            transient=transient,
            stdout=printed.stdout,
            stderr=printed.stderr,
            duration_ms=(time.perf_counter() - t0) * 1000.0,
        )
        return outcome

    def _runtime_context(
        self, ctx: Mapping[str, Any], skill: Skill, depth: int, provider: Provider | None = None
    ) -> dict[str, Any]:
        """The context the skill sees: the caller's keys + workspace_dir, db, db_factory,
        provider (setdefault) and call_skill bound to this call depth."""
        rc = dict(ctx)
        ws = rc.get("workspace_dir")
        if not ws and self.workspace_root is not None:
            ws = self._workspace(rc.get("role_id"), rc.get("session_id"))
            if ws:
                rc["workspace_dir"] = ws
        elif ws and ws not in self._made_dirs:
            Path(ws).mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(ws)
        self._databases(rc, skill)
        if not hasattr(rc.get("provider"), "complete"):
            rc["provider"] = provider
        rc["call_skill"] = bind_call_skill(self, rc, skill.name, depth)
        return rc

    def _databases(self, rc: dict[str, Any], skill: Skill) -> None:
        """``db_factory`` / ``db``: sessions on the business database, never on the job
        store. A caller's own objects are kept; anything else under these names (e.g. a
        string in a JSON context) is replaced, so a skill never calls into garbage. The
        bundled delivery skills (platform code) also get the job store, as
        ``_platform_sessions`` (never serialized, never passed on by call_skill)."""
        rc.pop("_platform_sessions", None)
        if self.sessionmaker is None:
            return
        business = self.skill_sessionmaker()
        if business is None:  # (never: the job store's sessions at least)
            return
        if not callable(rc.get("db_factory")):
            rc["db_factory"] = business
        db = rc.get("db")
        if not isinstance(db, LazySession) and not hasattr(db, "execute"):
            rc["db"] = LazySession(business)
        if _is_bundled(skill):
            rc["_platform_sessions"] = self.sessionmaker

    def skill_sessionmaker(self) -> Sessions | None:
        """Sessions on ``SKILLJOBS_SKILL_DATABASE_URL`` (default: ``<data dir>/skills.db``),
        the database skills get; created on first use."""
        if self._skill_sessions is None:
            if self.settings is None:
                return self.sessionmaker
            url = self.settings.resolved_skill_database_url
            if url == self.settings.resolved_database_url:
                log.warning(
                    "SKILLJOBS_SKILL_DATABASE_URL is the job store's own database: skills "
                    "can read every job, configuration and secret in it"
                )
            self._skill_engine = create_engine(url)
            self._skill_sessions = create_sessionmaker(self._skill_engine)
        return self._skill_sessions

    def _workspace(self, role_id: object, session_id: object) -> str | None:
        """``<root>/<role_id>/<session_id or shared>``, created once, memoized per id pair."""
        key = (str(role_id or ""), str(session_id or ""))
        if key not in self._workspaces:
            assert self.workspace_root is not None  # only asked when there is a root
            path = workspace_dir(self.workspace_root, *key)
            ws = str(path) if path is not None else None
            if ws:
                Path(ws).mkdir(parents=True, exist_ok=True)
                self._checked[ws] = time.monotonic()
            if len(self._workspaces) >= WORKSPACE_MEMO:
                self._workspaces.clear()
            self._workspaces[key] = ws
            return ws
        ws = self._workspaces[key]
        if ws:
            now = time.monotonic()
            if now - self._checked.get(ws, 0.0) >= self.recheck_sec:
                self._checked[ws] = now
                # removed meanwhile (a cleanup job): create it again
                Path(ws).mkdir(parents=True, exist_ok=True)
        return ws

    async def _dispatch(
        self,
        skill: Skill,
        input_data: dict[str, Any],
        rc: dict[str, Any],
        wall: float,
        llm: dict[str, str],
    ) -> tuple[Any, Printed]:
        et = skill.exec_type
        try:
            if et is ExecType.PYTHON:
                try:
                    if sandbox.trust(skill.path, self.settings)[0]:
                        return await self._in_process(skill, input_data, rc, wall)
                    return await self._in_sandbox(skill, input_data, rc, wall, llm)
                except inprocess.Raised as wrapped:
                    if not isinstance(wrapped.__cause__, SystemExit):
                        raise
                # An entry that raises SystemExit is a command-line script (SPEC §2).
                return await self._subprocess(skill, input_data, rc, wall, llm, cli=True)
            if et in SUBPROCESS_TYPES:
                return await self._subprocess(skill, input_data, rc, wall, llm)
            if et is ExecType.HTTP:
                coro = run_http(
                    skill, input_data, rc, self.http, wall=wall, fetcher=self.outbound()
                )
                return await inprocess.with_wall(coro, wall), Printed()
        except subproc.ArgumentRefused as exc:
            return failure(
                f"input field {exc.field!r} was refused: {exc.reason}",
                error_type="recoverable",
                need_param=[exc.field],
                field=exc.field,
                skill=skill.name,
            ), Printed()
        except inputs.Refused as exc:
            return inputs.refusal(exc, skill.name), Printed()
        except subproc.SetupError as exc:
            return failure(
                f"skill {skill.name!r} cannot start: {exc}",
                error_type="config",
                non_retriable=True,
                skill=skill.name,
            ), Printed()
        except envs.BuildFailed as exc:
            return exc.envelope(skill.name), Printed()
        except inprocess.ImportFailed as exc:
            return envs.import_failure(skill, str(exc)) or failure(
                f"skill {skill.name!r} cannot be imported: {exc}",
                error_type="config",
                non_retriable=True,
                skill=skill.name,
            ), Printed()
        return failure(f"exec type {et.value} is not supported", skill=skill.name), Printed()

    # --- in-process Python ----------------------------------------------------------------

    async def _in_process(
        self, skill: Skill, input_data: dict[str, Any], rc: dict[str, Any], wall: float
    ) -> tuple[Any, Printed]:
        compat.install()  # backend.infra.providers.base for ported skills (seed §10.1)
        with envs.exposed(await self.envs.prepare(skill)):  # its own packages, no other's
            entry = await inprocess.get_entry(self.entries, skill, wall)
            raw, text = await inprocess.run_entry(entry, input_data, rc, wall, skill.name)
        return raw, Printed(stdout=text)

    # --- in-process Python from an untrusted path: the same handler, in the sandbox -----------

    async def _in_sandbox(
        self,
        skill: Skill,
        input_data: dict[str, Any],
        rc: dict[str, Any],
        wall: float,
        llm: dict[str, str],
    ) -> tuple[Any, Printed]:
        """Run the handler with :mod:`jobs.execution.sandbox_runner` inside bubblewrap; the
        worker answers its ``call_skill`` and ``provider`` requests. Raises like the worker's
        own path: ``Raised`` (an exception: a stand-in carrying its class names and
        traceback; ``SystemExit`` when the file is a CLI script), ``ImportFailed``,
        ``WallExpired``."""
        box = self.sandbox()
        problem = box.problem()
        if problem is not None:
            raise subproc.SetupError(f"it is not trusted and its sandbox cannot start: {problem}")
        ws = str(rc.get("workspace_dir") or "")
        prepared = await self.envs.prepare(skill)
        parent, child = socket.socketpair()
        served: asyncio.Future[dict[str, Any] | None] | None = None
        try:
            with _run_dir(ws) as cwd:
                ro = [subproc.skill_dir(skill), str(Path(str(skill.entry)).parent)]
                ro += _package_dirs()
                # the run's own attachments (a file parameter may name one): read-only
                ro += _attachment_files(rc)
                sites: list[str] = []
                if prepared is not None:
                    ro.append(str(prepared.path))
                    sites = prepared.site_packages()
                plan = sandbox.Plan(cwd=cwd, ro=ro, rw=[cwd], tmp_mb=box.limits.tmp_mb)
                env = subproc.build_env(
                    skill,
                    rc,
                    {},
                    workspace=ws,
                    llm_env=llm,
                    passthrough=subproc.passthrough_for(self.env_passthrough, skill.name),
                )
                for key in ("SKILL_INPUT", "SKILL_CONTEXT"):
                    env.pop(key, None)  # (they travel over the channel: no size limit)
                env.update(TMPDIR="/tmp", PYTHONDONTWRITEBYTECODE="1")
                start: RunStart = {
                    "path": str(skill.entry),
                    "name": skill.name,
                    "entry_function": skill.entry_function,
                    "input": input_data,
                    "ctx": subproc.subprocess_context(rc, skill.name),
                    "sites": sites,
                    "provider": _about_provider(rc.get("provider")),
                    "call_skill": callable(rc.get("call_skill")),
                    "depth": getattr(rc.get("call_skill"), "depth", 0),
                }
                served = asyncio.ensure_future(_serve_runner(parent, start, rc))
                argv = [sys.executable, "-I", "-m", "jobs.execution.sandbox_runner"]
                argv.append(str(child.fileno()))
                quota = box.limits.workspace_mb << 20
                before = sandbox.workspace_usage(ws) if ws and quota else 0
                try:
                    res = await subproc.run_process(
                        argv,
                        env=env,
                        cwd=cwd,
                        timeout=wall,
                        sandbox=box,
                        plan=plan,
                        limits=box.limits.rlimits(),
                        pass_fds=(child.fileno(),),
                    )
                except sandbox.SandboxUnavailable as exc:
                    raise subproc.SetupError(str(exc)) from exc
                finally:
                    child.close()  # (the runner holds its end: EOF once it is gone)
                if ws and quota and (used := sandbox.workspace_usage(ws)) > max(quota, before):
                    res.quota = (
                        f"the workspace holds {used / (1 << 20):.1f} MB after the run, over "
                        f"its quota of {quota >> 20} MB (SKILLJOBS_SANDBOX_WORKSPACE_MB): "
                        "remove files the skill no longer needs"
                    )
            printed = subproc.log_tail(res.stderr)
            if res.timed_out:
                raise inprocess.WallExpired(wall, stdout=printed)
            try:
                async with asyncio.timeout(RUNNER_DRAIN_SEC):
                    done = await asyncio.shield(served)
            except TimeoutError:
                done = None
        finally:
            if served is not None and not served.done():
                served.cancel()
                with contextlib.suppress(BaseException):
                    await served
            child.close()
            parent.close()
            if prepared is not None:
                prepared.release()
        return _runner_outcome(skill, done, res, printed)

    # --- subprocesses -----------------------------------------------------------------------

    async def _subprocess(
        self,
        skill: Skill,
        input_data: dict[str, Any],
        rc: dict[str, Any],
        wall: float,
        llm: dict[str, str],
        *,
        cli: bool = False,
    ) -> tuple[Any, Printed]:
        if cli:
            from dataclasses import replace

            skill = replace(skill, exec_type=ExecType.PYTHON_CLI)
        ws = str(rc.get("workspace_dir") or "")
        skill_dir = subproc.skill_dir(skill)
        conf = inputs.Confinement(ws or None, _attachments(rc))
        schema = skill.input_schema

        def check(key: str, value: str, kind: str) -> None:
            # C21: what the program reads as a path is confined, whatever the key's spelling
            # (file_path, filePath, file-path, an abbreviation argparse expands: "--fil");
            # a path-shaped positional is a path
            mode = inputs.mode_of(key, schema, flag=True)
            if mode == "any" and kind == "positional":
                mode = "media"
            if mode == "strong" and not inputs.looks_like_url(value):
                conf.check(key, value)
            elif mode == "media" and inputs.looks_like_path(value):
                conf.check(key, value)

        argv = subproc.build_command(
            skill, input_data, workspace=ws, skill_dir=skill_dir, check=check
        )
        env = subproc.build_env(
            skill,
            rc,
            input_data,
            workspace=ws,
            llm_env=llm,
            passthrough=subproc.passthrough_for(self.env_passthrough, skill.name),
        )
        prepared = await self.envs.prepare(skill)  # built on first use, held while it runs
        if prepared is not None:
            argv = prepared.apply(argv, env)
        timeout = min(self.subprocess_timeout(skill, wall), wall)
        try:
            res = await self._launch(skill, argv, env, ws, prepared, timeout)
        except OSError as exc:
            if exc.errno == errno.E2BIG:
                sizes = {k: len(env[k]) for k in ("SKILL_INPUT", "SKILL_CONTEXT")}
                raise subproc.SetupError(
                    f"the input is too large to hand to a subprocess (SKILL_INPUT "
                    f"{sizes['SKILL_INPUT']:,} bytes, SKILL_CONTEXT {sizes['SKILL_CONTEXT']:,} "
                    "bytes, argv included; one value may be at most 128 KiB): pass a file "
                    "in the workspace instead"
                ) from exc
            raise subproc.SetupError(f"cannot start {argv[0]}: {exc}") from exc
        finally:
            if prepared is not None:
                prepared.release()
        printed = Printed(subproc.log_tail(res.stdout), subproc.log_tail(res.stderr))
        if res.timed_out:
            raise inprocess.WallExpired(timeout, printed.stderr, stdout=printed.stdout)
        if res.overflow:
            mb = subproc.OUTPUT_CAP // (1 << 20)
            return failure(
                f"skill printed more than {mb} MB on {res.overflow} and was stopped; "
                "write large results to a file in the workspace",
                skill=skill.name,
                non_retriable=True,
            ), printed
        if res.quota:
            return failure(res.quota, skill=skill.name, non_retriable=True), printed
        code = res.returncode if res.returncode is not None else -9
        if code != 0:
            missing = envs.import_failure(skill, subproc.decode(res.stderr[-subproc.ERROR_TAIL :]))
            return missing or exit_failure(skill.name, code, res.stdout, res.stderr), printed
        return subproc.parse_stdout(subproc.decode(res.stdout), ws or None), printed

    async def _launch(
        self,
        skill: Skill,
        argv: list[str],
        env: dict[str, str],
        ws: str,
        prepared: envs.Prepared | None,
        timeout: float,  # noqa: ASYNC109 - handed to run_process, which kills the group
    ) -> subproc.ProcessResult:
        """Start the skill process: inside the sandbox unless its folder is trusted (then as
        the worker). Either way it dies with the worker. An untrusted skill whose sandbox
        cannot start is refused, never run as the worker."""
        trusted, _why = sandbox.trust(skill.path, self.settings)
        with _run_dir(ws) as cwd:
            if trusted:
                return await subproc.run_process(argv, env=env, cwd=cwd, timeout=timeout)
            box = self.sandbox()
            problem = box.problem()
            if problem is not None:
                raise subproc.SetupError(
                    f"it is not trusted and its sandbox cannot start: {problem}"
                )
            ro = [subproc.skill_dir(skill)]
            if prepared is not None:
                ro.append(str(prepared.path))
                if prepared.esm_hook is not None:
                    ro.append(str(prepared.esm_hook))
            plan = sandbox.Plan(cwd=cwd, ro=ro, rw=[cwd], tmp_mb=box.limits.tmp_mb)
            env = {**env, "TMPDIR": "/tmp"}
            quota = box.limits.workspace_mb << 20
            before = sandbox.workspace_usage(ws) if ws and quota else 0
            try:
                res = await subproc.run_process(
                    argv,
                    env=env,
                    cwd=cwd,
                    timeout=timeout,
                    sandbox=box,
                    plan=plan,
                    limits=box.limits.rlimits(),
                )
            except sandbox.SandboxUnavailable as exc:
                raise subproc.SetupError(str(exc)) from exc
            # over the quota by what this run wrote (one that was over already keeps running)
            if ws and quota and (used := sandbox.workspace_usage(ws)) > max(quota, before):
                res.quota = (
                    f"the workspace holds {used / (1 << 20):.1f} MB after the run, over its "
                    f"quota of {quota >> 20} MB (SKILLJOBS_SANDBOX_WORKSPACE_MB): remove files "
                    "the skill no longer needs"
                )
            return res

    def sandbox(self) -> sandbox.Sandbox:
        """The sandbox of untrusted skills (built once; refuses an unknown mode)."""
        mode = sandbox.sandbox_mode(self.settings)
        if mode not in ("bwrap", "none"):
            raise subproc.SetupError(
                f"SKILLJOBS_SANDBOX={mode!r} is not known (use bwrap, or none to trust every skill)"
            )
        if self._sandbox is None:
            try:
                self._sandbox = sandbox.Sandbox.from_settings(self.settings)
            except sandbox.SandboxUnavailable as exc:
                raise subproc.SetupError(str(exc)) from exc
        return self._sandbox

    @staticmethod
    def subprocess_timeout(skill: Skill, wall: float) -> float:
        """60 s unless the skill declares its own timeout; background (``async: true``)
        skills get their whole wall clock."""
        if skill.wall_sec:
            return float(skill.wall_sec)
        return wall if skill.is_async else SUBPROCESS_TIMEOUT_SEC


@contextlib.contextmanager
def _run_dir(workspace: str) -> Iterator[str]:
    """The workspace; without one a fresh temporary directory, removed afterwards (never
    the skill's own folder: outputs must not land next to its SKILL.md)."""
    if workspace:
        yield workspace
        return
    with tempfile.TemporaryDirectory(prefix="skilljobs-run-") as scratch:
        yield scratch


class RaisedInSandbox(Exception):
    """An exception a handler raised inside the sandbox: its class names (``module.qualname``
    along its MRO), message and traceback, as the runner reported them."""

    def __init__(self, type_name: str, message: str, types: list[str], tb: str) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.types = types
        self.traceback = tb

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_TRANSIENT_NAMES = frozenset(f"{c.__module__}.{c.__qualname__}" for c in TRANSIENT_EXC)


def _trace_of(exc: BaseException) -> str:
    """The traceback of what a skill raised (a sandboxed one's, as its runner reported it)."""
    if isinstance(exc, RaisedInSandbox):
        return exc.traceback
    return "".join(traceback.format_exception(exc))


def _exc_name(exc: BaseException) -> str:
    return exc.type_name if isinstance(exc, RaisedInSandbox) else type(exc).__name__


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, RaisedInSandbox):
        return not _TRANSIENT_NAMES.isdisjoint(exc.types)
    return isinstance(exc, TRANSIENT_EXC)


async def _serve_runner(
    sock: socket.socket, start: RunStart, rc: dict[str, Any]
) -> dict[str, Any] | None:
    """The worker's end of a sandboxed runner's channel: send the run, answer its
    ``call_skill`` / ``provider`` requests (bound to the caller, as in the worker), and
    return the runner's last message (None: it ended without one). What comes back was
    written inside the sandbox: read as plain dicts, each field checked where it is used."""
    # (this task's own context: the runs it performs for the skill end nothing of its caller)
    inprocess.SKILL_ENDED.set(None)
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 26)
    lock = asyncio.Lock()
    calls: set[asyncio.Task[None]] = set()

    async def reply(message: dict[str, Any]) -> None:
        data = json.dumps(message, ensure_ascii=False, default=str).encode() + b"\n"
        async with lock:
            writer.write(data)
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    async def answer(request: dict[str, Any]) -> None:
        ident = request.get("id")
        try:
            value = await _perform(request, rc)
        except Exception as exc:
            kind = type(exc).__name__
            await reply({"id": ident, "error": str(exc), "kind": kind})
            return
        await reply({"id": ident, "value": value})

    try:
        await reply({"start": start})
        while line := await reader.readline():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "done" in message:
                done = message["done"]
                return done if isinstance(done, dict) else None
            task = asyncio.ensure_future(answer(message))
            calls.add(task)
            task.add_done_callback(calls.discard)
        return None
    finally:
        for task in list(calls):
            task.cancel()
        writer.close()


async def _perform(request: dict[str, Any], rc: dict[str, Any]) -> Any:
    """One request of a sandboxed runner, performed by the worker."""
    op = request.get("op")
    given = request.get("kwargs")
    kwargs: dict[str, Any] = given if isinstance(given, dict) else {}
    if op == "call_skill":
        call = rc.get("call_skill")
        if not callable(call):
            raise RuntimeError("call_skill is only available to async entries")
        name, data = request.get("name"), request.get("input")
        return await call(name, data, **kwargs)
    if op == "provider":
        provider: Any = rc.get("provider")
        method = request.get("method")
        if not hasattr(provider, "complete"):
            raise RuntimeError("no model is configured for this role")
        if method == "complete":
            result = await provider.complete(request.get("messages"), **kwargs)
        elif method == "tool_call":
            tools = kwargs.pop("tools", [])
            result = await provider.tool_call(request.get("messages"), tools, **kwargs)
        else:
            raise RuntimeError(f"provider.{method} is not available in the sandbox")
        import dataclasses

        return dataclasses.asdict(result)
    raise RuntimeError(f"unknown request {op!r}")


def _about_provider(provider: object) -> dict[str, Any] | None:
    """What a sandboxed skill may know of the role's model (never its key)."""
    if not hasattr(provider, "complete"):
        return None
    return {
        "provider_name": str(getattr(provider, "provider_name", "") or ""),
        "model": getattr(provider, "model", None),
        "kind": str(getattr(provider, "kind", "") or ""),
    }


def _runner_outcome(
    skill: Skill, done: dict[str, Any] | None, res: subproc.ProcessResult, printed: str
) -> tuple[Any, Printed]:
    """What a sandboxed runner's last message means, as the worker's own path would say it."""
    name = skill.name
    if res.overflow:
        mb = subproc.OUTPUT_CAP // (1 << 20)
        return failure(
            f"skill printed more than {mb} MB on {res.overflow} and was stopped; "
            "write large results to a file in the workspace",
            skill=name,
            non_retriable=True,
        ), Printed(printed)
    if res.quota:
        return failure(res.quota, skill=name, non_retriable=True), Printed(printed)
    kind = done.get("kind") if done else None
    if kind == "result":
        return done.get("value") if done else None, Printed(printed)
    assert done is None or isinstance(done, dict)
    if kind == "raised" and done is not None:
        tb = str(done.get("traceback") or "")
        exc = RaisedInSandbox(
            str(done.get("type") or "Exception"),
            str(done.get("message") or ""),
            [str(t) for t in done.get("types") or []],
            tb,
        )
        wrapped = inprocess.Raised()
        wrapped.stdout = printed
        raise wrapped from exc
    if kind == "exit" and done is not None:
        code = done.get("code")
        exc_exit = SystemExit(code)
        if done.get("at_import") or inprocess._has_main_block(str(skill.entry)):
            raise inprocess.Raised() from exc_exit  # a command-line script: run it as one
        return inprocess.exited(name, exc_exit, printed), Printed(printed)
    if kind == "import_failed" and done is not None:
        raise inprocess.ImportFailed(str(done.get("message") or ""))
    if kind == "no_database" and done is not None:
        return failure(
            f"skill {name!r}: {done.get('message')}",
            error_type="config",
            non_retriable=True,
            skill=name,
        ), Printed(printed)
    code = res.returncode if res.returncode is not None else -9
    return exit_failure(name, code, b"", res.stderr), Printed(printed)


@functools.cache
def _package_dirs() -> list[str]:
    """Our own package (and its bundled skills, a package of their own when installed):
    importable read-only by a sandboxed runner."""
    return [str(Path(__file__).resolve().parents[1]), str(BUNDLED_SKILLS.resolve())]


def _attachment_files(rc: Mapping[str, Any]) -> list[str]:
    """The run's attachments that are files (real paths): what a sandboxed run may read
    beside its workspace, as a file parameter may name them."""
    allowed = inputs.Confinement(None, _attachments(rc)).allowed
    return sorted(p for p in allowed if os.path.isfile(p))


def _role_of(ctx: Mapping[str, Any] | None) -> str:
    role = ctx.get("role_id") if isinstance(ctx, Mapping) else None
    return role if isinstance(role, str) else str(role or "")


def _is_bundled(skill: Skill) -> bool:
    return _bundled_path(str(skill.path))


@functools.lru_cache(maxsize=1024)
def _bundled_path(path: str) -> bool:
    """Is this skill folder one of the bundled skills? (resolved once per folder: two
    ``realpath`` walks per run were a measurable share of a no-op job's cost)"""

    try:
        return Path(path).resolve().is_relative_to(BUNDLED_SKILLS.resolve())
    except (OSError, ValueError):
        return False


def _attachments(ctx: Mapping[str, Any]) -> list[Any]:
    found = ctx.get("attachments")
    return list(found) if isinstance(found, list | tuple) else []


def _scrub_outcome(out: Outcome, secrets: list[str]) -> None:
    """Known secret values never leave a run: not in what it printed, the error or the
    result."""
    out.stdout = scrub(out.stdout, secrets)
    out.stderr = scrub(out.stderr, secrets)
    if out.error:
        out.error = scrub(out.error, secrets)
    text = json.dumps(out.result, ensure_ascii=False)
    # compare in JSON form: a secret with quotes or backslashes is escaped in ``text``
    if any(json.dumps(s, ensure_ascii=False)[1:-1] in text for s in secrets):
        out.result = scrub(out.result, secrets)


def log_outcome(name: str, outcome: Outcome) -> None:
    if outcome.exception is not None:
        log.warning("%s (transient: %s)", outcome.error, outcome.transient)
    else:
        log.info("skill %s %s: %s", name, outcome.status, redact(outcome.result).get("error"))
