"""``skilljobs workers list | pause ID | resume ID | drain ID``: see the workers, stop one
taking jobs, let it take them again, or let it finish what it runs and exit (drain)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console

from jobs.cli import output
from jobs.cli.common import fail, with_services
from jobs.queue import worker_control
from jobs.services import Services

console = Console()
workers_app = typer.Typer(help="Worker processes: pause, resume, drain.", no_args_is_help=True)

DONE = {
    "pause": "paused: it finishes what it runs and takes no new jobs until resumed",
    "resume": "resumed: it takes jobs again",
    "drain": "draining: it takes no new jobs, finishes what it runs, then exits",
}


@workers_app.command("list")
def list_workers(as_json: bool = output.JSON_OPT) -> None:
    """Workers, latest heartbeat first: alive / stale / stopped, paused or draining."""

    async def _go(svc: Services) -> list[dict[str, Any]]:
        try:
            return await worker_control.list_workers(svc)
        except worker_control.WorkerControlError as exc:
            fail(str(exc))

    items = with_services(_go)
    if as_json:
        output.print_json({"items": items})
        return
    rows = []
    for w in items:
        flags = ", ".join(f for f in ("paused", "draining") if w[f]) or "-"
        beat = datetime.fromtimestamp(w["last_heartbeat"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        rows.append((w["id"], w["host"], w["pid"], w["state"], flags, len(w["running"]), beat))
    cols = ("id", "host", "pid", "state", "flags", "running", "last heartbeat")
    output.table(cols, rows)


def _act(action: str, worker_id: str) -> None:
    async def _go(svc: Services) -> dict[str, Any]:
        try:
            return await worker_control.act(svc, action, worker_id, actor="cli")
        except worker_control.WorkerControlError as exc:
            fail(str(exc))

    with_services(_go)
    console.print(f"{worker_id}: {DONE[action]}")


@workers_app.command("pause")
def pause(worker_id: str = typer.Argument(..., help="A worker id from `workers list`.")) -> None:
    """Take no new jobs (running ones finish) until resumed."""
    _act("pause", worker_id)


@workers_app.command("resume")
def resume(worker_id: str = typer.Argument(..., help="A worker id from `workers list`.")) -> None:
    """Take jobs again (also calls off a drain still under way)."""
    _act("resume", worker_id)


@workers_app.command("drain")
def drain(worker_id: str = typer.Argument(..., help="A worker id from `workers list`.")) -> None:
    """Take no new jobs, finish the running ones, then exit."""
    _act("drain", worker_id)


def register(app: typer.Typer) -> None:
    app.add_typer(workers_app, name="workers")
