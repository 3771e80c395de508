"""The record: every table of skilljobs. Times are UTC epoch seconds (float) on both backends.

The schema is created only by alembic migrations (``skilljobs db upgrade``).
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Any, Protocol

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONType = JSON().with_variant(JSONB(), "postgresql")


def new_id() -> str:
    return uuid.uuid4().hex


def now() -> float:
    return time.time()


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSONType, list[Any]: JSONType}


# --- the status vocabulary of every entity (SPEC §10); members are ``str`` ------------


class JobStatus(StrEnum):
    SCHEDULED = "scheduled"  # waits for its ``run_at`` (a delayed or one-shot job)
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"
    UNKNOWN = "unknown"
    DISMISSED = "dismissed"


class ChainRunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED_EMPTY = "stopped_empty"
    MISSED = "missed"  # a fire time that was not run (later than the misfire grace)
    SKIPPED = "skipped"  # a fire time that came while the previous run was going


class IncidentStatus(StrEnum):
    OPEN = "open"
    ACKED = "acked"  # an operator has seen it (a new failure of its kind opens it again)


class AttemptOutcome(StrEnum):
    """How an attempt ended other than with a job status (``JobStatus``)."""

    LOST = "lost"  # its lease was taken over (its worker died or stalled)
    REQUEUED = "requeued"  # handed back unfinished (its worker stopping or paused)


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED_EMPTY = "stopped_empty"
    SKIPPED = "skipped"


SCHEDULED = JobStatus.SCHEDULED
QUEUED, RUNNING, SUCCEEDED, FAILED, TIMED_OUT, CANCELLED = (
    JobStatus.QUEUED,
    JobStatus.RUNNING,
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.TIMED_OUT,
    JobStatus.CANCELLED,
)
FINAL_STATUSES = frozenset({SUCCEEDED, FAILED, TIMED_OUT, CANCELLED})
JOB_STATUSES = tuple(JobStatus)


class SkillConfig(Base):
    """Per-role skill configuration; secret-named values are stored Fernet-encrypted."""

    __tablename__ = "skill_configs"
    __table_args__ = (UniqueConstraint("role_id", "skill", "key", name="uq_skill_config"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    role_id: Mapped[str] = mapped_column(String(128), index=True)
    skill: Mapped[str] = mapped_column(String(128))
    key: Mapped[str] = mapped_column(String(128))
    value: Mapped[Any] = mapped_column(JSONType, nullable=True)  # non-secrets only
    value_enc: Mapped[str | None] = mapped_column(Text, nullable=True)  # secrets only
    is_secret: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


# One row, moved on by a trigger at every change of ``skill_configs`` (cached configurations
# are recorded into jobs only while it has not moved). Not part of ``Base.metadata``: it is
# not data to clear with the rest, and it must never lose its row.
config_generation = Table(
    "config_generation",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("generation", BigInteger, nullable=False),
)


class ChatSession(Base):
    """A chat session a job came from (recorded at dispatch); web delivery targets these."""

    __tablename__ = "chat_sessions"

    session_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    role_id: Mapped[str] = mapped_column(String(128), default="")
    org_id: Mapped[str] = mapped_column(String(128), default="")
    channel: Mapped[str] = mapped_column(String(64), default="")
    external_id: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class SessionMessage(Base):
    """A message stored on a chat session (web delivery)."""

    __tablename__ = "session_messages"
    __table_args__ = (Index("ix_session_messages_session", "session_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(255))
    text: Mapped[str] = mapped_column(Text, default="")
    attachments: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)


#: PostgreSQL fill factor of the tables whose rows are updated as their job runs (``jobs``,
#: ``job_attempts``): the new version of a row can then stay on its page (migration 0016)
UPDATED_ROWS_FILLFACTOR = 70


class Job(Base):
    """One background (or recorded synchronous) skill run and everything that happened to it."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_created", "status", "created_at"),
        Index("ix_jobs_skill_created", "skill", "created_at"),
        Index("ix_jobs_created", "created_at"),
        Index("ix_jobs_channel_created", "channel", "created_at"),
        Index("ix_jobs_role_created", "role_id", "created_at"),
        # only rows where the column is set (migration 0014): every query on them is a range
        Index(
            "ix_jobs_finished",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
            sqlite_where=text("finished_at IS NOT NULL"),
        ),
        # only the delayed jobs still waiting for their time (migration 0018): the promoter
        Index(
            "ix_jobs_scheduled_run_at",
            "run_at",
            postgresql_where=text(f"status = '{SCHEDULED.value}'"),
            sqlite_where=text(f"status = '{SCHEDULED.value}'"),
        ),
        Index(
            "ix_jobs_lease_expires_at",
            "lease_expires_at",
            postgresql_where=text("lease_expires_at IS NOT NULL"),
            sqlite_where=text("lease_expires_at IS NOT NULL"),
        ),
        # room on each page for the row's next versions (claimed, finished): migration 0016
        {"postgresql_with": {"fillfactor": UPDATED_ROWS_FILLFACTOR}},
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    skill: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default=QUEUED)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Input and background context, secret-named values sealed (jobs.crypto).
    input: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    context: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    fetches: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    wall_sec: Mapped[float] = mapped_column(Float, default=600.0)

    # Origin (SPEC §10 job.origin).
    channel: Mapped[str] = mapped_column(String(64), default="")
    session_id: Mapped[str] = mapped_column(String(255), default="")
    external_id: Mapped[str] = mapped_column(String(255), default="")
    actor_key: Mapped[str] = mapped_column(String(255), default="")
    role_id: Mapped[str] = mapped_column(String(128), default="")
    org_id: Mapped[str] = mapped_column(String(128), default="")
    chain_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: W3C trace context of the dispatch, so the workers' spans join its trace (jobs.telemetry)
    traceparent: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Queue priority, 0 served first, 9 last (jobs.queue.limits).
    priority: Mapped[int] = mapped_column(Integer, default=3, server_default="3")

    # Execution bookkeeping: the current lease. ``lease_token`` is the fencing token;
    # every write of an attempt's outcome checks it, so a dead attempt that wakes up
    # can never record a result or start a delivery.
    arq_job_id: Mapped[str | None] = mapped_column(String(96), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_token: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # What the running attempt does before its skill runs: {"name": "preparing environment",
    # "detail", "token", "since"} (``store.set_phase``); read it through ``current_phase``.
    phase: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)

    created_at: Mapped[float] = mapped_column(Float, default=now)
    #: when a delayed job is due (``scheduled`` until then; jobs.queue.delayed)
    run_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    queued_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    duration_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float, default=now)

    def current_phase(self) -> dict[str, Any] | None:
        """``{"name", "detail", "since"}`` of the running attempt, or None (finished, queued,
        or a phase an earlier attempt left behind)."""
        p = self.phase
        if self.status != RUNNING or not isinstance(p, dict) or p.get("token") != self.lease_token:
            return None
        return {"name": p.get("name"), "detail": p.get("detail") or "", "since": p.get("since")}


