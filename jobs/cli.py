"""The ``skilljobs`` command line. Sub-command groups live next to what they operate on."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from jobs.settings import Settings

app = typer.Typer(
    name="skilljobs",
    help="Background jobs, chains and delivery for chat-platform skills.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema (alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

T = TypeVar("T")


def fail(message: str, code: int = 1) -> None:
    """Exit non-zero with a one-line reason."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(fn())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def load_settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:
        fail(f"invalid settings: {exc}")
        raise


async def open_services(settings: Settings, **kw: Any):  # type: ignore[no-untyped-def]
    from jobs.services import Services

    try:
        return await Services.open(settings, **kw)
    except Exception as exc:
        fail(f"cannot start: {exc}")
        raise


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
    sys.exit(main())
