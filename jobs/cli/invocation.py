"""What this one ``skilljobs`` invocation was started with: kept apart from
``jobs.cli.common`` so the root command can record ``--debug`` without importing the
settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.settings import Settings


class Invocation:
    """The command's ``--debug`` flag and the settings it loaded (which the explanation of
    a failure names)."""

    debug: bool = False
    settings: Settings | None = None


invocation = Invocation()
