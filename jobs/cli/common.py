"""Helpers shared by every ``skilljobs`` command module (kept apart from ``jobs.cli.app`` so
command modules can be imported on their own)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import typer

from jobs.settings import Settings

T = TypeVar("T")


def fail(message: str, code: int = 1) -> NoReturn:
    """Exit non-zero with a one-line reason."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def run_async(fn: Callable[[], Awaitable[T]], *, fast_loop: bool = False) -> T:
    """Run ``fn()`` to completion; ``fast_loop``: on uvloop when it is installed (the
    long-running servers: ``skilljobs web`` and ``up``)."""
    factory = _fast_loop_factory() if fast_loop else None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(fn())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _fast_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; not on every platform
        return None
    return uvloop.new_event_loop


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


def with_services(fn: Callable[[Any], Awaitable[T]], *, redis: bool = True) -> T:
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
