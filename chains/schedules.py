"""Schedules: validation of the schedule file (SPEC §10) and the schedule/run store."""

from __future__ import annotations

import math
import re
import time
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy import update as sa_update
from sqlalchemy.exc import IntegrityError

from chains import emptiness
from chains.cron import CronError, next_fire, parse
from chains.graph import (
    DEFAULT_MAX_ITEMS,
    DEFAULT_PARALLEL,
    MAX_ITEMS_CAP,
    MAX_PARALLEL,
    Graph,
    GraphError,
)
from chains.graph import build as build_graph
from chains.refs import StepRefs, static_errors
from chains.timing import MAX_JITTER_S, expr_of, jitter_offset, next_time
from jobs import audit
from jobs.db import HasSessions, Sessions, sessions_of
from jobs.models import Schedule
from jobs.queue.delayed import WhenError, parse_duration, parse_instant
from jobs.skill import SkillRegistry, SkillType

if TYPE_CHECKING:
    pass

STEP_ID_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
RECIPIENT_KEYS = ("to", "target", "session_id")


class ScheduleError(ValueError):
    """A schedule that cannot be accepted; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid schedule: " + "; ".join(problems))


class StepSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    skill: str
    input: dict[str, Any] = Field(default_factory=dict)
    template: dict[str, Any] = Field(default_factory=dict)
    passthrough: bool = False
    #: what counts as an empty result of this step (``chains.emptiness``), besides the guard
    empty_when: str | list[str] | None = None
    #: the steps it waits for (``chains.graph``); none given anywhere: a line
    needs: list[str] | None = None
    #: ``"$steps.<id>.<path>"``: run once per item of that list (``$item``); output: the list
    for_each: str | None = None
    #: items a for_each step runs at most (more: the step fails, nothing runs)
    max_items: int = Field(default=DEFAULT_MAX_ITEMS, ge=1, le=MAX_ITEMS_CAP)


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    chat_mode: bool = False
    wall_sec: float | None = Field(default=None, gt=0)
    #: steps (and for_each items) of a graph running at once
    max_parallel: int = Field(default=DEFAULT_PARALLEL, ge=1, le=MAX_PARALLEL)
    pause_after_failures: int | None = Field(default=None, ge=1)

    @field_validator("chat_mode")
    @classmethod
    def _no_chat(cls, v: bool) -> bool:
        if v:
            raise ValueError(
                "must be false: a chain runs with nobody to answer a confirmation request"
            )
        return v


class Misfire(BaseModel):
    """What a fire time the scheduler sees late becomes (``chains.policies``)."""

    model_config = ConfigDict(extra="forbid")

    grace_sec: float | None = Field(default=None, gt=0)
    catch_up: Literal["one", "none", "all"] = "one"


class Alert(BaseModel):
    """Notify ``target`` (an alias) after ``after`` failed runs in a row, once per cooldown."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(min_length=1)
    after: int = Field(default=1, ge=1)
    cooldown_sec: float = Field(default=3600, ge=0)