class JobRow(Protocol):
    """What the runner, post-processing and delivery read of a job: a :class:`Job`, or a
    row of the claim statement (``store.RowView``)."""

    @property
    def id(self) -> str: ...
    @property
    def skill(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def input(self) -> dict[str, Any]: ...
    @property
    def context(self) -> dict[str, Any]: ...
    @property
    def channel(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def external_id(self) -> str: ...
    @property
    def actor_key(self) -> str: ...
    @property
    def role_id(self) -> str: ...
    @property
    def org_id(self) -> str: ...
    @property
    def lease_token(self) -> int: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def chain_run_id(self) -> str | None: ...
    @property
    def traceparent(self) -> str | None: ...


class DispatchKey(Base):
    """An idempotency key of a background dispatch: the same key within its window gives
    the same job (``jobs.queue.idempotency``)."""

    __tablename__ = "dispatch_keys"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64))
    request_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, default=now, index=True)


class JobAttempt(Base):
    """One run of a job's skill (transient re-runs and manual retries each add one)."""

    __tablename__ = "job_attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "number", name="uq_job_attempt"),
        {"postgresql_with": {"fillfactor": UPDATED_ROWS_FILLFACTOR}},  # (migration 0016)
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(128), default="")
    lease_token: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float] = mapped_column(Float, default=now)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    outcome: Mapped[str] = mapped_column(String(16), default=RUNNING)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    error_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    duration_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the tails of what the run printed (jobs.queue.attempt_logs), secrets scrubbed
    stdout_tail: Mapped[str | None] = mapped_column(Text, nullable=True)
    stderr_tail: Mapped[str | None] = mapped_column(Text, nullable=True)


