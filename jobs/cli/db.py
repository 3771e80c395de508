"""``skilljobs db upgrade``: the database schema (alembic migrations)."""

from __future__ import annotations

import typer

from jobs.cli.common import load_settings, run_async
from jobs.db import create_engine
from jobs.migrate import current_revision, upgrade

db_app = typer.Typer(help="Database schema (alembic migrations).", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply migrations to SKILLJOBS_DATABASE_URL (default: the SQLite file in the data dir)."""
    settings = load_settings()

    async def _go() -> str | None:
        engine = create_engine(settings.resolved_database_url)
        try:
            await upgrade(engine, revision)
            return await current_revision(engine)
        finally:
            await engine.dispose()

    rev = run_async(_go)
    typer.echo(f"database at revision {rev}")


def register(app: typer.Typer) -> None:
    app.add_typer(db_app, name="db")