class ScheduleSpec(BaseModel):
    """The schedule file (YAML or JSON)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    cron: str | None = None
    #: a one-shot schedule instead of ``cron``: ISO 8601 (in ``timezone`` without an offset)
    #: or epoch seconds (``chains.timing``)
    at: str | float | None = None
    #: fire times moved by a fixed offset within this (``30s``, ``5m``), per schedule
    jitter: str | float | None = None
    #: a run that stops empty ends ``stopped_empty`` without a delivery
    quiet_when_empty: bool = False
    #: what counts as an empty result of every step (``chains.emptiness``)
    empty_when: str | list[str] | None = None
    timezone: str = "UTC"
    identity: dict[str, Any] = Field(default_factory=dict)
    deliver: dict[str, Any] | None = None
    policy: Policy = Field(default_factory=Policy)
    misfire: Misfire = Field(default_factory=Misfire)
    overlap: Literal["skip", "queue_one", "allow"] = "skip"
    alert: Alert | None = None
    steps: list[StepSpec] = Field(min_length=1)
    enabled: bool = True

    @property
    def tz(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def step_refs(self) -> list[StepRefs]:
        return [
            StepRefs(
                s.id or str(i),
                s.input,
                s.template,
                s.passthrough,
                tuple(s.needs) if s.needs is not None else None,
                s.for_each,
            )
            for i, s in enumerate(self.steps)
        ]

    def graph(self) -> Graph:
        """Which steps wait for which (raises :class:`chains.graph.GraphError`)."""
        refs = self.step_refs()
        return build_graph(
            [r.id for r in refs], [s.needs for s in self.steps], [s.for_each for s in self.steps]
        )

    def file_fields(self) -> dict[str, Any]:
        out = self.model_dump(mode="json", exclude={"enabled"})
        # a step stores the graph and emptiness fields only when it uses them
        for step in out["steps"]:
            for key in ("needs", "for_each", "empty_when"):
                if step.get(key) is None:
                    step.pop(key, None)
            if step.get("max_items") == DEFAULT_MAX_ITEMS and step.get("for_each") is None:
                step.pop("max_items", None)
        return out

    def options(self) -> dict[str, Any]:
        """The ``options`` column: the timing and emptiness fields, with what the scheduler
        needs of them computed (the one-shot time, the jitter offset)."""
        opts: dict[str, Any] = {}
        if self.at is not None:
            opts["at"] = self.at
            opts["at_epoch"] = parse_instant(self.at, self.timezone)
        if self.jitter is not None:
            opts["jitter"] = self.jitter
            opts["jitter_offset_s"] = jitter_offset(self.name, parse_duration(self.jitter))
        if self.quiet_when_empty:
            opts["quiet_when_empty"] = True
        if self.empty_when is not None:
            opts["empty_when"] = self.empty_when
        return opts

    @property
    def timing(self) -> str:
        """The ``chains.cron`` expression it fires by."""
        return expr_of(self.cron or "", self.options())

    def first_fire(self, now: float) -> float | None:
        return next_time(self.cron or "", self.options(), self.timezone, now)


def _pydantic_problems(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "schedule"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        out.append(f"{where}: {msg}")
    return out


def _default_ids(steps: list[dict[str, Any]]) -> None:
    """Steps without an ``id`` get their skill name (when unique) or their index."""
    taken = {s.get("id") for s in steps if isinstance(s, dict) and s.get("id")}
    skills = [s.get("skill") for s in steps if isinstance(s, dict)]
    for i, s in enumerate(steps):
        if isinstance(s, dict) and not s.get("id"):
            name = s.get("skill")
            ok = isinstance(name, str) and skills.count(name) == 1 and name not in taken
            s["id"] = name if ok else str(i)
            taken.add(s["id"])


def validate(data: object, registry: SkillRegistry | None) -> ScheduleSpec:
    """Check a schedule file; raises :class:`ScheduleError` naming every problem."""
    if not isinstance(data, dict):
        raise ScheduleError(["a schedule must be a mapping (YAML/JSON object)"])
    data = dict(data)
    if isinstance(data.get("steps"), list):
        data["steps"] = [dict(s) if isinstance(s, dict) else s for s in data["steps"]]
        _default_ids(data["steps"])
    try:
        spec = ScheduleSpec.model_validate(data)
    except ValidationError as exc:
        raise ScheduleError(_pydantic_problems(exc)) from None

    problems = [*_header_problems(spec), *_step_problems(spec, registry)]
    problems.extend(_reference_problems(spec))
    if problems:
        raise ScheduleError(problems)
    return spec


def _header_problems(spec: ScheduleSpec) -> list[str]:
    """Cron, time zone, identity and recipient of a schedule."""
    problems: list[str] = []
    if (spec.cron is None) == (spec.at is None):
        problems.append("cron: give cron (five fields) or at (one time), one of them")
    elif spec.cron is not None:
        try:
            parse(spec.cron)
        except CronError as exc:
            problems.append(f"cron: {exc}")
    problems.extend(_option_problems(spec))
    try:
        ZoneInfo(spec.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(
            f"timezone: {spec.timezone!r} is not a known IANA timezone (e.g. Asia/Shanghai)"
        )
    for key in ("role_id", "org_id", "session_id"):
        if key in spec.identity and not isinstance(spec.identity[key], str):
            problems.append(f"identity.{key}: must be a string")
    if spec.deliver is not None:
        given = [k for k in RECIPIENT_KEYS if spec.deliver.get(k)]
        if not given:
            problems.append("deliver: needs a recipient: `to`, `target` or `session_id`")
        elif len(given) > 1:
            problems.append(f"deliver: give one recipient, not {' and '.join(given)}")
    return problems


def _reference_problems(spec: ScheduleSpec) -> list[str]:
    """References (to earlier steps in a line, to the steps it waits for in a graph), and
    the graph itself: needs that are unknown or form a cycle, for_each values."""
    refs = spec.step_refs()
    if len({r.id for r in refs}) != len(refs):
        return static_errors(refs)  # duplicate ids: named by the step checks
    try:
        graph = spec.graph()
    except GraphError as exc:
        return exc.problems
    if not graph.is_graph:
        return static_errors(refs)
    problems = static_errors(
        refs,
        [graph.ancestors(i) for i in range(len(refs))],
        [graph.prev(i) for i in range(len(refs))],
    )
    if spec.deliver and spec.deliver.get("each_step"):
        problems.append("deliver.each_step: applies to chains that are a line (no needs)")
    return problems


def _option_problems(spec: ScheduleSpec) -> list[str]:
    """``at``, ``jitter`` and the ``empty_when`` rules of the schedule and its steps."""
    problems: list[str] = []
    if spec.at is not None:
        try:
            parse_instant(spec.at, spec.timezone)
        except WhenError as exc:
            problems.append(f"at: {str(exc).replace('run_at', 'at')}")
    if spec.jitter is not None:
        try:
            if parse_duration(spec.jitter) > MAX_JITTER_S:
                problems.append(f"jitter: at most {MAX_JITTER_S:g} seconds")
            elif spec.at is not None:
                problems.append("jitter: applies to cron schedules, not to a one-shot `at`")
        except WhenError as exc:
            problems.append(f"jitter: {exc}")
    rules = [("empty_when", spec.empty_when)]
    rules += [(f"steps.{i}.empty_when", st.empty_when) for i, st in enumerate(spec.steps)]
    for where, rule in rules:
        try:
            emptiness.parse(rule)
        except emptiness.RuleError as exc:
            problems.append(f"{where}: {exc}")
    return problems


def _step_problems(spec: ScheduleSpec, registry: SkillRegistry | None) -> list[str]:
    """Step ids (unique, well formed) and the skills they name."""
    problems: list[str] = []
    seen: set[str] = set()
    for i, step in enumerate(spec.steps):
        label = f"step {i} ({step.id})"
        if step.id is None or not STEP_ID_RE.match(step.id):
            problems.append(f"{label}: id may use letters, digits, '_' and '-' only")
        elif step.id in seen:
            problems.append(f"{label}: duplicate step id {step.id!r}")
        seen.add(step.id or "")
        if registry is not None:
            problems.extend(_skill_problems(label, step.skill, registry))
    return problems


def _skill_problems(label: str, name: str, registry: SkillRegistry) -> list[str]:
    skill = registry.get(name)
    if skill is None:
        return [f"{label}: unknown skill {name!r}"]
    if skill.error:
        return [f"{label}: skill {name!r} cannot load: {skill.error}"]
    if skill.skill_type is not SkillType.HANDLER:
        return [f"{label}: skill {name!r} is a {skill.skill_type.value} skill and cannot run"]
    return []


# --- the store ----------------------------------------------------------------------------
# Store functions take either a ``Services`` or a bare sessionmaker as their first argument.


def _registry(target: HasSessions | Sessions) -> SkillRegistry | None:
    return getattr(target, "registry", None)


async def _audit(sm: Sessions, action: str, target: str, actor: str | None, **details: Any) -> None:
    async with sm() as s:
        audit.record(s, action=action, target=target, actor=actor, details=details)
        await s.commit()


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()


NEXT_FIRES = 5  # upcoming fire times a schedule's JSON lists
MAX_NEXT_FIRES = 50


def next_fires(schedule: Schedule, n: int = NEXT_FIRES) -> list[float]:
    """The next ``n`` fire instants (epoch seconds) of an enabled schedule, the stored
    ``next_fire_at`` first (it may be due already); none when it is disabled."""
    if not schedule.enabled or schedule.next_fire_at is None or n < 1:
        return []
    try:
        tz = ZoneInfo(schedule.timezone)
        cron = parse(expr_of(schedule.cron, schedule.options))
    except (CronError, ValueError, KeyError):
        return [schedule.next_fire_at]  # stored before a check that refuses it now
    out = [schedule.next_fire_at]
    while len(out) < min(n, MAX_NEXT_FIRES):
        nxt = next_fire(cron, tz, out[-1])
        if not math.isfinite(nxt):
            break  # a one-shot schedule
        out.append(nxt)
    return out


def to_dict(schedule: Schedule, *, fires: int = NEXT_FIRES) -> dict[str, Any]:
    """Schedule JSON: the file's fields + ``id``, ``enabled``, ``next_fire_at`` (ISO) and
    ``next_fires`` (the next ``fires`` fire times, ISO, the first being ``next_fire_at``)."""
    return {
        "id": schedule.id,
        "name": schedule.name,
        "cron": schedule.cron or None,
        **_file_options(schedule.options),
        "timezone": schedule.timezone,
        "identity": schedule.identity or {},
        "deliver": schedule.deliver,
        "policy": schedule.policy or {},
        "misfire": schedule.misfire or Misfire().model_dump(),
        "overlap": schedule.overlap or "skip",
        "alert": schedule.alert,
        "steps": schedule.steps or [],
        "enabled": schedule.enabled,
        "paused_reason": schedule.paused_reason,
        "next_fire_at": iso(schedule.next_fire_at) if schedule.enabled else None,
        "next_fires": [iso(t) for t in next_fires(schedule, fires)],
        "last_fire_at": iso(schedule.last_fire_at),
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
    }


def _file_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The schedule-file fields kept in the ``options`` column."""
    opts = options or {}
    return {
        "at": opts.get("at"),
        "jitter": opts.get("jitter"),
        "quiet_when_empty": bool(opts.get("quiet_when_empty")),
        "empty_when": opts.get("empty_when"),
    }


