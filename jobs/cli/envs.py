"""``skilljobs skills prepare``: build the dependency environments of skills ahead of time,
and the environment state ``skills list`` / ``skills check`` show; ``skilljobs envs
list|prune``: what is on disk, and its cleanup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer

from jobs.catalog.loader import load_registry, load_skill
from jobs.cli.common import fail, load_settings
from jobs.execution import env_store
from jobs.execution.env_store import Policy, remove
from jobs.execution.envs import BuildFailed, EnvManager, EnvSpec, cleanup, declared, spec_for
from jobs.settings import Settings
from jobs.skill import FANOUT_SEP, MAX_FANOUT, Skill

C = TypeVar("C")  # a line of the doctor's report (``jobs.cli.checks.Check``)


def manager(settings: Settings) -> EnvManager:
    return EnvManager.from_settings(settings)


def env_state(skill: Skill, envs: EnvManager | None) -> str:
    """``-`` (nothing to install), ``ready (requirements.txt)``, ``missing (…)``, ``invalid: …``."""
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

    if not skill.runnable or not 1 <= len(skill.cli_commands) <= MAX_FANOUT:
        return []
    return [f"{skill.name}{FANOUT_SEP}{sub}" for sub in skill.cli_commands]


def skill_at(folder: Path) -> Skill | None:
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
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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
                    if not remove(envs.root, spec.dirname):
                        raise BuildFailed(
                            "a running job uses it (or it is being built); not rebuilt"
                        )
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


def register_prepare(skills_app: typer.Typer) -> None:
    skills_app.command("prepare")(prepare)


# --- skilljobs envs list | prune ---------------------------------------------------------

envs_app = typer.Typer(
    help="The skills' dependency environments under <data dir>/envs: list, clean up.",
    no_args_is_help=True,
)


def _mb(size: int) -> str:
    return f"{size / (1 << 20):,.1f} MB"


@envs_app.command("list")
def list_envs(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Each environment: what declared it, its size, when a run last used it, which skills
    declare it and whether a running job holds it now."""
    import json
    import time

    from rich.console import Console
    from rich.table import Table

    settings = load_settings()
    root = manager(settings).root
    registry = load_registry(settings.skill_dirs)
    users = {s.name: declared([s]) for s in registry if s.runnable}
    now = time.time()
    rows = []
    for env in reversed(env_store.scan(root)):  # most recently used first
        row = env.to_dict(now=now, in_use=env_store.in_use(root, env.name))
        row["skills"] = sorted(n for n, names in users.items() if env.name in names)
        rows.append(row)
    if as_json:
        typer.echo(json.dumps({"root": str(root), "items": rows}, indent=1))
        return
    table = Table("name", "source", "size", "unused", "state", "skills", title=str(root))
    for r in rows:
        state = "in use" if r["in_use"] else ("ready" if r["ready"] else "incomplete")
        table.add_row(
            r["name"],
            r["source"] or "-",
            _mb(r["size_bytes"]),
            f"{r['unused_days']:g} d",
            state,
            ", ".join(r["skills"]) or "- (none declares it)",
        )
    Console(highlight=False).print(table)


@envs_app.command("prune")
def prune_envs(
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would go; remove nothing."),
    older_than: float | None = typer.Option(
        None, "--older-than", help="Days unused (default SKILLJOBS_SKILL_ENV_RETENTION_DAYS)."
    ),
    max_size: float | None = typer.Option(
        None, "--max-size", help="MB all may take (default SKILLJOBS_SKILL_ENV_MAX_MB)."
    ),
) -> None:
    """Remove environments no run used for a while, ones no skill declares any more,
    half-built ones, and the least recently used beyond the size cap — never one a running
    job uses."""
    from dataclasses import replace

    settings = load_settings()
    policy = Policy.from_settings(settings)
    if older_than is not None:
        policy = replace(policy, max_age_days=older_than if older_than > 0 else None)
    if max_size is not None:
        policy = replace(policy, max_bytes=int(max_size * (1 << 20)) if max_size > 0 else None)
    report = cleanup(settings, dry_run=dry_run, policy=policy)
    verb = "would remove" if dry_run else "removed"
    for env, why in report.removed:
        typer.echo(f"{verb} {env.name} ({env.source or env.kind}, {_mb(env.size)}): {why}")
    for name in report.in_use:
        typer.echo(f"kept {name}: a running job uses it (or it is being built)")
    typer.echo(
        f"{verb} {len(report.removed)} environments, {_mb(report.freed)}; "
        f"{report.kept} kept ({_mb(report.size_before - report.freed)})"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(envs_app, name="envs")


def check_skill_envs(
    settings: Settings, ok: Callable[[str, str], C], warn: Callable[[str, str, str], C]
) -> C | None:
    """``doctor``: whether the skills' dependency environments are built (a missing one is
    built by the worker on first use, so it is a warning, not a failure). ``ok``/``warn``
    are the report's constructors (jobs.cli.checks)."""
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
