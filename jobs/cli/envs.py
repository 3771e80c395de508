"""``skilljobs skills prepare``: build the dependency environments of skills ahead of time,
and the environment state ``skills list`` / ``skills check`` show."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from jobs.cli.checks import Check
    from jobs.execution.envs import EnvManager, EnvSpec
    from jobs.skill import Skill


def manager(settings: Any) -> EnvManager:
    from jobs.execution.envs import EnvManager

    return EnvManager.from_settings(settings)


def env_state(skill: Skill, envs: EnvManager | None) -> str:
    """``-`` (nothing to install), ``ready (requirements.txt)``, ``missing (…)``, ``invalid: …``."""
    from jobs.execution.envs import BuildFailed, spec_for

    if envs is None:
        return "-"
    try:
        spec = spec_for(skill)
    except BuildFailed as exc:
        return f"invalid: {exc}"
    if spec is None:
        return "-"
    return f"{'ready' if envs.is_ready(spec) else 'missing'} ({spec.source})"


def fanout_names(skill: Skill) -> list[str]:
    """The tool names a skill's ``cli_commands`` fan out as: ``<skill>__<sub>``."""
    from jobs.skill import FANOUT_SEP, MAX_FANOUT

    if not skill.runnable or not 1 <= len(skill.cli_commands) <= MAX_FANOUT:
        return []
    return [f"{skill.name}{FANOUT_SEP}{sub}" for sub in skill.cli_commands]


def skill_at(folder: Path) -> Skill | None:
    from jobs.catalog.loader import load_skill

    try:
        return load_skill(folder)
    except Exception:  # preflight reports why the folder does not load
        return None


def prepare(
    names: list[str] | None = typer.Argument(
        None, help="Skills to prepare (default: every skill that declares dependencies)."
    ),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build again even when ready."),
) -> None:
    """Build the environments of skills with PEP 723 blocks, requirements.txt, pyproject
    dependencies or package.json + lockfile (workers otherwise build them on first use)."""
    import shutil

    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from jobs.catalog.loader import load_registry
    from jobs.cli.common import fail, load_settings
    from jobs.execution.envs import BuildFailed, spec_for

    settings = load_settings()
    registry = load_registry(settings.skill_dirs)
    unknown = [n for n in names or [] if n not in registry]
    if unknown:
        fail(f"unknown skill(s): {', '.join(unknown)} (see `skilljobs skills list`)")
    chosen = [s for s in registry if s.runnable and (not names or s.name in names)]
    envs = manager(settings)
    todo: list[tuple[Skill, EnvSpec | None]] = []
    console = Console(highlight=False)
    for skill in chosen:
        try:
            spec = spec_for(skill)
        except BuildFailed as exc:
            console.print(f"[red]✗[/red] {skill.name}: {exc}")
            todo.append((skill, None))
            continue
        if spec is not None:
            todo.append((skill, spec))
    if not todo:
        console.print("No skill declares dependencies: nothing to prepare.")
        return
    failed = sum(spec is None for _, spec in todo)
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("preparing environments", total=len(todo))
        for skill, spec in todo:
            if spec is None:
                bar.advance(task)
                continue
            bar.update(task, description=f"{skill.name} ({spec.source})")
            path = envs.path_of(spec)
            try:
                if rebuild and path.exists():
                    shutil.rmtree(path)
                    envs.forget(spec)
                was_ready = envs.is_ready(spec)
                envs.build(spec)
                word = "ready" if was_ready else "built"
                bar.console.print(f"[green]✓[/green] {skill.name}: {word} ({spec.source})")
            except BuildFailed as exc:
                failed += 1
                bar.console.print(f"[red]✗[/red] {skill.name}: {exc}")
            bar.advance(task)
    if failed:
        raise typer.Exit(1)


def register(skills_app: typer.Typer) -> None:
    skills_app.command("prepare")(prepare)


def check_skill_envs(
    settings: Any, ok: Callable[[str, str], Check], warn: Callable[[str, str, str], Check]
) -> Check | None:
    """``doctor``: whether the skills' dependency environments are built (a missing one is
    built by the worker on first use, so it is a warning, not a failure). ``ok``/``warn``
    are the report's constructors (jobs.cli.checks)."""
    from jobs.catalog.loader import load_registry

    name = "skill environments"
    try:
        registry = load_registry(settings.skill_dirs)
    except Exception:  # the skills check reports why
        return None
    envs = manager(settings)
    states = {s.name: env_state(s, envs) for s in registry if s.runnable}
    declared = {n: st for n, st in states.items() if st != "-"}
    if not declared:
        return ok(name, "no skill declares dependencies")
    if envs.uv is None:
        note = "uv not installed: venv + pip builds them (slower)"
    else:
        note = "built with uv"
    pending = sorted(n for n, st in declared.items() if not st.startswith("ready"))
    if pending:
        return warn(
            name,
            f"{len(pending)} of {len(declared)} not built yet: {', '.join(pending[:10])}; {note}",
            "run `skilljobs skills prepare` (a worker otherwise builds them on first use)",
        )
    return ok(name, f"{len(declared)} ready under {envs.root}; {note}")
