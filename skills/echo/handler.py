"""echo: return the input unchanged."""

from __future__ import annotations

from typing import Any

INPUT_SCHEMA = {"type": "object", "additionalProperties": True, "properties": {}}


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    return dict(input_data or {})
