"""The root command lists every command from its table and imports a command's module only
when that command runs: what it lists is what the modules register, and ``--help`` imports
none of them."""

from __future__ import annotations

import subprocess
import sys

import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from jobs.cli.app import COMMANDS, LazyGroup, Listed, app

HEAVY = (
    "jobs.services",
    "sqlalchemy",
    "jobs.cli.jobs",
    "jobs.cli.run",
    "jobs.cli.doctor",
    "dashboard.app",
)


def _root() -> LazyGroup:
    root = typer.main.get_command(app)
    assert isinstance(root, LazyGroup)
    return root


def test_the_listed_commands_are_the_registered_ones_with_their_help() -> None:
    root = _root()
    listed = {name: (cmd.help, cmd.hidden) for name, cmd in root.commands.items()}
    assert all(isinstance(cmd, Listed) for cmd in root.commands.values())
    for name in COMMANDS:
        root.load(name)
    assert list(root.commands) == list(COMMANDS)  # no module registers an unlisted name
    for name, cmd in root.commands.items():
        assert not isinstance(cmd, Listed), name
        assert (cmd.help, cmd.hidden) == listed[name], name


def test_a_command_loads_its_module_and_keeps_its_place() -> None:
    root = _root()
    root.load("jobs")
    assert isinstance(root.commands["jobs"], TyperGroup)
    assert not isinstance(root.commands["dispatch"], Listed)  # the same module registers it
    assert isinstance(root.commands["doctor"], Listed)
    assert list(root.commands) == list(COMMANDS)


def test_help_lists_everything_and_unknown_commands_get_suggestions() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output
    result = CliRunner().invoke(app, ["jbos"])
    assert result.exit_code == 2 and "Did you mean 'jobs'?" in result.output


def _imported_after(*args: str) -> set[str]:
    code = (
        "import sys\n"
        "from jobs.cli.app import app\n"
        "try:\n"
        f"    app({list(args)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(out.split("\n")[-2].split())


def test_help_imports_no_command_module() -> None:
    assert _imported_after("--help") == set()
    assert "jobs.cli.doctor" in _imported_after("doctor", "--help")
    found = _imported_after("jobs", "list", "--help")
    assert "jobs.cli.jobs" in found and "jobs.cli.run" not in found
