"""``skilljobs schedules add FILE | list | show ID | run ID | enable ID | disable ID | runs ID |
rerun RUN_ID --from STEP``."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import typer
from rich.console import Console
from rich.table import Table

from chains import schedules
from chains.rerun import rerun_from
from chains.runner import run_chain
from jobs.cli import output
from jobs.cli.common import fail, load_settings, with_services
from jobs.cli.i18n import tr
from jobs.models import ChainRunStatus
from jobs.services import Services

T = TypeVar("T")

console = Console()
schedules_app = typer.Typer(help="Cron-defined chains of skills.", no_args_is_help=True)

# A run that ended this way did its work: the command exits 0.
DONE_WELL = (ChainRunStatus.SUCCEEDED, ChainRunStatus.STOPPED_EMPTY)

STATUS_STYLE = {
    "sent": "green",
    "succeeded": "green",
    "failed": "red",
    "stopped_empty": "yellow",
    "running": "cyan",
    "queued": "blue",
    "skipped": "dim",
    "pending": "dim",
    "missed": "magenta",
}


def _utc(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "-"


def _local(ts: float | None, tz: str) -> str:
    if not ts:
        return "-"
    try:
        return datetime.fromtimestamp(ts, ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M %Z")
    except Exception:
        return _utc(ts)


def _status(value: str | None) -> str:
    if not value:
        return "-"
    style = STATUS_STYLE.get(value, "")
    return f"[{style}]{value}[/{style}]" if style else value


def _read_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        fail(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        fail(f"{path}: cannot parse: {exc}")
    if not isinstance(data, dict):
        fail(f"{path}: a schedule file must hold one mapping (name, cron, steps, …)")
    return data


def _with_services(fn: Callable[[Services], Awaitable[T]], *, redis: bool = True) -> T:
    """``jobs.cli.common.with_services``, a schedule's refusals (unknown id, a change that
    does not validate) ending the command with their one-line reason."""

    async def guarded(svc: Services) -> T:
        try:
            return await fn(svc)
        except LookupError as exc:
            fail(str(exc.args[0] if exc.args else exc))
        except ValueError as exc:
            fail(str(exc))

    return with_services(guarded, redis=redis)


@schedules_app.command("add")
def add(file: Path = typer.Argument(..., help="Schedule file (YAML or JSON).")) -> None:
    """Validate a schedule file and store it."""
    data = _read_file(file)

    async def go(svc: Services) -> None:
        try:
            spec = schedules.validate(data, svc.registry)
        except schedules.ScheduleError as exc:
            for problem in exc.problems:
                typer.secho(f"  - {problem}", fg=typer.colors.RED, err=True)
            fail(f"{file}: {len(exc.problems)} problem(s); nothing stored")
        row = await schedules.create(svc, spec, actor="cli")
        console.print(
            f"schedule [bold]{row.name}[/bold] stored as {row.id}; "
            f"next fire {_local(row.next_fire_at, row.timezone)}"
        )

    _with_services(go, redis=False)


SCHEDULE_SUFFIXES = (".yaml", ".yml", ".json")


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix.lower() in SCHEDULE_SUFFIXES)
        if not found:
            fail(f"{path}: no schedule files (*.yaml, *.yml, *.json) in this folder")
        return found
    if not path.exists():
        fail(f"{path}: no such file or folder")
    return [path]


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 80 or not output.is_terminal() else text[:77] + "…"


@schedules_app.command("apply")
def apply_cmd(
    path: Path = typer.Argument(..., help="A schedule file, or a folder of them."),
    prune: bool = typer.Option(False, "--prune", help="Delete the stored schedules no file names."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only print what would change."),
    as_json: bool = output.JSON_OPT,
) -> None:
    """Make the stored schedules match the files, by name: create, update what differs,
    (with --prune) delete the rest. Running it again changes nothing."""
    files = _files(path)
    raw = [(f, _read_file(f)) for f in files]

    async def go(svc: Services) -> list[dict[str, Any]]:
        specs, bad = [], 0
        for f, data in raw:
            try:
                specs.append(schedules.validate(data, svc.registry))
            except schedules.ScheduleError as exc:
                bad += 1
                for problem in exc.problems:
                    typer.secho(f"  - {f}: {problem}", fg=typer.colors.RED, err=True)
        if bad:
            fail(tr("{n} file(s) with problems; nothing changed", n=bad))
        return await schedules.apply(svc, specs, prune=prune, dry_run=dry_run, actor="cli")

    result = _with_services(go, redis=False)
    if as_json:
        output.print_json({"dry_run": dry_run, "items": result})
        return
    marks = {"create": "+", "update": "~", "unchanged": "=", "delete": "-"}
    for item in result:
        typer.echo(f"{marks[item['action']]} {item['name']} ({tr(item['action'])})")
        for field, (old, new) in item["changes"].items():
            typer.echo(f"    {field}: {_short(old)} -> {_short(new)}")
    done = {"create": "{n} created", "update": "{n} updated", "unchanged": "{n} unchanged"}
    done["delete"] = "{n} deleted"
    counts = {a: sum(i["action"] == a for i in result) for a in marks}
    summary = ", ".join(tr(done[a], n=n) for a, n in counts.items() if n)
    typer.echo((tr("dry run: ") if dry_run else "") + (summary or tr("no schedules")))


@schedules_app.command("delete")
def delete_cmd(
    schedule: str = typer.Argument(..., help="Schedule id or name."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a schedule and its run history."""
    ask = tr("Delete schedule {name} and its run history?", name=schedule)
    if not yes and not typer.confirm(ask):
        fail(tr("nothing done"))

    async def go(svc: Services) -> Any:
        return await schedules.delete(svc, schedule, actor="cli")

    row = _with_services(go, redis=False)
    typer.echo(tr("schedule {name} ({id}) deleted", name=row.name, id=row.id))


