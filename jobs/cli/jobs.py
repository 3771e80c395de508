"""``skilljobs dispatch``, ``skilljobs jobs list|show|retry|cancel`` (one job, or every
job a filter matches — the dashboard's job filter, ``jobs.queue.filters``:
``jobs retry --status failed --skill X --since 2h [--dry-run]``); incidents are
``jobs.cli.incidents``."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import select

from dashboard import queries
from dashboard.shapes import job_dict, origin_dict
from delivery import notices
from jobs import telemetry
from jobs.cli import output
from jobs.cli.common import fail, with_services
from jobs.cli.output import print_json
from jobs.envelope import is_partial
from jobs.models import FINAL_STATUSES, Job, JobAttempt
from jobs.queue import control, delayed, pauses
from jobs.queue.dispatcher import Dispatcher
from jobs.queue.filters import JobFilter
from jobs.queue.store import get_job
from jobs.services import Services

console = Console()
jobs_app = typer.Typer(help="Look at and act on jobs.", no_args_is_help=True)


def _ts(value: float | None) -> str:
    if not value:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


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
    conversation: str = typer.Option(
        "", "--conversation", help="Group chat the call came from (the result goes there)."
    ),
    message_id: str = typer.Option("", "--message-id", help="Message the result answers."),
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
    at: str = typer.Option(
        "", "--at", help="Run later, at 18:00 (next one), an ISO time or epoch seconds."
    ),
    tz: str = typer.Option("", "--tz", help="Time zone of --at (e.g. Asia/Shanghai)."),
    in_: str = typer.Option("", "--in", help="Run later, after 10m, 1h30m, 45s ..."),
) -> None:
    """Call a skill the way the chat layer does: a receipt for background jobs, the result otherwise."""
    data = _parse_json(input, "--input")
    run_at: float | None = None
    try:
        if at and in_:
            fail("give --at or --in, not both")
        if tz:
            delayed.zone(tz)
        if at:
            run_at = delayed.clock_time(at, tz or None, time.time())
        elif in_:
            run_at = time.time() + delayed.parse_duration(in_)
    except delayed.WhenError as exc:
        fail(str(exc))
    context = {
        "channel": channel,
        "session_id": session,
        "actor_key": actor_key,
        "role_id": role,
        "org_id": org,
        "triggered_at": time.time(),
    }
    context.update(
        {k: v for k, v in (("conversation_id", conversation), ("message_id", message_id)) if v}
    )
    telemetry.setup("skilljobs-cli")

    async def _go(svc: Services) -> int:
        res = await Dispatcher(svc).dispatch(
            skill,
            data,
            context,
            external_id or None,
            idempotency_key or None,
            priority=priority,
            run_at=run_at,
        )
        console.print_json(json.dumps(res.body, ensure_ascii=False, default=str))
        if res.status_code >= 400:
            return 1
        if res.is_async and wait:
            return await _wait(svc, res.body["job_id"], timeout)
        return 0 if res.body.get("ok", True) is not False else 1

    raise typer.Exit(with_services(_go))


async def _wait(svc: Services, job_id: str, limit: float) -> int:
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


def _print_job(svc: Services, job: Job) -> None:
    console.print(f"[bold]{job.id}[/]  {job.skill}  [bold]{job.status}[/]  attempts={job.attempts}")
    phase = job.current_phase()
    if phase is not None:  # e.g. preparing environment (requirements.txt) since 12:01:02
        detail = f" ({phase['detail']})" if phase["detail"] else ""
        console.print(f"phase: [yellow]{phase['name']}[/]{detail} since {_ts(phase['since'])}")
    console.print(
        f"origin: channel={job.channel or '-'} session={job.session_id or '-'} "
        f"actor_key={job.actor_key or '-'} role={job.role_id or '-'}"
        + "".join(
            f" {k}={job.context[k]}"
            for k in ("conversation_id", "message_id")
            if isinstance(job.context, dict) and job.context.get(k)
        )
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
    status: str = typer.Option(
        "", "--status", "-s", help="queued, running, failed, … (comma list)"
    ),
    skill: str = typer.Option("", "--skill"),
    channel: str = typer.Option("", "--channel"),
    role: str = typer.Option("", "--role"),
    error_type: str = typer.Option("", "--error-type"),
    since: str = typer.Option("", "--since", help="Created since: 2h, 30m, 7d, an ISO time."),
    until: str = typer.Option("", "--until", help="Created before: 2h, an ISO time."),
    q: str = typer.Option("", "--search", "-q", help="Id prefix, skill or error text, session."),
    limit: int = typer.Option(20, "--limit", "-n", min=1, max=1000),
    as_json: bool = output.JSON_OPT,
) -> None:
    """Newest jobs first (the dashboard's filter: ``jobs retry|cancel`` take the same)."""
    filters = {"status": status, "skill": skill, "channel": channel, "role": role}
    filters |= {"error_type": error_type, "since": since, "until": until, "q": q}
    flt = _filter(filters)

    paused: set[str] = set()

    async def _go(svc: Services) -> list[Job]:
        async with svc.sessionmaker() as s:
            conds = await flt.conditions_in(s)
            q = select(Job).where(*conds).order_by(Job.created_at.desc()).limit(limit)
            found = list((await s.scalars(q)).all())
        paused.update(await pauses.paused_skills(svc, required=False))
        return found

    rows = with_services(_go, redis=False)
    if as_json:
        print_json({"items": [job_json(j) for j in rows]})
        return
    cols = ("id", "skill", "status", "attempts", "channel", "created", "duration", "error")
    out = []
    for j in rows:
        dur = f"{j.duration_ms / 1000:.2f}s" if j.duration_ms else "-"
        phase = j.current_phase()  # running (preparing environment)
        status = f"{j.status} ({phase['name']})" if phase else j.status
        if j.status == "queued" and j.skill in paused:
            status = "queued (paused)"
        out.append(
            (
                j.id,
                j.skill,
                status,
                j.attempts,
                j.channel or "-",
                _ts(j.created_at),
                dur,
                j.error or "",
            )
        )
    output.table(cols, out, wrap=("error",))


def job_json(job: Job) -> dict[str, Any]:
    """A job as ``--json`` prints it (the API's field names; times are epoch seconds)."""
    phase = job.current_phase()
    return {
        "id": job.id,
        "skill": job.skill,
        "status": job.status,
        "phase": phase and phase["name"],
        "attempts": job.attempts,
        "priority": job.priority,
        "created_at": job.created_at,
        "queued_at": job.queued_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration_ms": job.duration_ms,
        "error": job.error,
        "error_type": job.error_type,
        "chain_run_id": job.chain_run_id,
        "origin": origin_dict(job),
    }


def _filter(filters: dict[str, Any]) -> JobFilter:
    try:
        return JobFilter.parse({k: v for k, v in filters.items() if v})
    except ValueError as exc:
        fail(str(exc))


@jobs_app.command("show")
def show_job(job_id: str, as_json: bool = output.JSON_OPT) -> None:
    """One job: origin, timing, attempts (with the tails of what each run printed) and
    result (secrets redacted)."""

    async def _go(svc: Services) -> None:
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
        if as_json:
            async with svc.sessionmaker() as s:
                arts, dels = await queries.job_children(s, [job_id])
            body = job_dict(
                job, arts.get(job_id, []), dels.get(job_id, []), list(attempts), svc.box
            )
            body["paused"] = job.skill in await pauses.paused_skills(svc, required=False)
            print_json(body)
            return
        _print_job(svc, job)
        if job.status == "queued" and job.skill in await pauses.paused_skills(svc, required=False):
            console.print(
                f"[yellow]paused[/]: skill {job.skill} is paused; the job waits until "
                f"`skilljobs skills resume {job.skill}`"
            )
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
        for a in attempts:
            _print_tails(a)

    with_services(_go, redis=False)


def _print_tails(attempt: JobAttempt) -> None:
    for name in ("stdout", "stderr"):
        tail = getattr(attempt, f"{name}_tail", None)
        if tail:
            console.rule(f"attempt {attempt.number} {name} (tail)")
            console.print(tail, markup=False, highlight=False)


def _action(name: str, job_id: str) -> None:
    async def _go(svc: Services) -> control.ActionResult:
        if name == "cancel":
            return await control.cancel_job(svc, job_id, notices=notices, actor="cli")
        fn = control.retry_job if name == "retry" else control.delete_job
        return await fn(svc, job_id, actor="cli")

    res = with_services(_go, redis=name != "delete")
    if not res.ok:
        fail(res.message)
    console.print(f"{job_id}: {res.message}")


def _bulk(name: str, filters: dict[str, Any], dry_run: bool, yes: bool, limit: int) -> None:
    """Count what the filter matches, confirm (unless --yes), then act."""
    flt = _filter(filters)

    async def _go(svc: Services) -> dict[str, Any] | None:
        try:
            preview = await control.bulk_action(
                svc, name, flt, notices=notices, dry_run=True, limit=limit
            )
        except (LookupError, ValueError) as exc:
            fail(str(exc.args[0] if exc.args else exc))
        n, taken = preview["matched"], len(preview["job_ids"])
        what = f"{n} job{'s' if n != 1 else ''}"
        console.print(f"{name}: {what} match {json.dumps(flt.to_dict(), default=str)}")
        if preview["capped"]:
            console.print(
                f"  at most {limit} are taken at once (the oldest): run it again for the rest"
            )
        for job_id in preview["job_ids"][:20]:
            console.print(f"  {job_id}")
        if taken > 20:
            console.print(f"  … and {taken - 20} more")
        if dry_run or not n:
            return None
        count = f"{min(n, limit)} job{'s' if min(n, limit) != 1 else ''}"
        if not yes and not typer.confirm(f"{name.capitalize()} {count}?"):
            fail("nothing done", code=1)
        return await control.bulk_action(
            svc, name, flt, notices=notices, dry_run=False, limit=limit, actor="cli"
        )

    done = with_services(_go)
    if done is None:
        return
    console.print(f"{name}: {done['affected']} of {done['matched']} done")
    for r in done["refused"][:20]:
        console.print(f"  {r['job_id']}: {r['error']}")


def _act(
    name: str, job_id: str | None, filters: dict[str, Any], dry_run: bool, yes: bool, limit: int
) -> None:
    given = {k: v for k, v in filters.items() if v}
    if job_id and given:
        fail("give a job id or filter options, not both")
    if job_id:
        if dry_run:
            fail("--dry-run applies to filters (--status, --skill, --since, …)")
        _action(name, job_id)
    elif given:
        _bulk(name, given, dry_run, yes, limit)
    else:
        fail(f"give a job id, or filter options to {name} many (e.g. --status failed --since 2h)")


STATUS_OPT = typer.Option(
    "",
    "--status",
    help="Comma list of statuses (default: failed,timed_out for retry; queued,running for cancel).",
)
SKILL_OPT = typer.Option("", "--skill", help="Only jobs of this skill.")
CHANNEL_OPT = typer.Option("", "--channel", help="Only jobs from this channel.")
ROLE_OPT = typer.Option("", "--role", help="Only jobs of this role id.")
ERROR_TYPE_OPT = typer.Option("", "--error-type", help="Only jobs failed with this error type.")
SINCE_OPT = typer.Option("", "--since", help="Created since: 2h, 30m, 7d, an ISO time.")
UNTIL_OPT = typer.Option("", "--until", help="Created before: 2h, 30m, 7d, an ISO time.")
SEARCH_OPT = typer.Option("", "--search", "-q", help="Id prefix, skill or error text, session.")
INCIDENT_OPT = typer.Option("", "--incident", help="Only the failures of this incident.")
DRY_RUN_OPT = typer.Option(False, "--dry-run", help="Only count and list what matches.")
YES_OPT = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")
LIMIT_OPT = typer.Option(
    10_000, "--limit", min=1, max=10_000, help="Act on at most this many (the oldest) at once."
)


@jobs_app.command("retry")
def retry(
    job_id: str = typer.Argument(None, help="One job; or use filter options."),
    status: str = STATUS_OPT,
    skill: str = SKILL_OPT,
    channel: str = CHANNEL_OPT,
    role: str = ROLE_OPT,
    error_type: str = ERROR_TYPE_OPT,
    since: str = SINCE_OPT,
    until: str = UNTIL_OPT,
    search: str = SEARCH_OPT,
    incident: str = INCIDENT_OPT,
    dry_run: bool = DRY_RUN_OPT,
    yes: bool = YES_OPT,
    limit: int = LIMIT_OPT,
) -> None:
    """Run a finished job again as a new attempt — or every job a filter matches."""
    filters = {"status": status, "skill": skill, "channel": channel, "role": role}
    filters |= {"error_type": error_type, "since": since, "until": until, "q": search}
    _act("retry", job_id, filters | {"incident": incident}, dry_run, yes, limit)


@jobs_app.command("cancel")
def cancel(
    job_id: str = typer.Argument(None, help="One job; or use filter options."),
    status: str = STATUS_OPT,
    skill: str = SKILL_OPT,
    channel: str = CHANNEL_OPT,
    role: str = ROLE_OPT,
    error_type: str = ERROR_TYPE_OPT,
    since: str = SINCE_OPT,
    until: str = UNTIL_OPT,
    search: str = SEARCH_OPT,
    dry_run: bool = DRY_RUN_OPT,
    yes: bool = YES_OPT,
    limit: int = LIMIT_OPT,
) -> None:
    """Cancel a queued job, or stop a running one — or every job a filter matches."""
    filters = {"status": status, "skill": skill, "channel": channel, "role": role}
    filters |= {"error_type": error_type, "since": since, "until": until, "q": search}
    _act("cancel", job_id, filters, dry_run, yes, limit)


@jobs_app.command("delete")
def delete(
    job_id: str = typer.Argument(None, help="One job; or use filter options."),
    status: str = typer.Option(
        "", "--status", help="Comma list of finished statuses (default: all finished ones)."
    ),
    skill: str = SKILL_OPT,
    channel: str = CHANNEL_OPT,
    role: str = ROLE_OPT,
    error_type: str = ERROR_TYPE_OPT,
    since: str = SINCE_OPT,
    until: str = UNTIL_OPT,
    search: str = SEARCH_OPT,
    dry_run: bool = DRY_RUN_OPT,
    yes: bool = YES_OPT,
    limit: int = LIMIT_OPT,
) -> None:
    """Delete a finished job (with its attempts and deliveries) — or every finished job a
    filter matches. Audited; queued and running jobs are refused."""
    filters = {"status": status, "skill": skill, "channel": channel, "role": role}
    filters |= {"error_type": error_type, "since": since, "until": until, "q": search}
    _act("delete", job_id, filters, dry_run, yes, limit)


def register(app: typer.Typer) -> None:
    app.command("dispatch")(dispatch)
    app.add_typer(jobs_app, name="jobs")
