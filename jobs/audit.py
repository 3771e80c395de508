"""The audit trail (``ops_actions``): every operator action, and every refusal of one, is
written through :func:`record`, in the caller's transaction, with the same shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from jobs.models import OpsAction

TARGET_MAX = 255  # ops_actions.target is a VARCHAR(255)


def record(
    session: AsyncSession,
    action: str,
    target: str,
    actor: str | None = "",
    details: Mapping[str, Any] | None = None,
) -> None:
    """Add one audit row to ``session`` (committed with the change it records)."""
    session.add(
        OpsAction(
            action=action,
            target=str(target)[:TARGET_MAX],
            actor=actor or "",
            details=dict(details or {}),
        )
    )
