"""Helpers shared by every ``skilljobs`` command module (kept apart from ``jobs.cli.app`` so
command modules can be imported on their own)."""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import typer

from jobs.cli.errors import explain
from jobs.cli.i18n import tr
from jobs.cli.invocation import invocation
from jobs.cli.state import apply_state
from jobs.services import Services
from jobs.settings import Settings

T = TypeVar("T")


def debug_enabled() -> bool:
    return invocation.debug or os.environ.get("SKILLJOBS_DEBUG", "") not in ("", "0", "false")


def fail(message: str, code: int = 1) -> NoReturn:
    """Exit non-zero with a one-line reason."""
    typer.secho(f"{tr('error: ')}{message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def fail_on(exc: BaseException) -> NoReturn:
    """End the command on ``exc``: a service's failure in one or two lines naming the
    setting and the fix (exit 2); anything else as its one-line reason (exit 1). With
    ``--debug`` the traceback is printed first."""

    if debug_enabled():
        traceback.print_exception(exc)
    found = explain(exc, invocation.settings)
    if found is None:
        text = str(exc).strip().splitlines()
        hint = "" if debug_enabled() else tr(" (--debug shows the traceback)")
        fail(f"{type(exc).__name__}: {text[0] if text else ''}{hint}")
    typer.secho(f"{tr('error: ')}{found.message}", fg=typer.colors.RED, err=True)
    typer.echo(f"{tr('  fix: ')}{found.fix}", err=True)
    raise typer.Exit(found.code)


def run_async(fn: Callable[[], Awaitable[T]], *, fast_loop: bool = False) -> T:
    """Run ``fn()`` to completion; ``fast_loop``: on uvloop when it is installed (the
    long-running servers: ``skilljobs web`` and ``up``). A service that cannot be reached
    ends the command with a short explanation (:func:`fail_on`)."""
    factory = _fast_loop_factory() if fast_loop else None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(fn())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (typer.Exit, typer.Abort, SystemExit):
        raise
    except Exception as exc:
        fail_on(exc)


def _fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; not on every platform
        return None
    return uvloop.new_event_loop


def load_settings() -> Settings:
    """The settings from the environment (and ``.env``), completed from the state file a
    running ``skilljobs up`` left in the data dir (``jobs.cli.state``)."""
    from pydantic import ValidationError

    try:
        settings = apply_state(Settings())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'SKILLJOBS_' + str(e['loc'][0]).upper() if e['loc'] else 'settings'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        fail(tr("invalid settings: {problems}", problems=problems), code=2)
    except Exception as exc:
        fail(f"invalid settings: {exc}", code=2)
    invocation.settings = settings
    return settings


async def open_services(
    settings: Settings, *, redis: bool = True, redis_retries: int = 1
) -> Services:
    """The services of a command; ``redis_retries``: a command answers at once when Redis
    is not there."""
    invocation.settings = settings
    try:
        return await Services.open(settings, redis=redis, redis_retries=redis_retries)
    except Exception as exc:
        fail_on(exc)


def with_services(fn: Callable[[Services], Awaitable[T]], *, redis: bool = True) -> T:
    """The body of most commands: settings from the environment, the services opened,
    ``fn(services)`` run, the services closed whatever happens."""
    settings = load_settings()

    async def _go() -> T:
        svc = await open_services(settings, redis=redis)
        try:
            return await fn(svc)
        finally:
            await svc.close()

    return run_async(_go)
