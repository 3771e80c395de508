"""The bundled demo chain (``daily_orders.yaml``), installed once by ``skilljobs up``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from chains import schedules
from delivery.channels.web import ensure_session
from jobs.services import Services

DEMO_FILE = Path(__file__).with_name("daily_orders.yaml")


def demo_spec() -> dict[str, Any]:
    data = yaml.safe_load(DEMO_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


async def install_demo(services: Services) -> str | None:
    """Add the demo schedule unless one with its name exists (the operator may have
    edited or disabled it); make sure its result session exists. Returns the new id."""
    data = demo_spec()
    identity = data.get("identity") or {}
    session_id = (data.get("deliver") or {}).get("session_id")
    if session_id:
        await ensure_session(
            services.sessionmaker,
            session_id,
            role_id=str(identity.get("role_id") or ""),
            org_id=str(identity.get("org_id") or ""),
        )
    if await schedules.get(services, data["name"]) is not None:
        return None
    row = await schedules.create(
        services, schedules.validate(data, services.registry), actor="demo"
    )
    return row.id