class Artifact(Base):
    """A file a job produced or downloaded."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    filename: Mapped[str] = mapped_column(String(512))
    local_path: Mapped[str] = mapped_column(Text)
    media: Mapped[str] = mapped_column(String(16), default="file")  # image video audio file
    mime: Mapped[str] = mapped_column(String(128), default="application/octet-stream")
    size: Mapped[int] = mapped_column(Integer, default=0)
    sha256: Mapped[str] = mapped_column(String(64), default="")
    source_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)


PENDING, SENT = DeliveryStatus.PENDING, DeliveryStatus.SENT


class Delivery(Base):
    """The delivery ledger: one row per (job, recipient, item). ``ledger_key`` is unique, so
    a re-run job or a retried delivery can never send the same item twice."""

    __tablename__ = "deliveries"
    __table_args__ = (Index("ix_deliveries_status_created", "status", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ledger_key: Mapped[str] = mapped_column(String(255), unique=True)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    chain_run_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    recipient: Mapped[str] = mapped_column(String(512))  # "<channel>:<contact>"
    channel: Mapped[str] = mapped_column(String(64), default="")
    kind: Mapped[str] = mapped_column(String(16), default="text")  # text image video audio file
    item: Mapped[str] = mapped_column(Text, default="")  # artifact path / text digest
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    tries: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Custody (SPEC C13): a resend starts a new generation; only a claim of the current
    # generation may record an outcome.
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    message_id: Mapped[str | None] = mapped_column(String(255), nullable=True)  # receipt
    verified: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # id returned
    note: Mapped[str | None] = mapped_column(Text, nullable=True)  # how it went, if not as asked
    sent_as: Mapped[str | None] = mapped_column(String(16), nullable=True)  # kind it went as
    # what is needed to send it again: {"text"} or {"path", "caption"?} (secret-free)
    content: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    # when an outage (5xx, connection error, timeout before sending) first stopped this
    # generation: the outbox tries it again for the channel's retry window from then on
    retry_since: Mapped[float | None] = mapped_column(Float, nullable=True)


class Schedule(Base):
    """A cron-defined chain of skill steps (SPEC §8, schedule file shape in §10)."""

    __tablename__ = "schedules"
    __table_args__ = (Index("ix_schedules_due", "enabled", "next_fire_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    identity: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    steps: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    policy: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    deliver: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    next_fire_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_fire_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Fire policies of the schedule file (chains.policies): misfire, overlap, alert.
    misfire: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    overlap: Mapped[str | None] = mapped_column(String(16), nullable=True)
    alert: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    paused_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: schedule-file fields ``at``, ``jitter``, ``quiet_when_empty``, ``empty_when``
    options: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    alerted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)
    updated_at: Mapped[float] = mapped_column(Float, default=now)


class ChainRun(Base):
    """One run of a schedule. ``fire_key`` is unique: ``cron:<epoch>`` for a cron fire time
    (so each fire time runs exactly once) or ``manual:<id>`` for an on-demand run."""

    __tablename__ = "chain_runs"
    __table_args__ = (
        Index("ix_chain_runs_schedule", "schedule_id", "created_at"),
        Index("ix_chain_runs_status", "status", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    schedule_id: Mapped[str] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    fire_key: Mapped[str] = mapped_column(String(128), unique=True)
    trigger: Mapped[str] = mapped_column(String(16), default="cron")  # cron | manual
    fire_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default=ChainRunStatus.QUEUED)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    arq_job_id: Mapped[str | None] = mapped_column(String(96), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_token: Mapped[int] = mapped_column(Integer, default=0)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Attempts whose lease was taken from them (worker died or stalled): 3 fail the run.
    lost_runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[float] = mapped_column(Float, default=now)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ChainStep(Base):
    """One step of a chain run: resolved input (secrets redacted), output summary, status."""

    __tablename__ = "chain_steps"
    __table_args__ = (UniqueConstraint("run_id", "idx", name="uq_chain_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("chain_runs.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    step_id: Mapped[str] = mapped_column(String(128))
    skill: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default=StepStatus.PENDING)
    input: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    output: Mapped[Any] = mapped_column(JSONType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    duration_ms: Mapped[float | None] = mapped_column(Float, nullable=True)


class Incident(Base):
    """Failures of one signature (skill + error type + normalised error text), grouped."""

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_status_last", "status", "last_seen"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True, default=new_id)
    signature: Mapped[str] = mapped_column(String(64), unique=True)
    skill: Mapped[str] = mapped_column(String(128))
    error_type: Mapped[str] = mapped_column(String(32), default="")
    pattern: Mapped[str] = mapped_column(Text, default="")
    sample_error: Mapped[str] = mapped_column(Text, default="")
    count: Mapped[int] = mapped_column(Integer, default=0)
    sample_job_ids: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    status: Mapped[str] = mapped_column(String(16), default=IncidentStatus.OPEN)
    first_seen: Mapped[float] = mapped_column(Float, default=now)
    last_seen: Mapped[float] = mapped_column(Float, default=now)
    acked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    acked_by: Mapped[str] = mapped_column(String(128), default="")


class Worker(Base):
    """A worker process and its heartbeat."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(255), default="")
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float] = mapped_column(Float, default=now)
    last_heartbeat: Mapped[float] = mapped_column(Float, default=now, index=True)
    running: Mapped[list[Any]] = mapped_column(JSONType, default=list)
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The stall detector (jobs.queue.stall): event-loop blocks past the threshold so far,
    # and the longest block seen, in seconds.
    stalls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    longest_stall_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class JobLimit(Base):
    """A start-rate and/or concurrency limit set at run time (``PUT /api/v1/limits/{key}``);
    it overrides ``SKILLJOBS_LIMITS`` for its key (jobs.queue.ratelimits)."""

    __tablename__ = "job_limits"

    key: Mapped[str] = mapped_column(String(160), primary_key=True)
    rate: Mapped[str | None] = mapped_column(String(32), nullable=True)  # "2/10s"
    concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[float] = mapped_column(Float, default=now)
    updated_by: Mapped[str] = mapped_column(String(128), default="", server_default="")


class OpsAction(Base):
    """An operator action (retry, cancel, requeue, schedule toggles) — the audit trail."""

    __tablename__ = "ops_actions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(255))
    actor: Mapped[str] = mapped_column(String(128), default="")
    details: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[float] = mapped_column(Float, default=now, index=True)
