"""``skilljobs doctor``: print one ✓ / ! / ✗ line per check; exit 1 when any check fails.
It registers ``db upgrade`` too, the fix it names for a schema behind."""

from __future__ import annotations

import json

import typer

from jobs.cli import db
from jobs.cli.checks import Check, Status, check_settings, fail, failed, run_checks

_COLORS = {
    Status.OK: typer.colors.GREEN,
    Status.WARN: typer.colors.YELLOW,
    Status.FAIL: typer.colors.RED,
}


def _echo(check: Check) -> None:
    typer.secho(f"{check.status.symbol} ", fg=_COLORS[check.status], nl=False, bold=True)
    typer.echo(f"{check.name}: {check.detail}")
    if check.fix and check.status is not Status.OK:
        typer.echo(f"    → {check.fix}")


def doctor(
    host: str | None = typer.Option(
        None, "--host", help="The address `skilljobs web` will bind (checks the API token rule)."
    ),
    timeout: float = typer.Option(5.0, "--timeout", min=0.1, help="Seconds per network check."),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as a JSON list."),
) -> None:
    """Check settings, database, migrations, Redis, skills, channels and notify targets."""
    import asyncio

    settings, parsed = check_settings()
    checks = [parsed]
    if settings is not None:
        try:
            checks += asyncio.run(run_checks(settings, host=host, timeout_sec=timeout))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except Exception as exc:  # a check that could not even run is a failed check
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            checks.append(
                fail("checks", f"stopped: {type(exc).__name__}: {first}", "see the lines above")
            )
    if as_json:
        typer.echo(json.dumps([c.as_dict() for c in checks], ensure_ascii=False, indent=2))
    else:
        for check in checks:
            _echo(check)
        bad = sum(c.status is Status.FAIL for c in checks)
        warn = sum(c.status is Status.WARN for c in checks)
        typer.echo(f"\n{len(checks)} checks: {bad} failed, {warn} warning(s)")
    if failed(checks):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
    db.register(app)  # `db upgrade`, the fix doctor names for a schema behind
