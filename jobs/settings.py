"""Settings: one pydantic-settings class, built at the edge (CLI, app lifespan, worker startup)."""

from __future__ import annotations

import json
import os
from functools import cached_property
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The skills shipped in the package (the checkout's skills/ folder, or the installed copy).
BUNDLED_SKILLS = Path(str(files("jobs.bundled_skills")))
TRUSTED_MARK = "trusted="  # SKILLJOBS_SKILLS_PATH=bundled:trusted=/srv/own-skills


def _skills_dir(entry: str) -> Path:
    return BUNDLED_SKILLS if entry == "bundled" else Path(entry).expanduser()


class Settings(BaseSettings):
    """Everything configurable, read from ``SKILLJOBS_*`` variables or ``.env``."""

    model_config = SettingsConfigDict(
        env_prefix="SKILLJOBS_", env_file=".env", extra="ignore", populate_by_name=True
    )

    redis_url: str | None = None
    # The port `skilljobs up` gives its bundled Redis (default: a free one).
    embedded_redis_port: int | None = Field(default=None, ge=1, le=65535)
    database_url: str | None = None
    # PostgreSQL reached through PgBouncer in transaction mode (also detected on port 6432).
    database_pgbouncer: bool = False
    # A read replica of the job store for the dashboard's lists, searches and statistics
    # (job details, anything just written and every write stay on the primary).
    database_read_url: str | None = None
    data_dir: Path = Path("./.skilljobs")
    skills_path: str | None = None
    workspace_root: Path | None = None
    secret_key: SecretStr | None = None
    api_token: SecretStr | None = None
    api_read_token: SecretStr | None = None  # reads everything, changes nothing
    # HTTP surface: request body cap for dispatch (1 MB elsewhere), extra Host names
    # (comma list) besides the loopback ones, and connection limits of `skilljobs web`.
    max_request_mb: float = Field(default=16.0, gt=0)
    allowed_hosts: str = ""
    web_max_connections: int = Field(default=2048, ge=16)
    web_header_timeout_sec: float = Field(default=10.0, gt=0)
    # Past five 401s from one client address within a minute, each further answer waits
    # this much longer than the last (at most eight times it).
    web_auth_failure_delay_sec: float = Field(default=0.25, ge=0)
    sync_processes: int = Field(default=2, ge=0, le=32)  # sync-line executor processes of web
    notify_targets: str | None = None
    fetch_allow_hosts: str = ""
    # Where skills may send: bare Apprise URLs (comma list of scheme://host[:port]; aliases
    # are always allowed), and what a chat-line send_message may reach beyond its own
    # origin (JSON: role → recipient patterns). Lifetime of signed file links.
    notify_allow_urls: str = ""
    send_allow: str | None = None
    file_link_ttl_sec: int = Field(default=604800, gt=0)
    # Outbound rate limits per channel (JSON, delivery.ratelimit): overrides of the
    # platforms' published limits per bot/app, chat and group.
    rate_limits: str = ""
    # Outages are waited out (delivery.outbox): a send that met a 5xx, a connection error
    # or a timeout before the request went out is tried again from the outbox (no worker
    # slot held) with exponential backoff and jitter from ``…_BASE_SEC`` up to ``…_MAX_SEC``
    # between tries, for ``…_WINDOW_SEC`` from its first failure; then it is ``failed`` with
    # the reason (resendable). ``…_WINDOWS``: JSON channel → window seconds, per channel.
    delivery_retry_window_sec: float = Field(default=1800.0, ge=0)
    delivery_retry_windows: dict[str, float] = Field(default_factory=dict)
    delivery_retry_base_sec: float = Field(default=1.0, gt=0)
    delivery_retry_max_sec: float = Field(default=15.0, gt=0)
    # The outbox's database-driven sweep: parked rows missing from their Redis queue and
    # rows whose claimant is gone (a dead worker, a finished attempt) are sent again; it
    # runs this often (a delivery whose worker died is re-driven this long after the worker
    # is presumed dead, as its jobs are: 3 heartbeats and a second).
    outbox_sweep_sec: float = Field(default=2.0, gt=0)
    # A delivery ``pending`` longer than this is reported (deliveries list, queue summary,
    # /metrics ``skilljobs_deliveries_pending_stale``).
    delivery_pending_stale_sec: float = Field(default=300.0, gt=0)
    # The longest pause between two tries of a finishing step a fault stopped (the
    # database or Redis away): the finish is delayed, never failed.
    finish_retry_max_sec: float = Field(default=5.0, gt=0)
    # The base URL people reach ``skilljobs web`` at: signed download links of files too
    # large for a channel point there (none when unset).
    public_url: str = ""

    # Namespacing of our own Redis keys and the arq queue (lets several deployments, or
    # several test runs, share one Redis server).
    redis_prefix: str = "skilljobs"
    queue_name: str = "skilljobs:queue"

    telegram_bot_token: SecretStr | None = None
    telegram_api_base: str = "https://api.telegram.org"
    feishu_app_id: str | None = None
    feishu_app_secret: SecretStr | None = None
    feishu_api_base: str = "https://open.feishu.cn"
    wecom_corp_id: str | None = None
    wecom_corp_secret: SecretStr | None = None
    wecom_agent_id: str | None = None
    wecom_api_base: str = "https://qyapi.weixin.qq.com"
    dingtalk_app_key: str | None = None
    dingtalk_app_secret: SecretStr | None = None
    dingtalk_robot_code: str | None = None
    dingtalk_api_base: str = "https://api.dingtalk.com"
    dingtalk_oapi_base: str = "https://oapi.dingtalk.com"

    llm_provider: str | None = None
    llm_base: str | None = None
    llm_key: SecretStr | None = None
    llm_model: str | None = None

    # Worker tuning.
    worker_max_jobs: int = 100
    worker_lease_sec: float = 30.0
    # Claim ahead: a worker leases about as many jobs beyond its free slots as its slots
    # free within this many seconds (at the slot occupancy it measures; none for long jobs),
    # so a freed slot starts its next skill without waiting for Redis and the database.
    # A job claimed ahead and not started within max(1 s, 10x this) goes back to the queue.
    # 0 turns it off.
    worker_prefetch_sec: float = 0.1
    # Heartbeats (database lease renewal + a Redis key): a worker whose heartbeat is missing
    # for 3 intervals (+1 s) has its jobs taken over by a peer; 2.5 s re-runs the jobs of a
    # killed worker within 10 s, and a worker paused for 5 s is not taken over.
    worker_heartbeat_sec: float = 2.5
    worker_stall_sec: float = 3.0  # event loop blocked this long: its stack is logged
    # The worker process's CPU niceness (and its skills' subprocesses'): on a host it shares
    # with the web front door, PostgreSQL or Redis, 10 serves those first when the CPU is
    # contended (receipts before background runs). 0: unchanged. A higher niceness the
    # process was started with is kept.
    worker_nice: int = Field(default=0, ge=0, le=19)
    worker_grace_sec: float = 30.0
    reconcile_interval_sec: float = 10.0
    # Delayed jobs (run_at / delay_s): how often each worker's promoter looks for new ones;
    # it wakes at the earliest time it knows of, so a job starts within this of its time.
    delayed_poll_sec: float = Field(default=0.5, gt=0, le=60)
    # Start-rate and concurrency limits set at run time: how often workers read them.
    limits_refresh_sec: float = Field(default=1.0, gt=0, le=300)
    reconcile_stale_sec: float = 15.0  # a queued job missing from Redis this long is re-enqueued
    retry_backoff_sec: float = 1.0  # transient re-runs wait 1×, then 4× this
    scheduler_interval_sec: float = 1.0

    # Retention (SPEC §10): finished jobs and chain runs are deleted after this many days;
    # web-session messages and unreferenced workspace files only when set. A worker runs
    # one pass every prune interval (one pruner at a time across workers).
    retention_days: float | None = 30.0
    message_retention_days: float | None = None
    workspace_retention_days: float | None = None
    prune_interval_sec: float = Field(default=3600.0, gt=0)

    # Concurrency limits shared by all workers (SPEC §10), JSON: {"skill:video_gen": 2,
    # "org:*": 20, "actor:*": 2}; ``*`` is a limit for each value. Checked by jobs.queue.limits.
    limits: dict[str, int] = Field(default_factory=dict)

    # Isolation of skills from the worker.
    skill_env_passthrough: str = ""  # comma list of worker variables subprocess skills see
    skill_database_url: str | None = None  # the business database behind db_factory
    # The sandbox of untrusted skills (jobs.execution.sandbox): "bwrap" (default) or "none"
    # (the operator trusts every skill: they run as the worker). Trusted: the bundled
    # skills, entries of SKILLJOBS_SKILLS_PATH written ``trusted=<dir>``, and the folders
    # of SKILLJOBS_TRUSTED_SKILLS (os.pathsep list).
    sandbox: str = "bwrap"
    trusted_skills: str = ""
    sandbox_network: str = "slirp4netns"  # or "none": no network at all
    # Limits of one sandboxed run (0: none): memory (data segment), CPU time, processes,
    # largest file, the private /tmp, and the workspace's size when the run ends.
    sandbox_memory_mb: int = Field(default=2048, ge=0)
    sandbox_cpu_sec: int = Field(default=3600, ge=0)
    sandbox_nproc: int = Field(default=512, ge=0)
    sandbox_fsize_mb: int = Field(default=1024, ge=0)
    sandbox_tmp_mb: int = Field(default=256, ge=0)
    sandbox_workspace_mb: int = Field(default=2048, ge=0)
    # Dependency environments of skills (PEP 723, requirements.txt, package-lock.json) live
    # under <data_dir>/envs; one build may take at most this long.
    skill_env_timeout_sec: float = Field(default=600.0, gt=0)
    # Cleanup of those environments (each prune pass, `skilljobs envs prune`): one no run
    # used for this many days goes (0: kept), and the least recently used go while all of
    # them exceed this many MB (0: no cap). One a running job uses is never removed.
    skill_env_retention_days: float = Field(default=30.0, ge=0)
    skill_env_max_mb: float = Field(default=10240.0, ge=0)

    language: str = "en"  # user-facing texts: en | zh (a dispatch context locale overrides)
    # Notices to the person beside the result (through the delivery ledger, once each): a
    # "still working" note when a background job runs longer than this (0: never; a skill's
    # ctx["progress"]() call sends it earlier), and a "cancelled" note when a job is
    # cancelled (by an operator or the person).
    notice_after_s: float = Field(default=0.0, ge=0)
    notice_working: bool = True
    notice_cancelled: bool = True

    log_format: str = Field(default="text", description="text or json")
    log_level: str = "INFO"

    @field_validator("data_dir", mode="before")
    @classmethod
    def _expand(cls, v: object) -> Any:
        return Path(os.path.expanduser(str(v))) if v is not None else v

    @field_validator("database_url", "database_read_url", mode="before")
    @classmethod
    def _async_driver(cls, v: object) -> Any:
        """``postgresql://`` (as every PostgreSQL tool writes it) and ``sqlite:///`` mean
        the async drivers this service uses."""
        if not isinstance(v, str) or not v.strip():
            return None if isinstance(v, str) else v
        v = v.strip()
        for plain, driver in (
            ("postgresql://", "postgresql+asyncpg://"),
            ("postgres://", "postgresql+asyncpg://"),
            ("postgresql+psycopg2://", "postgresql+asyncpg://"),
            ("sqlite://", "sqlite+aiosqlite://"),
        ):
            if v.startswith(plain):
                return driver + v.removeprefix(plain)
        return v

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, v: object) -> Any:
        code = str(v or "en").strip().lower().replace("_", "-").split("-")[0]
        if code not in ("en", "zh"):
            raise ValueError("SKILLJOBS_LANGUAGE must be en or zh")
        return code

    @field_validator("delivery_retry_windows", mode="before")
    @classmethod
    def _windows_json(cls, v: object) -> Any:
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return v

    def delivery_retry_window(self, channel: str) -> float:
        """How long a send to ``channel`` that keeps meeting an outage is tried again."""
        return float(self.delivery_retry_windows.get(channel, self.delivery_retry_window_sec))

    @field_validator("limits", mode="before")
    @classmethod
    def _limits_json(cls, v: object) -> Any:
        if isinstance(v, str):
            return json.loads(v) if v.strip() else {}
        return v

    @field_validator("limits")
    @classmethod
    def _limits(cls, v: dict[str, int]) -> dict[str, int]:
        for key, n in v.items():
            kind, _, value = key.partition(":")
            if kind not in ("skill", "org", "role", "actor") or not value:
                raise ValueError(
                    f"SKILLJOBS_LIMITS key {key!r}: use skill:NAME, org:ID, role:ID or actor:KEY"
                    " (or KIND:* for each value)"
                )
            if n < 1:
                raise ValueError(f"SKILLJOBS_LIMITS {key!r}: the limit must be at least 1")
        return v

    # Derived values -------------------------------------------------------------------

    def _pooled(self, url: str) -> str:
        if self.database_pgbouncer and "pgbouncer=" not in url:
            return f"{url}{'&' if '?' in url else '?'}pgbouncer=true"
        return url

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self._pooled(self.database_url)
        return f"sqlite+aiosqlite:///{(self.data_dir / 'skilljobs.db').resolve()}"

    @property
    def resolved_database_read_url(self) -> str | None:
        """The replica the dashboard reads lists from, or None (read the primary)."""
        return self._pooled(self.database_read_url) if self.database_read_url else None

    @property
    def resolved_skill_database_url(self) -> str:
        """Where ``db_factory`` sessions go: never the job store's own database."""
        if self.skill_database_url:
            return self.skill_database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'skills.db').resolve()}"

    @cached_property
    def resolved_workspace_root(self) -> Path:
        return (self.workspace_root or self.data_dir / "workspaces").resolve()

    @property
    def skill_dirs(self) -> list[Path]:
        if not self.skills_path:
            return [BUNDLED_SKILLS]
        # ``bundled`` names the skills shipped with the package, wherever it is installed;
        # ``trusted=<dir>`` a folder whose skills run without the sandbox.
        return [_skills_dir(p.removeprefix(TRUSTED_MARK)) for p in self._path_entries()]

    def _path_entries(self) -> list[str]:
        return [p for p in (self.skills_path or "").split(os.pathsep) if p]

    @property
    def trusted_skill_dirs(self) -> list[Path]:
        """Folders whose skills the operator trusts: the bundled ones, ``trusted=`` entries
        of the skills path and SKILLJOBS_TRUSTED_SKILLS."""
        marked = [p.removeprefix(TRUSTED_MARK) for p in self._path_entries()]
        marked = [p for p, raw in zip(marked, self._path_entries(), strict=True) if raw != p]
        listed = [p for p in self.trusted_skills.split(os.pathsep) if p.strip()]
        return [BUNDLED_SKILLS, *(_skills_dir(p.strip()) for p in [*marked, *listed])]

    @property
    def allow_hosts(self) -> list[str]:
        return [h.strip().lower() for h in self.fetch_allow_hosts.split(",") if h.strip()]

    @property
    def notify_allow_list(self) -> list[str]:
        return [u.strip() for u in self.notify_allow_urls.split(",") if u.strip()]

    @cached_property
    def send_allow_map(self) -> dict[str, list[str]]:
        """Role → recipient patterns (``telegram:*``, ``feishu:ou_1``, ``web:s-*``)."""
        raw = (self.send_allow or "").strip()
        if not raw:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("SKILLJOBS_SEND_ALLOW must be an object: role -> patterns")
        return {
            str(role): [pats] if isinstance(pats, str) else [str(p) for p in pats]
            for role, pats in data.items()
        }

    @cached_property
    def notify_target_map(self) -> dict[str, list[str]]:
        """Alias → Apprise URLs from a JSON object or a JSON/YAML file path."""
        raw = (self.notify_targets or "").strip()
        if not raw:
            return {}
        if not raw.startswith("{"):
            path = Path(raw).expanduser()
            if not path.is_file():
                raise ValueError(f"SKILLJOBS_NOTIFY_TARGETS: file {raw!r} does not exist")
            text = path.read_text(encoding="utf-8")
            if path.suffix.lower() in {".yml", ".yaml"}:
                import yaml

                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        else:
            data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("SKILLJOBS_NOTIFY_TARGETS must be an object: alias -> URL(s)")
        out: dict[str, list[str]] = {}
        for alias, urls in data.items():
            out[str(alias)] = [urls] if isinstance(urls, str) else [str(u) for u in urls]
        return out

    def key(self, *parts: str) -> str:
        """A Redis key under this deployment's prefix."""
        return ":".join((self.redis_prefix, *parts))
