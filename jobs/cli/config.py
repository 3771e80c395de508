"""``skilljobs config set|unset|list``: per-role skill configuration (secrets shown masked)."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer

from jobs.catalog.configs import ConfigStore
from jobs.cli import output
from jobs.cli.common import fail, load_settings, run_async
from jobs.context import config_key
from jobs.crypto import SecretBox, is_secret_key, load_or_create_key
from jobs.db import create_engine, create_sessionmaker

T = TypeVar("T")

config_app = typer.Typer(
    help="Per-role skill configuration (secrets stored encrypted).", no_args_is_help=True
)


def _value(key: str, raw: str, as_string: bool) -> Any:
    """Secrets and ``--string`` values stay text; others are JSON when they parse as JSON."""
    if raw == "-":
        raw = sys.stdin.read().rstrip("\n")
    if as_string or is_secret_key(key):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


async def _with_store(fn: Callable[[ConfigStore], Awaitable[T]]) -> T:
    settings = load_settings()
    try:
        key = load_or_create_key(
            settings.data_dir,
            settings.secret_key.get_secret_value() if settings.secret_key else None,
        )
        engine = create_engine(settings.resolved_database_url)
    except ValueError as exc:  # a secret key that is not one
        fail(f"cannot open the configuration store: {exc}", code=2)
    try:
        return await fn(ConfigStore(create_sessionmaker(engine), SecretBox(key)))
    except ValueError as exc:  # a value the store refuses
        fail(str(exc))
    finally:
        await engine.dispose()


def _run(fn: Callable[[ConfigStore], Awaitable[T]]) -> T:
    """Unreachable or unmigrated databases end the command as every command does
    (``jobs.cli.common.fail_on``: the setting and the fix, exit 2)."""
    return run_async(lambda: _with_store(fn))


@config_app.command("set")
def config_set(
    role: str = typer.Argument(..., help="Role id."),
    skill: str = typer.Argument(..., help="Skill name."),
    key: str = typer.Argument(..., help="Config key (--api-token is stored as api_token)."),
    value: str = typer.Argument(
        ..., help="Value; JSON is parsed (5, true, {...}); '-' reads stdin."
    ),
    string: bool = typer.Option(False, "--string", help="Store the value as text, never as JSON."),
) -> None:
    """Set one configuration value for a role's skill."""
    parsed = _value(key, value, string)
    _run(lambda store: store.set(role, skill, key, parsed))
    shown = "••••••" if is_secret_key(key) else json.dumps(parsed, ensure_ascii=False)

    typer.echo(f"{role} / {skill}: {config_key(key)} = {shown}")


@config_app.command("unset")
def config_unset(
    role: str = typer.Argument(..., help="Role id."),
    skill: str = typer.Argument(..., help="Skill name."),
    key: str = typer.Argument(..., help="Config key."),
) -> None:
    """Remove one configuration value."""
    _run(lambda store: store.set(role, skill, key, None))
    typer.echo(f"{role} / {skill}: {key} removed")


@config_app.command("list")
def config_list(
    role: str = typer.Argument(..., help="Role id."),
    skill: str | None = typer.Argument(None, help="Only this skill."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a role's configuration, secrets masked."""
    values: dict[str, dict[str, Any]] = _run(lambda store: store.masked(role, skill))
    if as_json:
        typer.echo(json.dumps(values, ensure_ascii=False, indent=2))
        return
    rows = [(s, k, v) for s, kv in values.items() for k, v in kv.items()]
    if not rows:
        typer.echo(f"no configuration for role {role}" + (f" / {skill}" if skill else ""))
        return

    output.table(
        ("skill", "key", "value"),
        [
            (s, k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))
            for s, k, v in rows
        ],
    )


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
