"""Install preflight (``skilljobs skills check``): everything the loader reports, plus the
stricter rules a new skill is held to before it is installed."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from jobs.catalog.loader import load_skill, skill_folders
from jobs.catalog.pyscan import inspect_python
from jobs.catalog.validation import repair_schema
from jobs.crypto import SECRET_MARKERS, is_secret_key
from jobs.skill import ExecType, Skill, SkillType

SKILL_MD_MAX = 8_000
ENTRY_PARAMS = ("input_data", "runtime_context")
# Name segments that make a secret-named key an actual credential (api_key, access_token…).
CREDENTIAL_PARTS = frozenset(
    "key apikey token secret password passwd passphrase credential credentials auth "
    "authorization".split()
)

Level = Literal["error", "warning"]


@dataclass(frozen=True)
class Finding:
    skill: str
    level: Level
    message: str


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level == "error" for f in findings)


def check_skill_dir(path: Path) -> list[Finding]:
    """Check one skill folder or a folder of skill folders."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return [Finding(path.name or str(path), "error", f"{path} is not a folder")]
    folders = skill_folders(path)
    if not folders:
        return [Finding(path.name, "error", f"no skill folders in {path}")]
    findings: list[Finding] = []
    for folder in folders:
        findings += check_skill(load_skill(folder))
    return findings


def check_skill(skill: Skill) -> list[Finding]:
    out: list[Finding] = []

    def add(level: Level, message: str) -> None:
        out.append(Finding(skill.name, level, message))

    if skill.error:
        add("error", skill.error)
    for warning in skill.warnings:
        add("warning", warning)
    if skill.skill_md_chars > SKILL_MD_MAX:
        lost = skill.skill_md_chars - SKILL_MD_MAX
        if skill.skill_type is SkillType.SKILL_MD:
            # a warning, as `skills list` loads it: check and list agree
            add(
                "warning",
                f"SKILL.md is {skill.skill_md_chars:,} chars: a document skill is injected "
                f"cut at {SKILL_MD_MAX:,}, so the last {lost:,} chars would be lost — move "
                "details into references/ and say in the text when to read them",
            )
        else:
            add(
                "warning",
                f"SKILL.md is {skill.skill_md_chars:,} chars (keep it under {SKILL_MD_MAX:,}; "
                "move details into references/)",
            )
    if skill.exec_type is ExecType.PYTHON and skill.entry is not None and not skill.error:
        for level, message in _entry_findings(skill):
            add(level, message)
    for level, message in _schema_findings(skill.input_schema):
        add(level, message)
    for level, message in _name_findings(skill):
        add(level, message)
    ignored = _ignored_requirements(skill)
    if ignored:
        add("warning", ignored)
    declared = set(skill.env)
    missing = [n for n in skill.requires_env if n not in declared]
    if missing and not skill.error:
        add(
            "warning",
            f"requires.env {', '.join(missing)} not declared in the top-level env: the "
            "configuration form reads env, the pre-run check reads requires — declare both",
        )
    return out


def _ignored_requirements(skill: Skill) -> str | None:
    """A ``requirements.txt`` that the entry's PEP 723 block makes the build ignore."""
    entry, req = skill.entry, Path(skill.path) / "requirements.txt"
    if entry is None or entry.suffix != ".py" or not req.is_file() or not entry.is_file():
        return None
    try:
        text = entry.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if "# /// script" not in text:
        return None
    return (
        f"requirements.txt is ignored: {entry.name} has a PEP 723 block (# /// script), "
        "which alone declares the script's dependencies — move its requirements into that "
        "block, or remove the block"
    )


# --------------------------------------------------------------------------- entry function


