"""``skilljobs skills list|check``: what is installed, and whether a skill folder is fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.catalog.loader import load_registry, skill_folders
from jobs.catalog.preflight import Finding, check_skill_dir, has_errors
from jobs.cli import envs
from jobs.cli.common import fail, load_settings, run_async, with_services
from jobs.cli.envs import env_state, fanout_names, manager, register_prepare, skill_at
from jobs.cli.i18n import tr
from jobs.execution.envs import EnvManager
from jobs.execution.sandbox import run_mode
from jobs.execution.subproc import passthrough_for
from jobs.queue import pauses
from jobs.queue.pauses import peek
from jobs.services import Services
from jobs.settings import Settings
from jobs.skill import Skill, SkillRegistry

skills_app = typer.Typer(
    help="Skill folders: list what loaded, check new ones.", no_args_is_help=True
)


def _wall(skill: Skill) -> str:
    if skill.wall_sec is not None:
        return f"{skill.effective_wall_sec():g}s"
    return f"{skill.effective_wall_sec():g}s (default)"


def _row(skill: Skill, envs: EnvManager | None = None) -> dict[str, object]:
    return {
        "name": skill.name,
        "skill_type": skill.skill_type.value,
        "exec_type": skill.exec_type.value,
        "async": skill.is_async,
        "wall_sec": skill.effective_wall_sec(),
        "category": skill.category,
        "builtin": skill.builtin,
        "path": str(skill.path),
        "cli_reason": skill.cli_reason or None,
        "hint": skill.hint or None,
        "error": skill.error,
        "warnings": list(skill.warnings),
        "env": env_state(skill, envs),
        **run_as(skill),
        "tools": fanout_names(skill),
    }


def run_as(skill: Skill, settings: Settings | None = None) -> dict[str, object]:
    """How the skill runs: ``sandboxed`` or ``trusted``, why, and the host variables the
    operator hands it (SKILLJOBS_SKILL_ENV_PASSTHROUGH)."""
    settings = settings or load_settings()
    mode, why = run_mode(skill, settings)
    return {
        "sandbox": mode,
        "sandbox_reason": why,
        "host_env": list(passthrough_for(settings.skill_env_passthrough, skill.name)),
    }


DEMO_SKILL = "sales_report"


def try_it(registry: SkillRegistry | None, exe: str, curl: str) -> list[str]:
    """The banner's "try it" lines, for a skill that is actually loaded: the bundled async
    demo when present, else a loaded async skill, else any runnable one (sync)."""
    skills = [s for s in (registry or []) if s.runnable and not s.builtin]
    demo = next((s for s in skills if s.name == DEMO_SKILL), None)
    pick = demo or next((s for s in skills if s.is_async), None) or next(iter(skills), None)
    if pick is None:
        return ["No runnable skill is loaded: check SKILLJOBS_SKILLS_PATH (skilljobs skills list)."]
    data = '{"seconds": 2}' if pick is demo else "{}"
    if pick.is_async:
        return [
            f"Try it — dispatch {pick.name} from an orgdeleg web session and watch the",
            "result arrive in that session:",
            f"  {exe} dispatch {pick.name} --input '{data}' --channel web "
            "--session demo --external-id orgdeleg:demo --role demo --wait",
            f"  {curl}/api/v1/sessions/demo/messages",
        ]
    return [
        f"Try it — run {pick.name} (it answers at once):",
        f"  {exe} dispatch {pick.name} --input '{data}' --channel web --session demo --role demo",
    ]


@skills_app.command("list")
def list_skills(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Every skill folder found in SKILLJOBS_SKILLS_PATH, with its load status."""
    settings = load_settings()
    registry = load_registry(settings.skill_dirs)
    envs = manager(settings)
    paused = run_async(lambda: peek(settings))  # None: Redis not configured or not there
    if as_json:
        items = [_row(s, envs) | {"paused": None if paused is None else s.name in paused}
                 for s in registry]  # fmt: skip
        typer.echo(json.dumps({"items": items, "problems": registry.problems}, indent=2))
        return
    probe = Console()
    # Piped output has no terminal width: keep rows on one line for grep/less.
    console = probe if probe.is_terminal else Console(width=200)
    table = Table(title=f"{len(registry)} skills", show_lines=False)
    for col in ("name", "type", "exec", "async", "wall clock", "category", "env"):
        table.add_column(col, no_wrap=True)
    table.add_column("status", overflow="fold")
    for s in registry:
        if s.error:
            status = f"[red]error:[/red] {s.error}"
        elif s.warnings:
            status = f"[yellow]loaded, {len(s.warnings)} warning(s)[/yellow]"
        else:
            status = "[green]loaded[/green]"
        if s.hint and not s.error:
            status += f" — {s.hint}"
        if paused and s.name in paused:
            status = f"[yellow]paused[/yellow] ({status})"
        name = f"{s.name} [dim](built-in)[/dim]" if s.builtin else s.name
        table.add_row(
            name,
            s.skill_type.value,
            f"{s.exec_type.value} ({s.cli_reason})" if s.cli_reason else s.exec_type.value,
            "yes" if s.is_async else "no",
            _wall(s),
            s.category,
            env_state(s, envs),
            status,
        )
        for tool in fanout_names(s):  # cli_commands: one tool per subcommand
            table.add_row(f"  ↳ {tool}", "", "subcommand", "", "", "", "", "")
    console.print(table)
    for problem in registry.problems:
        console.print(f"[yellow]warning:[/yellow] {problem}")
    errors = len(registry.errors())
    if errors:
        console.print(f"{errors} skill(s) failed to load; run `skilljobs skills check` for details")


