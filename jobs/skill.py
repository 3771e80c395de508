"""What a loaded skill is: the data the loader produces and the executor consumes."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_WALL_SEC = 600.0
MAX_WALL_SEC = 1800.0
SUBPROCESS_TIMEOUT_SEC = 60.0
FANOUT_SEP = "__"  # cli_commands fan out as tools named <skill>__<sub>
MAX_FANOUT = 45


class ExecType(enum.StrEnum):
    PYTHON = "python"  # in-process (async or sync entry function)
    PYTHON_CLI = "python_cli"  # argparse + __main__ / SystemExit: run as a subprocess
    SHELL = "shell"
    INLINE_SHELL = "inline_shell"
    NODE = "node"
    RUBY = "ruby"
    GO = "go"
    HTTP = "http"
    NONE = "none"  # skill_md / knowledge: nothing to execute


class SkillType(enum.StrEnum):
    HANDLER = "handler"
    SKILL_MD = "skill_md"
    KNOWLEDGE = "knowledge"


@dataclass
class Skill:
    """One skill folder after loading. ``error`` set ⇒ the skill failed to load and must
    not run; ``warnings`` are shown to the operator (e.g. frontmatter fallback losses)."""

    name: str
    path: Path
    skill_type: SkillType = SkillType.HANDLER
    exec_type: ExecType = ExecType.NONE
    entry: Path | None = None  # script / handler / TOML file
    command: str | None = None  # inline_shell command
    entry_function: str | None = None  # in-process: execute/run/handler/main/handle
    is_async_entry: bool = False
    required_positional: int = 0  # bind: 0 → f(), 1 → f(input), ≥2 → f(input, ctx)
    is_async: bool = False  # frontmatter `async: true` → background job
    wall_sec: float | None = None  # declared wall clock (wall_sec/timeout_sec/openclaw.timeout)
    category: str = "general"
    cost_tier: str = "low"
    version: str = ""
    tags: list[str] = field(default_factory=list)
    description: str = ""
    env: dict[str, Any] = field(default_factory=dict)
    requires_env: list[str] = field(default_factory=list)
    requires_bins: list[str] = field(default_factory=list)
    exec_mode: str = ""  # "shell"/"runtime" skip the requires.bins check
    cli_commands: list[str] = field(default_factory=list)
    cli_command_schemas: dict[str, Any] = field(default_factory=dict)  # sub-command → schema
    input_schema: dict[str, Any] | None = None  # schema.json wins over in-code schema
    force_raw_prompt: bool = False
    frontmatter: dict[str, Any] = field(default_factory=dict)
    skill_md_path: Path | None = None
    skill_md_chars: int = 0
    builtin: bool = False  # shipped with skilljobs (notify, send_message)
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    hint: str = ""  # how to make a document skill runnable (shown and sent on refusal)
    cli_reason: str = ""  # why a .py runs as a command-line script (shown in `skills list`)

    @property
    def loaded(self) -> bool:
        return self.error is None

    @property
    def runnable(self) -> bool:
        return self.error is None and self.skill_type is SkillType.HANDLER

    def effective_wall_sec(self, policy_wall_sec: float | None = None) -> float:
        """Declared > run policy > default 600 s; never above 1800 s."""
        for value in (self.wall_sec, policy_wall_sec):
            if value is not None and value > 0:
                return min(float(value), MAX_WALL_SEC)
        return DEFAULT_WALL_SEC


class SkillRegistry:
    """Name → Skill for every folder found, loaded or not (errors stay visible)."""

    def __init__(self, skills: dict[str, Skill] | None = None) -> None:
        self._skills: dict[str, Skill] = dict(skills or {})
        self.problems: list[str] = []  # folder-level problems (e.g. a missing skills folder)

    def add(self, skill: Skill) -> None:
        self._skills[skill.name] = skill

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def fanned(self, name: str) -> tuple[Skill, str] | None:
        """``<skill>__<sub>`` → (the skill, ``sub``) when the skill declares 1–45
        ``cli_commands`` including ``sub`` (each fans out as a tool of its own)."""
        base, sep, sub = name.rpartition(FANOUT_SEP)
        skill = self._skills.get(base) if sep else None
        if skill is None or not 1 <= len(skill.cli_commands) <= MAX_FANOUT:
            return None
        return (skill, sub) if sub in skill.cli_commands else None

    def resolve(self, name: str) -> tuple[Skill, str | None] | None:
        """What a dispatched ``name`` calls: the skill itself, or ``<skill>__<sub>`` as
        (the skill, ``sub``); None when neither is loaded."""
        found = self._skills.get(name)
        return (found, None) if found is not None else self.fanned(name)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    def __iter__(self) -> Iterator[Skill]:
        return iter(sorted(self._skills.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._skills)

    def errors(self) -> dict[str, str]:
        return {s.name: s.error for s in self._skills.values() if s.error}