def spec_of(schedule: Schedule) -> ScheduleSpec:
    """The stored schedule as a spec (already validated when it was stored)."""
    return ScheduleSpec.model_validate(
        {
            "name": schedule.name,
            "cron": schedule.cron or None,
            **{k: v for k, v in _file_options(schedule.options).items() if v is not None},
            "timezone": schedule.timezone,
            "identity": schedule.identity or {},
            "deliver": schedule.deliver,
            "policy": schedule.policy or {},
            "misfire": schedule.misfire or {},
            "overlap": schedule.overlap or "skip",
            "alert": schedule.alert,
            "steps": schedule.steps or [],
            "enabled": schedule.enabled,
        }
    )


async def create(
    target: HasSessions | Sessions,
    spec: ScheduleSpec | dict[str, Any],
    *,
    now: float | None = None,
    actor: str | None = None,
) -> Schedule:
    """Store a schedule (a validated spec, or a schedule-file dict validated here against
    the skills of ``target`` when it is a ``Services``) with its first fire time."""
    sm = sessions_of(target)
    if not isinstance(spec, ScheduleSpec):
        spec = validate(spec, _registry(target))
    now = time.time() if now is None else now
    _refuse_past(spec, now)
    fields = spec.file_fields()
    row = Schedule(
        id=uuid.uuid4().hex,
        name=spec.name,
        cron=spec.cron or "",
        options=spec.options() or None,
        timezone=spec.timezone,
        identity=fields["identity"],
        steps=fields["steps"],
        policy=fields["policy"],
        misfire=fields["misfire"],
        overlap=spec.overlap,
        alert=fields["alert"],
        deliver=fields["deliver"],
        enabled=spec.enabled,
        next_fire_at=spec.first_fire(now),
        created_at=now,
        updated_at=now,
    )
    async with sm() as s:
        s.add(row)
        try:
            await s.commit()
        except IntegrityError:
            raise ScheduleError([f"name: a schedule named {spec.name!r} already exists"]) from None
    if actor is not None:
        await _audit(sm, "schedule.create", row.id, actor, name=row.name)
    return row


