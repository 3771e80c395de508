"""``skilljobs incidents list|ack``: failures grouped by signature (retrying an incident's
jobs is ``skilljobs jobs retry --incident ID``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console

from jobs.cli import output
from jobs.cli.common import fail, with_services
from jobs.queue import incidents
from jobs.services import Services

console = Console()


def _ts(value: float | None) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


incidents_app = typer.Typer(help="Failures grouped by signature.", no_args_is_help=True)


@incidents_app.command("list")
def list_incidents(
    status: str = typer.Option("open", "--status", help="open, acked or all."),
    skill: str = typer.Option("", "--skill", help="Only incidents of this skill."),
    limit: int = typer.Option(50, "--limit", "-n", min=1, max=500),
    as_json: bool = output.JSON_OPT,
) -> None:
    """Incidents, most recently seen first."""

    async def _go(svc: Services) -> None:
        items = await incidents.list_incidents(
            svc.sessionmaker,
            status=None if status == "all" else status,
            skill=skill or None,
            limit=limit,
        )
        if as_json:
            output.print_json({"items": items})
            return
        cols = ("id", "skill", "type", "count", "first seen", "last seen", "status", "error")
        rows = [
            (
                i["id"],
                i["skill"],
                i["error_type"],
                i["count"],
                _ts(i["first_seen"]),
                _ts(i["last_seen"]),
                i["status"],
                i["pattern"],
            )
            for i in items
        ]
        output.table(cols, rows, title=f"incidents ({status})", wrap=("error",))

    with_services(_go, redis=False)


@incidents_app.command("ack")
def ack_incident(incident_id: str) -> None:
    """Acknowledge an incident (a new failure of its signature re-opens it)."""

    async def _go(svc: Services) -> dict[str, Any]:
        try:
            return await incidents.ack(svc.sessionmaker, incident_id, actor="cli")
        except LookupError as exc:
            fail(str(exc.args[0]))

    done = with_services(_go, redis=False)
    console.print(f"incident {incident_id} acknowledged ({done['count']} failures so far)")


def register(app: typer.Typer) -> None:
    app.add_typer(incidents_app, name="incidents")
