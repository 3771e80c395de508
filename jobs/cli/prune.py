"""``skilljobs prune``: one retention pass now (or, with --dry-run, what it would delete)."""

from __future__ import annotations

from typing import Any

import typer

from jobs.cli.common import fail, load_settings, run_async
from jobs.db import create_engine, create_sessionmaker
from jobs.queue.prune import prune as run_prune


def prune(
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
) -> None:
    """Delete finished jobs, chain runs, messages, workspace files and skill environments
    past their retention."""
    settings = load_settings()

    async def _go() -> dict[str, Any] | None:
        engine = create_engine(settings.resolved_database_url)
        try:
            done = await run_prune(
                create_sessionmaker(engine), settings, dry_run=dry_run, actor="cli"
            )
            return done.to_dict() if done is not None else None
        finally:
            await engine.dispose()

    with typer.progressbar(length=1, label="pruning" if not dry_run else "counting") as bar:
        counts = run_async(_go)  # (a database that cannot be used: the setting and the fix)
        bar.update(1)
    if counts is None:
        fail("another pruner is running; try again when it has finished")
    verb = "would delete" if dry_run else "deleted"
    typer.echo(
        f"{verb}: {counts['jobs']} jobs, {counts['chain_runs']} chain runs, "
        f"{counts['messages']} messages, {counts['files']} workspace files, "
        f"{counts['envs']} skill environments ({counts['env_bytes'] / (1 << 20):,.1f} MB)"
    )


def register(app: typer.Typer) -> None:
    app.command("prune")(prune)