def _entry_findings(skill: Skill) -> list[tuple[Level, str]]:
    assert skill.entry is not None
    info = inspect_python(skill.entry)
    name = skill.entry_function or ""
    fn = info["functions"][name]
    found: list[tuple[Level, str]] = []
    expected = "async def execute(input_data, runtime_context)"
    if name != "execute":
        found.append(("warning", f"entry function is {name}(); new skills should use {expected}"))
    if not fn["is_async"]:
        found.append(
            (
                "warning",
                f"{name}() is a plain def: it gets no database (db is None) and no "
                f"call_skill; write {expected}",
            )
        )
    params: list[str] = fn["params"]
    # The binding rule itself (0, 1 or 2 positional parameters; more is a load error) is
    # the loader's, so `skills check` and the runtime never disagree (SPEC §2).
    if len(params) < 2:
        binding = f"{name}(input_data)" if params else f"{name}()"
        found.append(
            (
                "warning",
                f"{name}() takes {len(params)} positional parameter(s): it is called as "
                f"{binding} and never sees the runtime context; new skills use {expected}",
            )
        )
        return found
    if len(params) > 2:
        found.append(
            ("warning", f"{name}() has more than 2 positional parameters; only 2 are passed")
        )
        return found
    if fn["defaults"] >= 1:
        found.append(
            (
                "warning",
                f"{name}() gives its second parameter {params[1]!r} a default: remove it "
                "so the runtime context is always bound",
            )
        )
    if tuple(params) != ENTRY_PARAMS:
        found.append(
            ("warning", f"{name}() parameters are ({', '.join(params)}); name them {ENTRY_PARAMS}")
        )
    return found


# --------------------------------------------------------------------------- input schema


def _schema_findings(schema: dict[str, Any] | None) -> list[tuple[Level, str]]:
    if schema is None:
        return []
    found: list[tuple[Level, str]] = []
    props = schema.get("properties")
    for key, value in (props or {}).items() if isinstance(props, dict) else ():
        if not isinstance(value, dict | bool):
            found.append(
                (
                    "warning",
                    f"schema property {key!r} must be an object like "
                    f'{{"type": "string", "description": "..."}}, not {value!r} '
                    "(corrected the same way at run time; some model providers reject "
                    "the whole tool list)",
                )
            )
        elif isinstance(value, dict) and not value.get("description"):
            found.append(
                (
                    "warning",
                    f"schema property {key!r} has no description (the model fills "
                    "parameters from it)",
                )
            )
    if isinstance(props, dict):
        for key in schema.get("required") or []:
            if key not in props:
                found.append(("warning", f"schema requires {key!r} but does not define it"))
    schema = repair_schema(schema)
    try:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for

        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        found.append(
            ("error", f"input schema is not a valid JSON Schema at {where}: {exc.message}")
        )
    return found


# --------------------------------------------------------------------------- secret names


def _parts(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [p for p in re.split(r"[^a-z0-9]+", spaced.lower()) if p]


def is_credential_name(name: str) -> bool:
    """Secret-named and clearly a credential (``api_key``, ``accessToken``, ``PASSWORD``)."""
    parts = _parts(name)
    return any(p in CREDENTIAL_PARTS or p.endswith(("apikey", "password")) for p in parts)


def _name_findings(skill: Skill) -> list[tuple[Level, str]]:
    names: dict[str, str] = {}
    for n in skill.env:
        names.setdefault(n, "config")
    for n in skill.requires_env:
        names.setdefault(n, "config")
    props = (skill.input_schema or {}).get("properties")
    for n in props if isinstance(props, dict) else {}:
        names.setdefault(n, "input")
    for schema in skill.cli_command_schemas.values():
        sub = schema.get("properties") if isinstance(schema, dict) else None
        for n in sub if isinstance(sub, dict) else {}:
            names.setdefault(n, "input")
    if skill.entry is not None and skill.entry.suffix == ".py":
        for n in _constant_names(skill.entry):
            names.setdefault(n, "constant")

    found: list[tuple[Level, str]] = []
    for name, kind in names.items():
        if not is_secret_key(name):
            continue
        marker = next(m for m in SECRET_MARKERS if m in name.lower())
        if kind == "constant":
            found.append(
                (
                    "warning",
                    f"module constant {name!r} contains {marker!r}: names are scanned by "
                    "substring, so it is treated as a secret — avoid key/token/secret/"
                    "password/credential/auth in names that are not credentials",
                )
            )
        elif not is_credential_name(name):
            found.append(
                (
                    "warning",
                    f"{kind} name {name!r} contains {marker!r}: it will be treated as a secret "
                    "(encrypted, masked, removed from the model's schema) — rename it if it is "
                    "not a credential",
                )
            )
        elif kind == "input":
            found.append(
                (
                    "warning",
                    f"input field {name!r} is a credential: the model never fills it (it is "
                    "removed from the schema); declare it in env so it comes from the "
                    "skill configuration",
                )
            )
    return found


def _constant_names(path: Path) -> list[str]:
    """Module-level UPPER_CASE names (they are scanned for secret markers too)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, OSError, UnicodeDecodeError, ValueError):
        return []
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        out += [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()]
    return out
