"""Checking a call's input against the skill's JSON schema before anything runs."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from jobs.skill import Skill

_validators: dict[int, Draft202012Validator] = {}


def _is_empty(value: Any) -> bool:
    # Missing and empty both count as missing; 0 and False are values.
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, dict)):
        return len(value) == 0
    return False


def validate_input(skill: Skill, data: dict[str, Any]) -> str | None:
    """None when ``data`` fits the skill's schema, else one readable sentence."""
    schema = skill.input_schema
    if not schema:
        return None
    required = schema.get("required") or []
    missing = [f for f in required if _is_empty(data.get(f))]
    if missing:
        names = ", ".join(repr(m) for m in missing)
        return f"missing required field{'s' if len(missing) > 1 else ''} {names}"
    validator = _validators.get(id(schema))
    if validator is None:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            return f"the skill's own schema is invalid ({exc.message}); fix its schema.json"
        validator = _validators[id(schema)] = Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    where = ".".join(str(p) for p in err.absolute_path) or "input"
    return f"{where}: {err.message}"
