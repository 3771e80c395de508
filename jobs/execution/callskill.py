"""``ctx["call_skill"]``: one skill calling another through the executor (SPEC §2, §9.1).

Input precedence: explicit dict / kwargs > ``template`` > ``passthrough`` > the callee's
own configuration. The callee sees exactly the pass-through whitelist of the caller's
context plus its own configs (looked up again for ``role_id`` + callee) and its own
provider, db session and call_skill. At most ``MAX_DEPTH`` levels; no self-calls. An
``async: true`` callee runs inline, within the caller's remaining wall clock, with a
warning in the log (C9). Never raises: failures come back as
``{"ok": False, "error", "skill", "output"}``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Protocol

from jobs.catalog.configs import ConfigStore
from jobs.context import CALL_PASS_KEYS, fixed_segment, flatten_configs
from jobs.crypto import is_secret_key
from jobs.envelope import is_failure
from jobs.models import JobStatus
from jobs.skill import Skill, SkillRegistry

log = logging.getLogger(__name__)


class NestedOutcome(Protocol):
    """What a called skill's run tells its caller: the envelope and the status."""

    @property
    def result(self) -> dict[str, Any]: ...

    @property
    def status(self) -> str: ...


class Executor(Protocol):
    """What ``call_skill`` needs of the executor that binds it (``jobs.execution.executor``
    imports this module, so it is named here by its shape, not imported back)."""

    @property
    def registry(self) -> SkillRegistry: ...

    @property
    def config_store(self) -> ConfigStore | None: ...

    async def execute_nested(
        self, skill: Skill | str, input_data: dict[str, Any], ctx: dict[str, Any], *, depth: int
    ) -> NestedOutcome: ...


MAX_DEPTH = 3
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_.\-]*)\}")

CallSkill = Callable[..., Awaitable[dict[str, Any]]]

# When the skill running in this task must be done (monotonic clock): a callee gets at
# most what is left of its caller's wall clock.
WALL_DEADLINE: ContextVar[float | None] = ContextVar("skilljobs_wall_deadline", default=None)


def within_caller(wall: float) -> float:
    """``wall`` capped to the caller's remaining wall clock (unchanged at the top level)."""
    deadline = WALL_DEADLINE.get()
    if deadline is None:
        return wall
    return max(0.0, min(wall, deadline - time.monotonic()))


def _refused(name: object, error: str, output: object = None) -> dict[str, Any]:
    return {"ok": False, "error": error, "skill": str(name), "output": output}


class _Missing(KeyError):
    pass


def _lookup(source: object, path: str) -> Any:
    cur = source
    for part in path.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise _Missing(path)
    return cur


def fill_template(template: Mapping[str, Any], source: object) -> dict[str, Any]:
    """``{"title": "Sales for {day}"}`` filled from ``source`` (dotted paths allowed). A value
    that is exactly ``"{field}"`` keeps the field's type. Raises ``KeyError`` naming a field
    that is not in ``source``."""
    out: dict[str, Any] = {}
    for key, tpl in template.items():
        if not isinstance(tpl, str):
            out[key] = tpl
            continue
        whole = _FIELD.fullmatch(tpl.strip())
        if whole:
            out[key] = _lookup(source, whole.group(1))
            continue

        def sub(m: re.Match[str]) -> str:
            v = _lookup(source, m.group(1))
            return "" if v is None else str(v)

        out[key] = _FIELD.sub(sub, tpl)
    return out