@schedules_app.command("list")
def list_cmd(
    upcoming: int = typer.Option(
        1, "--next", "-n", min=1, max=50, help="Upcoming fire times shown."
    ),
    as_json: bool = output.JSON_OPT,
) -> None:
    """Every schedule with its next fire time(s) and last run."""

    async def go(svc: Services) -> tuple[list[Any], dict[str, Any]]:
        return await schedules.list_schedules(svc), await schedules.last_runs(svc)

    rows, last = _with_services(go, redis=False)
    if as_json:
        items = []
        for r in rows:
            item = schedules.to_dict(r, fires=upcoming)
            run = last.get(r.id)
            item["last_run"] = (
                None
                if run is None
                else {"id": run.id, "status": run.status, "fire_at": run.fire_at}
            )
            items.append(item)
        output.print_json({"items": items})
        return
    head = "next fire" if upcoming == 1 else f"next {upcoming} fires"
    cols = ("id", "name", "cron", "timezone", "enabled", head, "last run", "steps")
    table_rows = []
    for r in rows:
        run = last.get(r.id)
        fires = [_local(t, r.timezone) for t in schedules.next_fires(r, upcoming)]
        table_rows.append(
            (
                r.id,
                r.name,
                r.cron or f"at {(r.options or {}).get('at')}",  # a one-shot schedule
                r.timezone,
                "yes" if r.enabled else ("paused" if r.paused_reason else "no"),
                ("\n" if output.is_terminal() else ", ").join(fires) or "-",
                f"{run.status} {_utc(run.fire_at)}" if run else "-",
                len(r.steps or []),
            )
        )
    output.table(cols, table_rows, title=f"{len(rows)} schedule(s)", wrap=(head,))


NEXT_OPT = typer.Option(5, "--next", "-n", min=1, max=50, help="Upcoming fire times to show.")


@schedules_app.command("show")
def show(
    schedule: str = typer.Argument(..., help="Schedule id or name."),
    upcoming: int = NEXT_OPT,
    as_json: bool = output.JSON_OPT,
) -> None:
    """The schedule as stored (JSON), then its next fire times in its timezone and UTC."""

    async def go(svc: Services) -> None:
        row = await schedules.get(svc, schedule)
        if row is None:
            fail(f"no schedule {schedule!r}")
            return
        body = schedules.to_dict(row, fires=upcoming)
        if as_json:
            output.print_json(body)
            return
        console.print_json(json.dumps(body, ensure_ascii=False, default=str))
        fires = schedules.next_fires(row, upcoming)
        if not fires:
            console.print("next fires: none (disabled)")
        else:
            console.print(f"next {len(fires)} fire(s):")
            for ts in fires:
                console.print(f"  {_local(ts, row.timezone)}  ({_utc(ts)})")

    _with_services(go, redis=False)


def _toggle(schedule: str, enabled: bool) -> None:
    async def go(svc: Services) -> None:
        row = await schedules.set_enabled(svc, schedule, enabled, actor="cli")
        state = (
            f"enabled; next fire {_local(row.next_fire_at, row.timezone)}"
            if enabled
            else "disabled"
        )
        console.print(f"schedule [bold]{row.name}[/bold] {state}")
        if not enabled and row.paused_reason:
            console.print(f"  {row.paused_reason}")

    _with_services(go, redis=False)


@schedules_app.command("enable")
def enable(schedule: str = typer.Argument(..., help="Schedule id or name.")) -> None:
    """Enable a schedule (fire times missed while disabled are not run)."""
    _toggle(schedule, True)


@schedules_app.command("disable")
def disable(schedule: str = typer.Argument(..., help="Schedule id or name.")) -> None:
    """Disable a schedule."""
    _toggle(schedule, False)


