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
db_app = typer.Typer(help="Database schema (alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

from jobs.cli_common import fail, load_settings, open_services, run_async  # noqa: E402

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

    try:
        rev = run_async(_go)
    except Exception as exc:
        fail(f"migration failed: {exc}")
    typer.echo(f"database at revision {rev}")


def _register_groups() -> None:
    """Attach command groups owned by other modules (each optional while being built)."""
    import importlib

    for module, attr in (
        ("jobs.cli_skills", "register"),
        ("jobs.cli_config", "register"),
        ("jobs.cli_jobs", "register"),
        ("jobs.cli_run", "register"),
        ("jobs.cli_doctor", "register"),
        ("chains.cli", "register"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        getattr(mod, attr)(app)


_register_groups()


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