def bind_call_skill(
    executor: Executor, ctx: Mapping[str, Any], caller: str, depth: int
) -> CallSkill:
    """``call_skill`` for a skill running at ``depth`` (0 = called by the platform).

    The caller's identity (the pass-through keys) is captured now: a skill that rewrites
    its context dict afterwards (``ctx["role_id"] = …``) changes nothing for its callees."""
    bound: dict[str, Any] = {}
    for k in CALL_PASS_KEYS:
        if k in ctx:
            v = ctx[k]
            bound[k] = v if type(v) in _PLAIN else _frozen(v)  # (most values: scalars)

    async def call_skill(
        name: str,
        input: dict[str, Any] | None = None,
        *,
        source: object = None,
        template: Mapping[str, Any] | None = None,
        passthrough: bool = False,
        **kw: Any,
    ) -> dict[str, Any]:
        try:
            return await _call(
                executor, bound, caller, depth, name, input, source, template, passthrough, kw
            )
        except Exception as exc:  # the contract: call_skill never raises
            log.warning("call_skill %s → %s failed: %s", caller, name, type(exc).__name__)
            return _refused(name, f"call_skill({name!r}) failed: {type(exc).__name__}: {exc}")

    call_skill.__dict__["depth"] = depth  # what a skill may read: its nesting level
    return call_skill


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _frozen(value: object) -> Any:
    """A copy of a plain value (lists, tags) so that later edits do not reach it; live
    objects (db_factory, abort_signal) are kept as they are."""
    if isinstance(value, list):
        return [_frozen(v) for v in value]
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def _bad_arguments(
    input: object, source: object, template: object, passthrough: bool
) -> str | None:
    if input is not None and not isinstance(input, Mapping):
        return f"call_skill input must be a dict, got {type(input).__name__}"
    if template is not None and not isinstance(template, Mapping):
        return "call_skill template must be a dict of field → text"
    if passthrough and source is not None and not isinstance(source, Mapping):
        return "passthrough needs source to be a dict"
    return None


async def _call(
    executor: Executor,
    ctx: Mapping[str, Any],
    caller: str,
    depth: int,
    name: object,
    input: object,
    source: object,
    template: object,
    passthrough: bool,
    kw: dict[str, Any],
) -> dict[str, Any]:
    if not isinstance(name, str) or not name.strip():
        return _refused(name, "call_skill needs a skill name (a non-empty string)")
    if name == caller:
        return _refused(name, f"skill {name!r} may not call itself through call_skill")
    if depth + 1 > MAX_DEPTH:
        return _refused(
            name,
            f"call_skill nesting is limited to {MAX_DEPTH} levels: "
            f"{caller!r} is already at level {depth}",
        )
    callee = executor.registry.get(name)
    if callee is None:
        return _refused(name, f"unknown skill {name!r}: no skill folder with that name is loaded")
    if callee.is_async:
        left = WALL_DEADLINE.get()
        log.warning(
            "call_skill %s → %s: %s is a background (async: true) skill; it runs inline "
            "within %s's remaining wall clock (%s); dispatch it for a job of its own",
            caller,
            name,
            name,
            caller,
            f"{max(0.0, left - time.monotonic()):.0f} s" if left is not None else "unbounded",
        )
    bad = _bad_arguments(input, source, template, passthrough)
    if bad:
        return _refused(name, bad)

    role_id = str(ctx.get("role_id") or "")
    configs: dict[str, Any] = {}
    if role_id and executor.config_store is not None:
        configs = await executor.config_store.get(role_id, name)

    data: dict[str, Any] = {}
    props = ((callee.input_schema or {}).get("properties") or {}) if callee.input_schema else {}
    for key, value in configs.items():  # lowest precedence: the callee's configuration
        if key in props and not is_secret_key(key):
            data[key] = value
    if passthrough and isinstance(source, Mapping):
        data.update({k: v for k, v in source.items() if not str(k).startswith("_")})
    if isinstance(template, Mapping) and template:  # (else None: _bad_arguments)
        try:
            data.update(fill_template(template, source if source is not None else {}))
        except KeyError as exc:
            field = exc.args[0] if exc.args else "?"
            return _refused(
                name, f"call_skill template refers to {{{field}}}, which is not in source"
            )
    if isinstance(input, Mapping):  # (else None: _bad_arguments)
        data.update(input)
    data.update(kw)

    child: dict[str, Any] = flatten_configs(name, configs)
    child.update({k: ctx[k] for k in CALL_PASS_KEYS if k in ctx})
    child.update(fixed_segment(child))  # the whole fixed segment, typed empties (C11)
    outcome = await executor.execute_nested(callee, data, child, depth=depth + 1)
    env = outcome.result
    if is_failure(env) or outcome.status != JobStatus.SUCCEEDED:
        reason = env.get("error") or env.get("msg") or f"skill {name!r} reported a failure"
        return {"ok": False, "error": str(reason), "skill": name, "output": env}
    return env