def _refuse_past(spec: ScheduleSpec, now: float) -> None:
    if spec.at is not None and spec.first_fire(now) is None:
        raise ScheduleError([f"at: {spec.at!r} has passed; a one-shot schedule needs a later time"])


async def list_schedules(target: HasSessions | Sessions) -> list[Schedule]:
    async with sessions_of(target)() as s:
        return list((await s.execute(select(Schedule).order_by(Schedule.name))).scalars())


async def get(target: HasSessions | Sessions, id_or_name: str) -> Schedule | None:
    """A schedule by id, or by name."""
    async with sessions_of(target)() as s:
        row = await s.get(Schedule, id_or_name)
        if row is None:
            row = (
                await s.execute(select(Schedule).where(Schedule.name == id_or_name))
            ).scalar_one_or_none()
        return row


async def _require(sm: Sessions, id_or_name: str) -> Schedule:
    row = await get(sm, id_or_name)
    if row is None:
        raise LookupError(f"no schedule {id_or_name!r}")
    return row


async def set_enabled(
    target: HasSessions | Sessions,
    id_or_name: str,
    enabled: bool,
    *,
    now: float | None = None,
    actor: str | None = None,
) -> Schedule:
    """Enable or disable. Enabling computes the next fire time from now: fire times that
    passed while disabled are not run."""
    sm = sessions_of(target)
    row = await _require(sm, id_or_name)
    now = time.time() if now is None else now
    values: dict[str, Any] = {"enabled": enabled, "updated_at": now}
    if enabled and not row.enabled:
        values["next_fire_at"] = next_time(row.cron, row.options, row.timezone, now)
        values["paused_reason"] = None
    async with sm() as s:
        await s.execute(sa_update(Schedule).where(Schedule.id == row.id).values(**values))
        await s.commit()
    await _audit(sm, "schedule.enable" if enabled else "schedule.disable", row.id, actor)
    return await _require(sm, row.id)


