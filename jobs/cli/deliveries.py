"""``skilljobs deliveries list|resend|dismiss``: the deliveries whose outcome is ``unknown``
or that ``failed``, and the operator's two answers to them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import typer

from delivery import custody
from delivery.custody import list_deliveries
from jobs.cli import output
from jobs.cli.common import fail, load_settings, open_services, run_async

deliveries_app = typer.Typer(
    help="Deliveries: list unknown/failed ones, send one again, or dismiss it.",
    no_args_is_help=True,
)

ACTOR = "cli"


def _ts(value: float | None) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@deliveries_app.command("list")
def list_cmd(
    status: str = typer.Option(
        "", "--status", "-s", help="unknown, failed, sent, … (comma list; default unknown,failed)"
    ),
    job: str = typer.Option("", "--job", "-j", help="Only this job's (or chain run's)."),
    limit: int = typer.Option(100, "--limit", "-n", min=1, max=500),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Deliveries newest first (by default every unknown and failed one, and every one
    pending past SKILLJOBS_DELIVERY_PENDING_STALE_SEC)."""
    settings = load_settings()

    async def _go() -> list[dict[str, Any]]:
        svc = await open_services(settings, redis=False)
        try:
            return await list_deliveries(
                svc.sessionmaker,
                status=status or None,
                job=job or None,
                limit=limit,
                stale_after=settings.delivery_pending_stale_sec,
            )
        except ValueError as exc:  # an unknown status
            fail(str(exc))
        finally:
            await svc.close()

    rows = run_async(_go)
    if as_json:
        typer.echo(json.dumps({"items": rows}, ensure_ascii=False, indent=2))
        return

    cols = ("id", "status", "recipient", "kind", "job", "gen", "updated", "error / receipt")
    out = []
    for r in rows:
        detail = r["error"] or (r["message_id"] and f"message {r['message_id']}") or ""
        out.append(
            (
                r["id"],
                r["status"],
                r["recipient"],
                r["kind"],
                r["job_id"] or r["chain_run_id"] or "-",
                r["generation"],
                _ts(r["updated_at"]),
                detail,
            )
        )
    output.table(cols, out, wrap=("error / receipt",))
    if not rows and output.is_terminal():
        typer.echo("no deliveries match")


def _act(action: str, delivery_id: int) -> None:
    settings = load_settings()

    async def _go() -> custody.Outcome:
        # Redis: the shared rate limits and live pushes to web sessions, when configured
        svc = await open_services(settings, redis=action == "resend" and bool(settings.redis_url))
        try:
            if action == "resend":
                return await custody.resend(svc, delivery_id, actor=ACTOR)
            return await custody.dismiss(svc.sessionmaker, delivery_id, actor=ACTOR)
        finally:
            await svc.close()

    out = run_async(_go)
    if not out.ok:
        fail(out.message)
    d = out.delivery or {}
    receipt = f" (message {d['message_id']})" if d.get("message_id") else ""
    typer.echo(f"delivery {delivery_id}: {out.message}{receipt}")


@deliveries_app.command("resend")
def resend_cmd(delivery_id: int = typer.Argument(..., help="Delivery id (see list).")) -> None:
    """Send an unknown, failed or dismissed delivery again (a new generation)."""
    _act("resend", delivery_id)


@deliveries_app.command("dismiss")
def dismiss_cmd(delivery_id: int = typer.Argument(..., help="Delivery id (see list).")) -> None:
    """Close an unknown or failed delivery: it is never sent again."""
    _act("dismiss", delivery_id)


def register(app: typer.Typer) -> None:
    app.add_typer(deliveries_app, name="deliveries")