@skills_app.command("check")
def check(
    directory: Path | None = typer.Argument(
        None, help="A skill folder or a folder of skill folders (default: all skill folders)."
    ),
) -> None:
    """Install preflight: exit 1 when any skill has an error."""
    if directory is not None:
        if not directory.is_dir():
            fail(f"{directory} is not a folder")
        roots = [directory]
    else:
        roots = load_settings().skill_dirs
    settings = load_settings()
    envs = manager(settings)
    console = Console(highlight=False)
    findings: list[Finding] = []
    for root in roots:
        found = check_skill_dir(root)
        findings += found
        names = [f.name for f in skill_folders(root)] if root.is_dir() else [root.name]
        for name in names:
            mine = [f for f in found if f.skill == name]
            errs = [f for f in mine if f.level == "error"]
            mark = "[red]✗[/red]" if errs else "[green]✓[/green]"
            console.print(f"{mark} {name}")
            skill = skill_at(root / name if (root / name).is_dir() else root)
            if skill is not None and env_state(skill, envs) != "-":
                console.print(f"    env: {env_state(skill, envs)}")
            if skill is not None:
                how = run_as(skill, settings)
                console.print(f"    runs: {how['sandbox']} ({how['sandbox_reason']})")
                host = how["host_env"]
                if isinstance(host, list) and host:
                    console.print(
                        f"    host variables: {', '.join(host)} (SKILLJOBS_SKILL_ENV_PASSTHROUGH)"
                    )
            for f in mine:
                color = "red" if f.level == "error" else "yellow"
                console.print(f"    [{color}]{f.level}:[/{color}] {f.message}", soft_wrap=True)
        for f in found:
            if f.skill not in names:
                console.print(f"[red]error:[/red] {f.message}")
    n_err = sum(f.level == "error" for f in findings)
    n_warn = len(findings) - n_err
    console.print(f"{n_err} error(s), {n_warn} warning(s)")
    if has_errors(findings):
        raise typer.Exit(1)


def _pause_action(name: str, pause: bool) -> None:

    async def _go(svc: Services) -> dict[str, Any]:
        try:
            fn = pauses.pause if pause else pauses.resume
            return await fn(svc, name, actor="cli")
        except LookupError as exc:
            fail(str(exc.args[0] if exc.args else exc))

    done = with_services(_go)

    if pause:
        typer.echo(
            tr(
                "{name}: paused — workers take none of its jobs (they stay queued) until "
                "`skilljobs skills resume {name}`",
                name=name,
            )
        )
    else:
        n = done.get("requeued", 0)
        msg = "{name}: resumed — workers take its jobs again ({n} waiting put back)"
        typer.echo(tr(msg, name=name, n=n))


@skills_app.command("pause")
def pause_skill(name: str = typer.Argument(..., help="Skill name.")) -> None:
    """Stop workers claiming this skill's jobs: they stay queued (running ones finish)."""
    _pause_action(name, True)


@skills_app.command("resume")
def resume_skill(name: str = typer.Argument(..., help="Skill name.")) -> None:
    """Let workers claim this skill's jobs again, in the order they were queued."""
    _pause_action(name, False)


def register(app: typer.Typer) -> None:
    app.add_typer(skills_app, name="skills")
    envs.register(app)  # `envs`: the environments of the skills listed here


register_prepare(skills_app)  # `skills prepare`
