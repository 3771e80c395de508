"""``skilljobs dispatch``, ``skilljobs jobs list|show|retry|cancel`` (one job, or every
job a filter matches: ``jobs retry --status failed --skill X --since 2h [--dry-run]``) and
``skilljobs incidents list|ack``."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from jobs.cli.common import fail, load_settings, open_services, run_async

console = Console()
jobs_app = typer.Typer(help="Look at and act on jobs.", no_args_is_help=True)


def _ts(value: float | None) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _parse_json(raw: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        fail(f"{what} is not valid JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(data, dict):
        fail(f"{what} must be a JSON object")
    return data


def dispatch(
    skill: str = typer.Argument(..., help="Skill name."),
    input: str = typer.Option("{}", "--input", "-i", help="Input as a JSON object."),
    channel: str = typer.Option("web", "--channel", "-c", help="Originating channel."),
    session: str = typer.Option("", "--session", help="Chat session id."),
    actor_key: str = typer.Option("", "--actor-key", help="Recipient on third-party channels."),
    external_id: str = typer.Option("", "--external-id", help="Session external id (orgdeleg:…)."),
    role: str = typer.Option("", "--role", help="Role id (selects skill configs, workspace)."),
    org: str = typer.Option("", "--org", help="Org id."),
    wait: bool = typer.Option(
        False, "--wait", help="For a background job: wait and print the outcome."
    ),
    timeout: float = typer.Option(1800.0, "--timeout", help="How long --wait waits (seconds)."),
    idempotency_key: str = typer.Option(
        "", "--idempotency-key", help="Same key within 24 h: the same background job."
    ),
    priority: int | None = typer.Option(
        None, "--priority", min=0, max=9, help="Queue priority: 0 first, 9 last (default 3)."
    ),
) -> None:
    """Call a skill the way the chat layer does: a receipt for background jobs, the result otherwise."""
    data = _parse_json(input, "--input")
    context = {
        "channel": channel,
        "session_id": session,
        "actor_key": actor_key,
        "role_id": role,
        "org_id": org,
        "triggered_at": time.time(),
    }
    settings = load_settings()

    async def _go() -> int:
        from jobs.queue.dispatcher import Dispatcher

        svc = await open_services(settings)
        try:
            res = await Dispatcher(svc).dispatch(
                skill,
                data,
                context,
                external_id or None,
                idempotency_key or None,
                priority=priority,
            )
            console.print_json(json.dumps(res.body, ensure_ascii=False, default=str))
            if res.status_code >= 400:
                return 1
            if res.is_async and wait:
                return await _wait(svc, res.body["job_id"], timeout)
            return 0 if res.body.get("ok", True) is not False else 1
        finally:
            await svc.close()

    raise typer.Exit(run_async(_go))


async def _wait(svc: Any, job_id: str, limit: float) -> int:
    from jobs.models import FINAL_STATUSES
    from jobs.queue.store import get_job

    deadline = time.monotonic() + limit
    last = ""
    with console.status(f"job {job_id}: queued") as status:
        while time.monotonic() < deadline:
            job = await get_job(svc.sessionmaker, job_id)
            if job is None:
                fail(f"job {job_id} disappeared")
                return 1
            if job.status != last:
                last = job.status
                status.update(f"job {job_id}: {job.status} (attempt {job.attempts})")
            if job.status in FINAL_STATUSES:
                break
            await asyncio.sleep(0.2)
        else:
            fail(f"gave up waiting after {limit:.0f}s; the job is still {last}")
            return 1
    _print_job(svc, job)
    return 0 if job.status == "succeeded" else 1


def _print_job(svc: Any, job: Any) -> None:
    from jobs.envelope import is_partial

    console.print(f"[bold]{job.id}[/]  {job.skill}  [bold]{job.status}[/]  attempts={job.attempts}")
    phase = job.current_phase()
    if phase is not None:  # e.g. preparing environment (requirements.txt) since 12:01:02
        detail = f" ({phase['detail']})" if phase["detail"] else ""
        console.print(f"phase: [yellow]{phase['name']}[/]{detail} since {_ts(phase['since'])}")
    console.print(
        f"origin: channel={job.channel or '-'} session={job.session_id or '-'} "
        f"actor_key={job.actor_key or '-'} role={job.role_id or '-'}"
    )
    console.print(
        f"created {_ts(job.created_at)}  started {_ts(job.started_at)}  "
        f"finished {_ts(job.finished_at)}"
    )
    if job.error:
        console.print(f"[red]error[/] ({job.error_type or '-'}): {job.error}")
    if is_partial(job.result):
        console.print("[yellow]partial result[/]")
    if job.result is not None:
        # results are data (scrubbed of the job's secret values when it ran), C12
        console.print_json(json.dumps(job.result, ensure_ascii=False, default=str))


@jobs_app.command("list")
def list_jobs(
    status: str = typer.Option("", "--status", "-s", help="queued, running, succeeded, failed, …"),
    skill: str = typer.Option("", "--skill"),
    limit: int = typer.Option(20, "--limit", "-n"),
) -> None:
    """Newest jobs first."""
    settings = load_settings()

    async def _go() -> None:
        from sqlalchemy import select

        from jobs.models import Job

        svc = await open_services(settings, redis=False)
        try:
            q = select(Job).order_by(Job.created_at.desc()).limit(limit)
            if status:
                q = q.where(Job.status == status)
            if skill:
                q = q.where(Job.skill == skill)
            async with svc.sessionmaker() as s:
                rows = (await s.scalars(q)).all()
        finally:
            await svc.close()
        table = Table()
        for col in ("id", "skill", "status"):
            table.add_column(col, no_wrap=True)
        for col in ("attempts", "channel", "created", "duration"):
            table.add_column(col)
        table.add_column("error", overflow="ellipsis", max_width=60)
        for j in rows:
            dur = f"{j.duration_ms / 1000:.2f}s" if j.duration_ms else "-"
            table.add_row(
                j.id,
                j.skill,
                j.status,
                str(j.attempts),
                j.channel or "-",
                _ts(j.created_at),
                dur,
                (j.error or "")[:60],
            )
        console.print(table)

    run_async(_go)


@jobs_app.command("show")
def show_job(job_id: str) -> None:
    """One job: origin, timing, attempts and result (secrets redacted)."""
    settings = load_settings()

    async def _go() -> None:
        from sqlalchemy import select

        from jobs.models import JobAttempt
        from jobs.queue.store import get_job

        svc = await open_services(settings, redis=False)
        try:
            job = await get_job(svc.sessionmaker, job_id)
            if job is None:
                fail(f"no job {job_id}")
            async with svc.sessionmaker() as s:
                attempts = (
                    await s.scalars(
                        select(JobAttempt)
                        .where(JobAttempt.job_id == job_id)
                        .order_by(JobAttempt.number)
                    )
                ).all()
            _print_job(svc, job)
            table = Table("#", "worker", "started", "finished", "outcome", "error")
            for a in attempts:
                table.add_row(
                    str(a.number),
                    a.worker_id,
                    _ts(a.started_at),
                    _ts(a.finished_at),
                    a.outcome,
                    (a.error or "")[:60],
                )
            console.print(table)
        finally:
            await svc.close()

    run_async(_go)


def _action(name: str, job_id: str) -> None:
    settings = load_settings()

    async def _go() -> None:
        from jobs.queue import control

        svc = await open_services(settings)
        try:
            fn = control.retry_job if name == "retry" else control.cancel_job
            res = await fn(svc, job_id, actor="cli")
        finally:
            await svc.close()
        if not res.ok:
            fail(res.message)
        console.print(f"{job_id}: {res.message}")

    run_async(_go)


def _bulk(name: str, filters: dict[str, Any], dry_run: bool, yes: bool) -> None:
    """Count what the filter matches, confirm (unless --yes), then act."""
    settings = load_settings()

    async def _go() -> None:
        from jobs.queue import control

        svc = await open_services(settings)
        try:
            try:
                flt = control.JobFilter.parse(filters)
                preview = await control.bulk_action(svc, name, flt, dry_run=True)
            except (LookupError, ValueError) as exc:
                fail(str(exc.args[0] if exc.args else exc))
            n = preview["matched"]
            what = f"{n} job{'s' if n != 1 else ''}"
            console.print(f"{name}: {what} match {json.dumps(flt.to_dict(), default=str)}")
            for job_id in preview["job_ids"][:20]:
                console.print(f"  {job_id}")
            if dry_run or not n:
                return
            if not yes and not typer.confirm(f"{name.capitalize()} {what}?"):
                fail("nothing done", code=1)
            done = await control.bulk_action(svc, name, flt, dry_run=False, actor="cli")
        finally:
            await svc.close()
        console.print(f"{name}: {done['affected']} of {done['matched']} done")
        for r in done["refused"][:20]:
            console.print(f"  {r['job_id']}: {r['error']}")

    run_async(_go)


def _act(name: str, job_id: str | None, filters: dict[str, Any], dry_run: bool, yes: bool) -> None:
    given = {k: v for k, v in filters.items() if v}
    if job_id and given:
        fail("give a job id or filter options, not both")
    if job_id:
        if dry_run:
            fail("--dry-run applies to filters (--status, --skill, --since, …)")
        _action(name, job_id)
    elif given:
        _bulk(name, given, dry_run, yes)
    else:
        fail(f"give a job id, or filter options to {name} many (e.g. --status failed --since 2h)")


STATUS_OPT = typer.Option(
    "",
    "--status",
    help="Comma list of statuses (default: failed,timed_out for retry; queued,running for cancel).",
)
SKILL_OPT = typer.Option("", "--skill", help="Only jobs of this skill.")
ERROR_TYPE_OPT = typer.Option("", "--error-type", help="Only jobs failed with this error type.")
SINCE_OPT = typer.Option("", "--since", help="Finished since: 2h, 30m, 7d, an ISO time.")
UNTIL_OPT = typer.Option("", "--until", help="Finished until: 2h, 30m, 7d, an ISO time.")
INCIDENT_OPT = typer.Option("", "--incident", help="Only the failures of this incident.")
DRY_RUN_OPT = typer.Option(False, "--dry-run", help="Only count and list what matches.")
YES_OPT = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")


@jobs_app.command("retry")
def retry(
    job_id: str = typer.Argument(None, help="One job; or use filter options."),
    status: str = STATUS_OPT,
    skill: str = SKILL_OPT,
    error_type: str = ERROR_TYPE_OPT,
    since: str = SINCE_OPT,
    until: str = UNTIL_OPT,
    incident: str = INCIDENT_OPT,
    dry_run: bool = DRY_RUN_OPT,
    yes: bool = YES_OPT,
) -> None:
    """Run a finished job again as a new attempt — or every job a filter matches."""
    filters = {"status": status, "skill": skill, "error_type": error_type}
    filters |= {"since": since, "until": until, "incident": incident}
    _act("retry", job_id, filters, dry_run, yes)


@jobs_app.command("cancel")
def cancel(
    job_id: str = typer.Argument(None, help="One job; or use filter options."),
    status: str = STATUS_OPT,
    skill: str = SKILL_OPT,
    error_type: str = ERROR_TYPE_OPT,
    since: str = SINCE_OPT,
    until: str = UNTIL_OPT,
    dry_run: bool = DRY_RUN_OPT,
    yes: bool = YES_OPT,
) -> None:
    """Cancel a queued job, or stop a running one — or every job a filter matches."""
    filters = {"status": status, "skill": skill, "error_type": error_type}
    filters |= {"since": since, "until": until}
    _act("cancel", job_id, filters, dry_run, yes)


incidents_app = typer.Typer(help="Failures grouped by signature.", no_args_is_help=True)


@incidents_app.command("list")
def list_incidents(
    status: str = typer.Option("open", "--status", help="open, acked or all."),
    skill: str = typer.Option("", "--skill", help="Only incidents of this skill."),
    limit: int = typer.Option(50, "--limit", "-n", min=1, max=500),
) -> None:
    """Incidents, most recently seen first."""
    settings = load_settings()

    async def _go() -> None:
        from jobs.queue import incidents

        svc = await open_services(settings, redis=False)
        try:
            items = await incidents.list_incidents(
                svc.sessionmaker,
                status=None if status == "all" else status,
                skill=skill or None,
                limit=limit,
            )
        finally:
            await svc.close()
        table = Table(title=f"incidents ({status})")
        for col in ("id", "skill", "type", "count", "first seen", "last seen", "status", "error"):
            table.add_column(col, overflow="fold")
        for i in items:
            table.add_row(
                i["id"],
                i["skill"],
                i["error_type"],
                str(i["count"]),
                _ts(i["first_seen"]),
                _ts(i["last_seen"]),
                i["status"],
                i["pattern"][:120],
            )
        console.print(table)

    run_async(_go)


@incidents_app.command("ack")
def ack_incident(incident_id: str) -> None:
    """Acknowledge an incident (a new failure of its signature re-opens it)."""
    settings = load_settings()

    async def _go() -> None:
        from jobs.queue import incidents

        svc = await open_services(settings, redis=False)
        try:
            done = await incidents.ack(svc.sessionmaker, incident_id, actor="cli")
        except LookupError as exc:
            fail(str(exc.args[0]))
        finally:
            await svc.close()
        console.print(f"incident {incident_id} acknowledged ({done['count']} failures so far)")

    run_async(_go)


def register(app: typer.Typer) -> None:
    app.command("dispatch")(dispatch)
    app.add_typer(jobs_app, name="jobs")
    app.add_typer(incidents_app, name="incidents")
