"""The ``skilljobs`` command line. Sub-command groups live next to what they operate on."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="skilljobs",
    help="Background jobs, chains and delivery for chat-platform skills.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"skilljobs {version('skilljobs')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback when a command fails (SKILLJOBS_DEBUG=1)."
    ),
) -> None:
    """Background jobs, chains and delivery for chat-platform skills."""

    invocation.debug = debug


db_app = typer.Typer(help="Database schema (alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

from jobs.cli.common import (  # noqa: E402
    fail,
    invocation,
    load_settings,
    open_services,
    run_async,
)

__all__ = ["app", "fail", "load_settings", "open_services", "run_async"]


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply migrations to SKILLJOBS_DATABASE_URL (default: the SQLite file in the data dir)."""
    from jobs.db import create_engine
    from jobs.migrate import current_revision, upgrade

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


# Command groups owned by other modules. Each keeps its heavy imports inside its commands,
# so ``skilljobs --help`` stays fast.
from chains import cli as chains_cli  # noqa: E402
from jobs.cli import (  # noqa: E402
    config,
    deliveries,
    doctor,
    envs,
    incidents,
    limits,
    prune,
    run,
    skills,
    workers,
)
from jobs.cli import jobs as jobs_cli  # noqa: E402

_GROUPS = (
    skills,
    envs,
    config,
    jobs_cli,
    incidents,
    limits,
    run,
    doctor,
    prune,
    chains_cli,
    deliveries,
    workers,
)
for _group in _GROUPS:
    _group.register(app)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
