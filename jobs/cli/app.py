"""The ``skilljobs`` command line. Sub-command groups live next to what they operate on; the
root lists them all but imports a group's module only when that group runs, so
``skilljobs --help`` and ``skilljobs jobs list --help`` load one module at most."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import typer

# typer vendors click: these are the types TyperGroup's methods take.
from typer._click import Command, Context
from typer.core import TyperCommand, TyperGroup

from jobs.cli.invocation import invocation


class Registers(Protocol):
    """A command module: it adds its commands (or its group) to the root."""

    def register(self, app: typer.Typer) -> None: ...


# One loader per command module (``skills`` registers ``envs`` too, ``doctor`` the ``db``
# its fixes name). Each imports its module only when one of its commands runs (or shows
# its own help): the modules import the database, Redis and the queue.


def _jobs() -> Registers:
    from jobs.cli import jobs  # lazy: the dispatcher, the job store and the dashboard's JSON

    return jobs


def _run() -> Registers:
    from jobs.cli import run  # lazy: the worker, the web app and the embedded Redis

    return run


def _doctor() -> Registers:
    from jobs.cli import doctor  # lazy: every service a check connects to, the migrations

    return doctor


def _prune() -> Registers:
    from jobs.cli import prune  # lazy: the pruning queries over every table

    return prune


def _skills() -> Registers:
    from jobs.cli import skills  # lazy: the skill catalog, its environments and the services

    return skills


def _config() -> Registers:
    from jobs.cli import config  # lazy: the encrypted config store and the database

    return config


def _incidents() -> Registers:
    from jobs.cli import incidents  # lazy: the services and the incident queries

    return incidents


def _limits() -> Registers:
    from jobs.cli import limits  # lazy: the services and the rate limiter

    return limits


def _schedules() -> Registers:
    from chains import cli  # lazy: the chains, their runner and the services

    return cli


def _deliveries() -> Registers:
    from jobs.cli import deliveries  # lazy: delivery's custody and its channels

    return deliveries


def _workers() -> Registers:
    from jobs.cli import workers  # lazy: the services and the worker controls

    return workers


# Every command of the root in the order ``--help`` lists them: the loader of the module
# that registers it, and the help ``--help`` shows (the module's own, which a test checks).
COMMANDS: dict[str, tuple[Callable[[], Registers], str]] = {
    "dispatch": (
        _jobs,
        "Call a skill the way the chat layer does: a receipt for background jobs, the result "
        "otherwise.",
    ),
    "worker": (_run, "Run an arq worker (and the chain scheduler) against SKILLJOBS_REDIS_URL."),
    "web": (_run, "Serve the dashboard, the JSON API and /metrics."),
    "up": (
        _run,
        "Everything in one process tree: embedded Redis and SQLite unless URLs are set,\n"
        "migrations, the demo schedule, the web app, and a worker with the scheduler (a child\n"
        "process, started again if it exits). Leaves ``state.json`` in the data dir, where "
        "every\nother command finds this instance.",
    ),
    "doctor": (
        _doctor,
        "Check settings, database, migrations, Redis, skills, channels and notify targets.",
    ),
    "prune": (
        _prune,
        "Delete finished jobs, chain runs, messages, workspace files and skill environments\n"
        "past their retention.",
    ),
    "db": (_doctor, "Database schema (alembic migrations)."),
    "skills": (_skills, "Skill folders: list what loaded, check new ones."),
    "envs": (
        _skills,
        "The skills' dependency environments under <data dir>/envs: list, clean up.",
    ),
    "config": (_config, "Per-role skill configuration (secrets stored encrypted)."),
    "jobs": (_jobs, "Look at and act on jobs."),
    "incidents": (_incidents, "Failures grouped by signature."),
    "limits": (_limits, "Start-rate and concurrency limits per skill, org or role."),
    "schedules": (_schedules, "Cron-defined chains of skills."),
    "deliveries": (
        _deliveries,
        "Deliveries: list unknown/failed ones, send one again, or dismiss it.",
    ),
    "workers": (_workers, "Worker processes: pause, resume, drain."),
}


class Listed(TyperCommand):
    """A command as the root lists it before its module is imported: name and help only."""


class LazyGroup(TyperGroup):
    """The root command: it lists every command of :data:`COMMANDS` and puts the real
    commands of a module in place the first time one of them is resolved."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, (_, text) in COMMANDS.items():
            self.commands.setdefault(name, Listed(name, help=text))

    def resolve_command(
        self, ctx: Context, args: list[str]
    ) -> tuple[str | None, Command | None, list[str]]:
        if args and args[0] in COMMANDS:
            self.load(args[0])
        return super().resolve_command(ctx, args)

    def load(self, name: str) -> None:
        """Import the module registering ``name`` and take its commands."""
        if not isinstance(self.commands[name], Listed):
            return
        found = typer.Typer()
        COMMANDS[name][0]().register(found)
        self.commands.update(typer.main.get_group(found).commands)


app = typer.Typer(
    name="skilljobs",
    help="Background jobs, chains and delivery for chat-platform skills.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyGroup,
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


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