async def update_schedule(
    target: HasSessions | Sessions,
    id_or_name: str,
    changes: dict[str, Any],
    registry: SkillRegistry | None = None,
    *,
    now: float | None = None,
    actor: str | None = None,
) -> Schedule:
    """Apply a partial change (any schedule-file field), re-validating the whole."""
    sm = sessions_of(target)
    registry = registry if registry is not None else _registry(target)
    row = await _require(sm, id_or_name)
    now = time.time() if now is None else now
    merged = {**spec_of(row).model_dump(mode="json"), **changes}
    spec = validate(merged, registry)
    fields = spec.file_fields()
    values: dict[str, Any] = {
        "name": spec.name,
        "cron": spec.cron or "",
        "options": spec.options() or None,
        "timezone": spec.timezone,
        "identity": fields["identity"],
        "steps": fields["steps"],
        "policy": fields["policy"],
        "misfire": fields["misfire"],
        "overlap": spec.overlap,
        "alert": fields["alert"],
        "deliver": fields["deliver"],
        "enabled": spec.enabled,
        "updated_at": now,
    }
    timing_changed = (spec.timing, spec.timezone) != (
        expr_of(row.cron, row.options),
        row.timezone,
    )
    if timing_changed:
        _refuse_past(spec, now)
    if timing_changed or (spec.enabled and not row.enabled):
        values["next_fire_at"] = spec.first_fire(now)
    if spec.enabled and not row.enabled:
        values["paused_reason"] = None
    async with sm() as s:
        await s.execute(sa_update(Schedule).where(Schedule.id == row.id).values(**values))
        try:
            await s.commit()
        except IntegrityError:
            raise ScheduleError([f"name: a schedule named {spec.name!r} already exists"]) from None
    await _audit(sm, "schedule.update", row.id, actor, fields=sorted(changes))
    return await _require(sm, row.id)


