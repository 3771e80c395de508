"""The JSON shapes of jobs, attempts, artifacts and deliveries (SPEC §10), as the API and
``skilljobs jobs show --json`` print them: secret-named values masked, a job's result
scrubbed of its secret values."""

from __future__ import annotations

from typing import Any

from jobs import telemetry
from jobs.context import scrub, secret_values
from jobs.crypto import ENC_TAG, REDACTED, SecretBox, redact
from jobs.envelope import is_partial
from jobs.models import Artifact, Delivery, Job, JobAttempt


def safe(obj: object, *, by_name: bool = True) -> Any:
    """Secret-named values masked (configuration-shaped data only: results are data and
    were scrubbed of the job's secret values when they ran, C12), and any sealed value
    masked wherever it sits."""

    def strip(v: object) -> Any:
        if isinstance(v, dict):
            if ENC_TAG in v and len(v) == 1:
                return REDACTED
            return {k: strip(x) for k, x in v.items()}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(redact(obj) if by_name else obj)


def job_secrets(job: Job, box: SecretBox | None) -> list[str]:
    """The job's secret values (from its sealed context): what is scrubbed from its result
    wherever it is shown (C12: by value, never by the result's field names)."""
    if box is None or not isinstance(job.context, dict):
        return []
    try:
        return secret_values(box.unseal(job.context), job.skill)
    except ValueError:  # written with another key: the sealed values stay masked anyway
        return []


def artifact_dict(a: Artifact) -> dict[str, Any]:
    return {
        "id": a.id,
        "filename": a.filename,
        "local_path": a.local_path,
        "media": a.media,
        "mime": a.mime,
        "size": a.size,
        "sha256": a.sha256,
        "source_url": a.source_url,
        "download_url": f"/api/v1/jobs/{a.job_id}/artifacts/{a.id}",
    }


def delivery_dict(d: Delivery) -> dict[str, Any]:
    return {
        "id": d.id,
        "recipient": d.recipient,
        "channel": d.channel,
        "kind": d.kind,
        "status": d.status,
        "error": d.error,
        "tries": d.tries,
        "created_at": d.created_at,
        "sent_at": d.sent_at,
    }


def attempt_dict(a: JobAttempt, secrets: list[str] | None = None) -> dict[str, Any]:
    """One run of the job, with the tails of what it printed (capped when recorded,
    scrubbed of the job's secret values then and again here)."""
    return {
        "number": a.number,
        "worker_id": a.worker_id,
        "started_at": a.started_at,
        "finished_at": a.finished_at,
        "outcome": a.outcome,
        "error": a.error,
        "error_type": a.error_type,
        "duration_ms": a.duration_ms,
        "stdout_tail": scrub(a.stdout_tail, secrets or []),
        "stderr_tail": scrub(a.stderr_tail, secrets or []),
    }


def origin_dict(job: Job) -> dict[str, str]:
    """Where a job came from: its channel, session, actor, role and organisation."""
    ctx = job.context if isinstance(job.context, dict) else {}
    return {
        "channel": job.channel,
        "session_id": job.session_id,
        "external_id": job.external_id,
        "actor_key": job.actor_key,
        "role_id": job.role_id,
        "org_id": job.org_id,
        # the conversation and message the request came from, when the context named them
        **{k: str(ctx[k]) for k in ("conversation_id", "message_id") if ctx.get(k)},
    }


def job_dict(
    job: Job,
    artifacts: list[Artifact],
    deliveries: list[Delivery],
    attempts: list[JobAttempt] | None = None,
    box: SecretBox | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": job.id,
        "skill": job.skill,
        "status": job.status,
        # what a running job does before its skill runs ("preparing environment"), or None
        "phase": (phase := job.current_phase()) and phase["name"],
        "phase_detail": phase and phase["detail"],
        "phase_since": phase and phase["since"],
        "attempts": job.attempts,
        "created_at": job.created_at,
        "run_at": job.run_at,  # a delayed job's time (``scheduled`` until then)
        "queued_at": job.queued_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration_ms": job.duration_ms,
        "result": safe(scrub(job.result, job_secrets(job, box)), by_name=False),
        "partial": is_partial(job.result),
        "error": job.error,
        "error_type": job.error_type,
        "cancel_requested": job.cancel_requested,
        "chain_run_id": job.chain_run_id,
        "priority": job.priority,
        "origin": origin_dict(job),
        "artifacts": [artifact_dict(a) for a in artifacts],
        "deliveries": [delivery_dict(d) for d in deliveries],
    }
    if attempts is not None:
        out["input"] = safe(job.input)
        out["context"] = safe(job.context)
        out["fetches"] = safe(job.fetches or [])
        out["wall_sec"] = job.wall_sec
        out["trace_id"] = telemetry.trace_id(job)  # its spans' trace, when tracing is on
        secrets = job_secrets(job, box)
        out["attempt_log"] = [attempt_dict(a, secrets) for a in attempts]
    return out
