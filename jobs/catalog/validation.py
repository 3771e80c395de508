"""Checking a call's input against the skill's JSON schema before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from jobs.skill import Skill

_validators: dict[int, tuple[dict[str, Any], Draft202012Validator]] = {}


@dataclass(frozen=True)
class InputProblem:
    """Why an input was refused: one readable sentence and the field(s) it is about."""

    message: str
    fields: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.message


def repair_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with each bare-string property (``"symbol": "string"``) read as
    ``{"type": "string"}`` and any other non-object property as ``{}`` — the same
    correction ``skills check`` reports, applied at run time."""
    props = schema.get("properties")
    if not isinstance(props, dict) or all(isinstance(v, dict | bool) for v in props.values()):
        return schema
    fixed = {
        k: v if isinstance(v, dict | bool) else ({"type": v} if isinstance(v, str) else {})
        for k, v in props.items()
    }
    return {**schema, "properties": fixed}


def _is_empty(value: object) -> bool:
    # Missing and empty both count as missing; 0 and False are values.
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, dict)):
        return len(value) == 0
    return False


def _validator(schema: dict[str, Any]) -> Draft202012Validator | str:
    hit = _validators.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    usable = repair_schema(schema)
    try:
        Draft202012Validator.check_schema(usable)
    except SchemaError as exc:
        return f"the skill's own schema is invalid ({exc.message}); fix its schema.json"
    validator = Draft202012Validator(usable)
    _validators[id(schema)] = (schema, validator)  # keeps ``schema`` alive: ids stay unique
    return validator


def input_problem(skill: Skill, data: dict[str, Any]) -> InputProblem | None:
    """None when ``data`` fits the skill's schema (its subcommand's, with ``cli_commands``),
    else what is wrong and with which field."""
    schema = skill.input_schema
    sub = data.get("_subcommand")
    if sub not in (None, "") and isinstance(skill.cli_command_schemas.get(str(sub)), dict):
        schema = skill.cli_command_schemas[str(sub)]
        data = {k: v for k, v in data.items() if k != "_subcommand"}
    if not schema:
        return None
    required = schema.get("required") or []
    missing = [str(f) for f in required if _is_empty(data.get(f))]
    if missing:
        names = ", ".join(repr(m) for m in missing)
        return InputProblem(
            f"missing required field{'s' if len(missing) > 1 else ''} {names}", missing
        )
    validator = _validator(schema)
    if isinstance(validator, str):
        return InputProblem(validator)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    path = [str(p) for p in err.absolute_path]
    where = ".".join(path) or "input"
    return InputProblem(f"{where}: {err.message}", [path[0]] if path else [])


def validate_input(skill: Skill, data: dict[str, Any]) -> str | None:
    """None when ``data`` fits the skill's schema, else one readable sentence."""
    problem = input_problem(skill, data)
    return problem.message if problem is not None else None
