"""The process's connections, built once at the edge (CLI command, app lifespan, worker
startup) and passed down as plain typed objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from jobs.catalog.loader import load_registry
from jobs.counters import SESSION_KEY, Counters
from jobs.crypto import SecretBox, load_or_create_key
from jobs.db import Sessions, create_engine, create_sessionmaker
from jobs.execution.executor import Executor
from jobs.settings import Settings
from jobs.skill import SkillRegistry

if TYPE_CHECKING:
    from arq.connections import ArqRedis, RedisSettings


@dataclass(eq=False)  # identity: the rooms above cache per Services (weak keys)
class Services:
    settings: Settings
    engine: AsyncEngine
    sessionmaker: Sessions
    box: SecretBox
    registry: SkillRegistry
    redis: ArqRedis | None = None
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=30.0))
    # Chat sessions this process has already recorded (saves a lookup per dispatch).
    known_sessions: set[tuple[str, str, str]] = field(default_factory=set)
    # The parked deliveries this process sends (``delivery.outbox.Outbox``), set by a
    # worker; without one a send waits for its rate limit in place.
    outbox: Any = None
    _executor: Executor | None = field(default=None, repr=False)
    # The read replica (``SKILLJOBS_DATABASE_READ_URL``), when one is configured.
    read_engine: AsyncEngine | None = None
    _read_sessionmaker: Sessions | None = field(default=None, repr=False)

    @property
    def read_sessionmaker(self) -> Sessions:
        """Sessions for reads that may lag a little (lists, searches, statistics): the
        replica when configured, else the primary."""
        return self._read_sessionmaker or self.sessionmaker

    def open_read_replica(self) -> None:
        """Connect the read replica named by the settings, if any (lazily: no round trip)."""
        url = self.settings.resolved_database_read_url
        if url and self.read_engine is None:
            self.read_engine = create_engine(url)
            self._read_sessionmaker = create_sessionmaker(self.read_engine)

    @property
    def executor(self) -> Executor:
        """The one Executor of this process (HTTP dispatch, worker and chains share its
        caches), built on first use."""
        if self._executor is None:
            self._executor = Executor(
                settings=self.settings,
                registry=self.registry,
                sessionmaker=self.sessionmaker,
                box=self.box,
                http=self.http,
            )
        return self._executor

    @classmethod
    async def open(
        cls,
        settings: Settings,
        *,
        redis: bool = True,
        registry: SkillRegistry | None = None,
        redis_retries: int = 5,
    ) -> Services:
        """Connect to the database (and Redis unless ``redis=False``) and load the skills."""
        engine = create_engine(settings.resolved_database_url)
        key = load_or_create_key(
            settings.data_dir,
            settings.secret_key.get_secret_value() if settings.secret_key else None,
        )
        svc = cls(
            settings=settings,
            engine=engine,
            sessionmaker=create_sessionmaker(engine),
            box=SecretBox(key),
            registry=registry if registry is not None else load_registry(settings.skill_dirs),
        )
        svc.open_read_replica()
        if redis:
            svc.redis = await connect_redis(settings, retries=redis_retries)
            svc.count_outcomes()
        return svc

    def count_outcomes(self) -> None:
        """Sessions of this process carry the monotonic counters (``jobs.counters``), so the
        delivery ledger counts each outcome it records."""
        if self.redis is not None:
            info = self.sessionmaker.kw.setdefault("info", {})
            info[SESSION_KEY] = Counters(self.redis, self.settings)

    async def close(self) -> None:
        if self._executor is not None:
            await self._executor.aclose()
        await self.http.aclose()
        if self.redis is not None:
            await self.redis.aclose()
        await self.engine.dispose()
        if self.read_engine is not None:
            await self.read_engine.dispose()


async def connect_redis(settings: Settings, *, retries: int = 5) -> ArqRedis:
    from arq.connections import create_pool

    url = settings.redis_url
    if not url:
        # `skilljobs up` leaves the URL of its embedded Redis here for other commands.
        marker = settings.data_dir / "redis" / "url"
        if marker.exists():
            url = marker.read_text().strip()
    if not url:
        raise RuntimeError(
            "SKILLJOBS_REDIS_URL is not set and no `skilljobs up` is running "
            "(only `skilljobs up` starts the embedded Redis)"
        )
    rs = redis_settings(url)
    rs.conn_retries = retries
    return await create_pool(rs, default_queue_name=settings.queue_name)


def redis_settings(url: str) -> RedisSettings:
    """arq's settings for ``redis://``, ``rediss://`` (TLS), ``unix://`` and
    ``redis+sentinel://[:password@]host:port[,host:port…]/master[/db]``."""
    from arq.connections import RedisSettings

    if not url.startswith("redis+sentinel://"):
        return RedisSettings.from_dsn(url)
    rest = url.removeprefix("redis+sentinel://")
    auth, _, rest = rest.rpartition("@")
    hosts, _, path = rest.partition("/")
    parts = [p for p in path.split("/") if p]
    if not hosts or not parts:
        raise ValueError(
            "a Sentinel URL names its sentinels and master: redis+sentinel://h:26379/mymaster"
        )
    sentinels = []
    for item in hosts.split(","):
        host, _, port = item.rpartition(":")
        sentinels.append((host or item, int(port) if host else 26379))
    user, _, password = auth.partition(":") if auth else ("", "", "")
    return RedisSettings(
        host=sentinels,
        sentinel=True,
        sentinel_master=unquote(parts[0]),
        database=int(parts[1]) if len(parts) > 1 else 0,
        username=unquote(user) or None,
        password=unquote(password) or None,
    )
