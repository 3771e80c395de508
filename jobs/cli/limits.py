"""``skilljobs limits set|unset|list``: start-rate and concurrency limits at run time
(``jobs.queue.rates``; the same as ``PUT|DELETE|GET /api/v1/limits``)."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.common import fail, with_services
from jobs.queue import rates
from jobs.services import Services

console = Console()
limits_app = typer.Typer(
    help="Start-rate and concurrency limits per skill, org or role.", no_args_is_help=True
)


@limits_app.command("set")
def set_limit(
    key: str = typer.Argument(..., help="skill:NAME, org:ID, role:ID, actor:KEY or KIND:*"),
    rate: str = typer.Option("", "--rate", help="At most COUNT starts per PERIOD: 2/10s, 30/m."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", min=1, help="At most N running at once."
    ),
) -> None:
    """Set a limit (workers apply it within a second; jobs over it wait, queued)."""

    async def _go(svc: Services) -> None:
        try:
            row = await rates.set_limit(
                svc.sessionmaker, key, rate=rate or None, concurrency=concurrency, actor="cli"
            )
        except rates.LimitError as exc:
            fail(str(exc))
        console.print(
            f"{row.key}: rate {row.rate or '-'}, concurrency {row.concurrency or '-'}",
            highlight=False,
        )

    with_services(_go, redis=False)


@limits_app.command("unset")
def unset_limit(key: str = typer.Argument(..., help="The key of the limit to remove.")) -> None:
    """Remove a run-time limit (SKILLJOBS_LIMITS applies again for its key)."""

    async def _go(svc: Services) -> bool:
        try:
            return await rates.unset_limit(svc.sessionmaker, key, actor="cli")
        except rates.LimitError as exc:
            fail(str(exc))

    removed = with_services(_go, redis=False)
    console.print(f"{key}: " + ("removed" if removed else "had no run-time limit"), highlight=False)


@limits_app.command("list")
def list_limits(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """The limits in force: SKILLJOBS_LIMITS with the run-time ones over it."""

    async def _go(svc: Services) -> list[dict[str, Any]]:
        return await rates.items(svc)

    items = with_services(_go)
    if as_json:
        typer.echo(json.dumps({"items": items}, ensure_ascii=False))
        return
    table = Table(title="limits")
    for col in ("key", "rate", "concurrency", "source", "tokens", "running"):
        table.add_column(col)
    for i in items:
        tokens = "-" if i["tokens"] is None else f"{i['tokens']:.2f}"
        table.add_row(
            i["key"],
            i["rate"] or "-",
            str(i["concurrency"] or "-"),
            i["source"],
            tokens,
            "-" if i["running"] is None else str(i["running"]),
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(limits_app, name="limits")