update = update_schedule


async def delete(
    target: HasSessions | Sessions, id_or_name: str, *, actor: str | None = None
) -> Schedule:
    """Delete a schedule and its run history (its running chain, if any, is not stopped:
    it finishes on its own). Returns the row as it was."""
    from sqlalchemy import delete as sa_delete

    sm = sessions_of(target)
    row = await _require(sm, id_or_name)
    async with sm() as s:
        await s.execute(sa_delete(Schedule).where(Schedule.id == row.id))
        await s.commit()
    await _audit(sm, "schedule.delete", row.id, actor, name=row.name)
    return row


# --- schedules as code: ``skilljobs schedules apply`` ------------------------------------


def diff(old: ScheduleSpec, new: ScheduleSpec) -> dict[str, tuple[Any, Any]]:
    """The schedule-file fields that differ: field → (stored, in the file)."""
    a, b = old.model_dump(mode="json"), new.model_dump(mode="json")
    if "enabled" not in new.model_fields_set:
        b.pop("enabled")  # a file that does not say keeps the operator's enable/disable
    return {k: (a.get(k), b.get(k)) for k in b if a.get(k) != b.get(k)}


async def apply(
    target: HasSessions | Sessions,
    specs: list[ScheduleSpec],
    *,
    prune: bool = False,
    dry_run: bool = False,
    actor: str | None = None,
) -> list[dict[str, Any]]:
    """Make the stored schedules match ``specs`` by name: create the new ones, update the
    changed ones (only the fields that differ), leave the same ones alone; with ``prune``
    delete the stored ones not in ``specs``. Returns one entry per schedule touched or
    compared: ``{"name", "action": create|update|unchanged|delete, "changes"}``."""
    sm = sessions_of(target)
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ScheduleError([f"name: {n!r} is defined more than once" for n in dupes])
    stored = {row.name: row for row in await list_schedules(sm)}
    out: list[dict[str, Any]] = []
    for spec in specs:
        row = stored.get(spec.name)
        if row is None:
            out.append({"name": spec.name, "action": "create", "changes": {}})
            if not dry_run:
                await create(sm, spec, actor=actor)
            continue
        changes = diff(spec_of(row), spec)
        if not changes:
            out.append({"name": spec.name, "action": "unchanged", "changes": {}})
            continue
        out.append({"name": spec.name, "action": "update", "changes": changes})
        if not dry_run:
            new = spec.model_dump(mode="json")
            await update_schedule(
                sm, row.id, {k: new[k] for k in changes}, _registry(target), actor=actor
            )
    if prune:
        for name, row in sorted(stored.items()):
            if name not in set(names):
                out.append({"name": name, "action": "delete", "changes": {}})
                if not dry_run:
                    await delete(sm, row.id, actor=actor)
    return out


# Run functions live in chains.runs; these names are part of this module's interface too.
from chains.runs import (  # noqa: E402
    QUEUED,
    arq_job_id,
    enqueue_number,
    enqueue_run,
    get_run,
    last_runs,
    list_runs,
    run_dict,
    trigger_manual,
)

__all__ = [
    "QUEUED",
    "ScheduleError",
    "ScheduleSpec",
    "apply",
    "arq_job_id",
    "create",
    "delete",
    "diff",
    "enqueue_number",
    "enqueue_run",
    "get",
    "get_run",
    "last_runs",
    "list_runs",
    "list_schedules",
    "next_fires",
    "run_dict",
    "set_enabled",
    "spec_of",
    "to_dict",
    "trigger_manual",
    "update",
    "validate",
]