@schedules_app.command("run")
def run(
    schedule: str = typer.Argument(..., help="Schedule id or name."),
    inline: bool = typer.Option(
        False, "--inline", help="Run the chain in this process instead of queueing it."
    ),
) -> None:
    """Start a run now (queued for the workers, or --inline here)."""

    async def go(svc: Services) -> int:
        if not inline:
            run_id = await schedules.trigger_manual(svc, schedule, actor="cli")
            console.print(f"run {run_id} queued")
            return 0

        run_id = await schedules.trigger_manual(svc, schedule, actor="cli", enqueue=False)
        executor = svc.executor
        try:
            with console.status(f"run {run_id}: running"):
                status = await run_chain(svc, executor, run_id, worker_id=f"cli:{time.time_ns()}")
        finally:
            await executor.aclose()
        _print_run(await schedules.get_run(svc, run_id))
        return 0 if status in DONE_WELL else 1

    settings = load_settings()
    if not inline and not settings.redis_url:
        fail("SKILLJOBS_REDIS_URL is not set: nothing can pick a queued run up; use --inline")
    code = _with_services(go, redis=not inline)
    raise typer.Exit(code)


def _print_run(run: dict[str, Any] | None) -> None:
    if run is None:
        return
    console.print(
        f"run {run['id']}: {_status(run['status'])} (fire {_utc(run['fire_at'])}, "
        f"{run.get('trigger', '')})"
    )
    if run.get("error"):
        console.print(f"  {run['error']}")
    delivery = (run.get("result") or {}).get("delivery")
    if delivery:
        why = f" — {delivery['error']}" if delivery.get("error") else ""
        console.print(f"  delivery to {delivery['recipient']}: {_status(delivery['status'])}{why}")
    table = Table()
    for col in ("#", "step", "skill", "status", "ms", "error / output"):
        table.add_column(col, overflow="fold")
    for s in run["steps"]:
        detail = s["error"] or json.dumps(s["output"], ensure_ascii=False, default=str)[:160]
        ms = f"{s['duration_ms']:.0f}" if s.get("duration_ms") is not None else "-"
        table.add_row(str(s["index"]), s["id"], s["skill"], _status(s["status"]), ms, detail)
    if run["steps"]:
        console.print(table)


@schedules_app.command("runs")
def runs(
    schedule: str = typer.Argument(..., help="Schedule id or name."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, max=500),
    run_id: str = typer.Option("", "--run", help="Show one run with its steps."),
    as_json: bool = output.JSON_OPT,
) -> None:
    """Recent runs of a schedule, newest first."""

    async def go(svc: Services) -> None:
        if run_id:
            got = await schedules.get_run(svc, run_id)
            if got is None:
                fail(f"no chain run {run_id!r}")
            if as_json:
                output.print_json(got)
            else:
                _print_run(got)
            return
        items = await schedules.list_runs(svc, schedule, limit=limit)
        if as_json:
            output.print_json({"items": items})
            return
        cols = ("run", "trigger", "fire time", "status", "steps", "finished", "error")
        rows = [
            (
                r["id"],
                r["trigger"],
                _utc(r["fire_at"]),
                r["status"],
                " ".join(s["status"] for s in r["steps"]) or "-",
                _utc(r["finished_at"]),
                r["error"] or "",
            )
            for r in items
        ]
        output.table(cols, rows, title=f"runs of {schedule} (newest first)", wrap=("error",))

    _with_services(go, redis=False)


@schedules_app.command("rerun")
def rerun(
    run_id: str = typer.Argument(..., help="The chain run to re-run."),
    from_step: str = typer.Option("0", "--from", help="Step index or step id to start at."),
    inline: bool = typer.Option(
        False, "--inline", help="Run the chain in this process instead of queueing it."
    ),
) -> None:
    """A new run from a step, reusing the recorded outputs of the earlier steps."""
    step: int | str = int(from_step) if from_step.isdigit() else from_step

    async def go(svc: Services) -> int:
        new_id, _ = await rerun_from(svc, run_id, step, actor="cli", enqueue=not inline)
        if not inline:
            console.print(f"run {new_id} queued (re-run of {run_id} from step {from_step})")
            return 0
        return await _run_inline(svc, new_id)

    settings = load_settings()
    if not inline and not settings.redis_url:
        fail("SKILLJOBS_REDIS_URL is not set: nothing can pick a queued run up; use --inline")
    raise typer.Exit(_with_services(go, redis=not inline))


async def _run_inline(svc: Services, run_id: str) -> int:
    executor = svc.executor
    try:
        with console.status(f"run {run_id}: running"):
            status = await run_chain(svc, executor, run_id, worker_id=f"cli:{time.time_ns()}")
    finally:
        await executor.aclose()
    _print_run(await schedules.get_run(svc, run_id))
    return 0 if status in DONE_WELL else 1


def register(app: typer.Typer) -> None:
    app.add_typer(schedules_app, name="schedules")
