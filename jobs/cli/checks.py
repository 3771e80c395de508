"""``skilljobs doctor``: checks of a deployment's configuration and services.

Each check is a small function returning a :class:`Check` (or ``None`` when it does not
apply), so the command, the tests and other tools can call them one by one. Checks only
read: they never create the database, the key file or any directory, and never print a
credential.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import logging
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr, ValidationError

from jobs.catalog.loader import load_registry
from jobs.cli.envs import check_skill_envs
from jobs.cli.errors import mask_url
from jobs.cli.state import apply_state
from jobs.db import create_engine
from jobs.execution import sandbox
from jobs.migrate import alembic_config, current_revision, head_revision
from jobs.settings import Settings

UPGRADE_FIX = "run `skilljobs db upgrade`"
FERNET_FIX = (
    'generate one with: python -c "from cryptography.fernet import Fernet; '
    'print(Fernet.generate_key().decode())"'
)
AOF_FIX = (
    "queued jobs are re-enqueued from the database by the reconciler, but enable AOF: "
    "redis-server --appendonly yes --appendfsync everysec"
)

# Channel → the settings it needs (all or none), and the API bases it talks to.
CHANNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "telegram": (("telegram_bot_token",), ("telegram_api_base",)),
    "feishu": (("feishu_app_id", "feishu_app_secret"), ("feishu_api_base",)),
    "wecom": (("wecom_corp_id", "wecom_corp_secret", "wecom_agent_id"), ("wecom_api_base",)),
    "dingtalk": (
        ("dingtalk_app_key", "dingtalk_app_secret", "dingtalk_robot_code"),
        ("dingtalk_api_base", "dingtalk_oapi_base"),
    ),
}

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,62})"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?$")


class Status(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"

    @property
    def symbol(self) -> str:
        return {"ok": "✓", "warn": "!", "fail": "✗"}[self.value]


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, how it went, and what to do about it."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {**asdict(self), "status": self.status.value}


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def warn(name: str, detail: str, fix: str = "") -> Check:
    return Check(name, Status.WARN, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)


def env_name(field: str) -> str:
    return "SKILLJOBS_" + field.upper()


def _value(settings: Settings, field: str) -> str:
    v = getattr(settings, field)
    if isinstance(v, SecretStr):
        v = v.get_secret_value()
    return "" if v is None else str(v).strip()


def is_sqlite(settings: Settings) -> bool:
    return settings.resolved_database_url.startswith("sqlite")


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- settings, secrets, directories ---------------------------------------------------


def check_settings(**overrides: Any) -> tuple[Settings | None, Check]:
    """Build the settings from the environment / ``.env`` (``overrides`` win)."""

    try:
        settings = apply_state(Settings(**overrides))
    except ValidationError as exc:
        problems = "; ".join(
            f"{env_name(str(e['loc'][0])) if e['loc'] else 'settings'}: {e['msg']}"
            for e in exc.errors()
        )
        return None, fail("settings", problems, "fix the variable(s) named above")
    except Exception as exc:  # an unreadable .env, …
        return None, fail("settings", str(exc), "fix the environment or the .env file")
    return settings, ok("settings", "SKILLJOBS_* variables parsed")


def _valid_fernet(key: bytes) -> bool:
    from cryptography.fernet import Fernet

    try:
        Fernet(key)
    except ValueError:
        return False
    return True


def check_secret_key(settings: Settings) -> Check:
    name = "secret key"
    configured = _value(settings, "secret_key")
    if configured:
        if not _valid_fernet(configured.encode()):
            return fail(name, "SKILLJOBS_SECRET_KEY is not a valid Fernet key", FERNET_FIX)
        return ok(name, "SKILLJOBS_SECRET_KEY is set")
    path = settings.data_dir / "secret.key"
    exists = path.is_file()
    fix = (
        "set the same SKILLJOBS_SECRET_KEY on every process (each host generating its own key "
        "cannot read the others' secrets): "
        + (f"keep the existing key, the content of {path}" if exists else FERNET_FIX)
    )
    if exists and not _valid_fernet(path.read_bytes().strip()):
        return fail(name, f"{path} does not hold a valid Fernet key", f"restore it; {fix}")
    if not is_sqlite(settings):  # a shared database: every process needs the same key
        what = f"using the generated {path}" if exists else "not set and no key file exists"
        return warn(name, f"{what}, with a shared database", fix)
    if exists:
        return ok(name, f"generated key in {path}")
    return ok(name, f"not set: a key will be generated into {path} on first run")


def check_directories(settings: Settings) -> Check:
    """The data dir and the workspace root must be writable (or creatable)."""
    dirs = {"data dir": settings.data_dir.resolve(), "workspaces": settings.resolved_workspace_root}
    problems = []
    for label, path in dirs.items():
        probe = path
        while not probe.exists() and probe.parent != probe:
            probe = probe.parent
        if not probe.is_dir():
            problems.append(f"{label} {path}: {probe} is not a directory")
        elif not os.access(probe, os.W_OK | os.X_OK):
            problems.append(f"{label} {path}: {probe} is not writable")
    if problems:
        return fail(
            "directories",
            "; ".join(problems),
            "fix ownership/permissions, or set SKILLJOBS_DATA_DIR / SKILLJOBS_WORKSPACE_ROOT",
        )
    return ok("directories", ", ".join(f"{k} {v}" for k, v in dirs.items()))


# --- database -------------------------------------------------------------------------


def _db_display(settings: Settings) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(settings.resolved_database_url).render_as_string(hide_password=True)
    except Exception:
        return mask_url(settings.resolved_database_url)


def _missing_sqlite_file(settings: Settings) -> bool:
    from sqlalchemy.engine import make_url

    try:
        url = make_url(settings.resolved_database_url)
    except Exception:  # not a URL at all: check_database says so
        return False
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return False
    return not Path(url.database).exists()


async def check_database(settings: Settings, timeout_sec: float = 5.0) -> Check:
    """Connect and ``SELECT 1`` within ``timeout_sec`` seconds."""
    from sqlalchemy import text

    name, shown = "database", _db_display(settings)
    if _missing_sqlite_file(settings):
        return warn(
            name, f"{shown}: the file does not exist yet", f"{UPGRADE_FIX} (or `skilljobs up`)"
        )
    fix = "check SKILLJOBS_DATABASE_URL (host, port, user, password, database) and the server"
    try:
        engine = create_engine(settings.resolved_database_url)
    except Exception as exc:
        return fail(
            name,
            f"{shown}: {exc}",
            "SKILLJOBS_DATABASE_URL must be a PostgreSQL or SQLite URL: "
            "postgresql://user:password@host:5432/name or sqlite:///path/to/file.db",
        )
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_sec):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    except TimeoutError:
        return fail(name, f"{shown}: no answer within {timeout_sec:g} s", fix)
    except Exception as exc:
        return fail(name, f"{shown}: {_first_line(exc)}", fix)
    finally:
        await engine.dispose()
    return ok(name, f"{shown} reachable ({(time.perf_counter() - started) * 1000:.0f} ms)")


async def check_read_replica(settings: Settings, timeout_sec: float = 5.0) -> Check | None:
    """When ``SKILLJOBS_DATABASE_READ_URL`` is set: reachable, a replica, and how far behind."""
    url = settings.resolved_database_read_url
    if not url:
        return None
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    name, shown = "read replica", make_url(url).render_as_string(hide_password=True)
    fix = "check SKILLJOBS_DATABASE_READ_URL, or unset it to read from the primary"
    engine = create_engine(url)
    try:
        async with asyncio.timeout(timeout_sec), engine.connect() as conn:
            if conn.dialect.name != "postgresql":
                return fail(name, f"{shown}: a read replica must be PostgreSQL", fix)
            row = (
                await conn.execute(
                    text(
                        "SELECT pg_is_in_recovery(), "
                        "EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())"
                    )
                )
            ).one()
    except TimeoutError:
        return fail(name, f"{shown}: no answer within {timeout_sec:g} s", fix)
    except Exception as exc:
        return fail(name, f"{shown}: {_first_line(exc)}", fix)
    finally:
        await engine.dispose()
    if not row[0]:
        return warn(name, f"{shown} is not in recovery (a primary, not a replica)", fix)
    lag = "nothing replayed yet" if row[1] is None else f"last replay {float(row[1]):.1f} s ago"
    return ok(name, f"{shown} is a replica ({lag})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def check_migrations(settings: Settings, timeout_sec: float = 5.0) -> Check:
    """The schema must be at the head revision this version ships."""
    from alembic.script import ScriptDirectory

    name, head = "migrations", head_revision()
    if _missing_sqlite_file(settings):
        return warn(name, "database not created yet", UPGRADE_FIX)
    engine = create_engine(settings.resolved_database_url)
    try:
        async with asyncio.timeout(timeout_sec):
            current = await current_revision(engine)
    except Exception as exc:
        return fail(
            name, f"cannot read the schema revision: {_first_line(exc)}", "fix the database"
        )
    finally:
        await engine.dispose()
    if current == head:
        return ok(name, f"schema at head revision {head}")
    if current is None:
        return fail(name, f"database is not migrated (head is {head})", UPGRADE_FIX)
    try:
        ScriptDirectory.from_config(alembic_config("")).get_revision(current)
    except Exception:
        return fail(
            name,
            f"database is at revision {current}, unknown to this version (expects {head})",
            "run the skilljobs release that migrated this database",
        )
    return fail(name, f"database at revision {current}, head is {head}", UPGRADE_FIX)


# --- Redis ----------------------------------------------------------------------------


@contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """Keep a library's log records (which may quote a URL) out of the output."""
    log = logging.getLogger(logger)
    was, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was


async def _redis(settings: Settings, timeout_sec: float, *commands: tuple[str, ...]) -> list[Any]:
    from redis.asyncio import Redis

    client = Redis.from_url(
        settings.redis_url or "",
        socket_connect_timeout=timeout_sec,
        socket_timeout=timeout_sec,
        decode_responses=True,
    )
    try:
        async with asyncio.timeout(timeout_sec):
            return [await client.execute_command(*cmd) for cmd in commands]
    finally:
        await client.aclose()


async def check_redis(settings: Settings, timeout_sec: float = 5.0) -> Check:
    name = "redis"
    if not settings.redis_url:
        detail = (
            "SKILLJOBS_REDIS_URL not set: embedded Redis will be started by `skilljobs up`; "
            "workers need SKILLJOBS_REDIS_URL"
        )
        if is_sqlite(settings):
            return ok(name, detail)
        return warn(name, detail, "set SKILLJOBS_REDIS_URL (redis://host:6379/0)")
    shown = mask_url(settings.redis_url)
    fix = "check SKILLJOBS_REDIS_URL (host, port, password, TLS) and that the server is up"
    try:
        await _redis(settings, timeout_sec, ("PING",))
    except TimeoutError:
        return fail(name, f"{shown}: no answer within {timeout_sec:g} s", fix)
    except Exception as exc:
        return fail(name, f"{shown}: {_first_line(exc)}", fix)
    return ok(name, f"{shown} answers PING")


async def check_redis_persistence(settings: Settings, timeout_sec: float = 5.0) -> Check | None:
    """AOF (or at least RDB snapshots) keeps the queue across a Redis restart."""
    name = "redis persistence"
    if not settings.redis_url:
        return None
    try:
        aof, save = await _redis(
            settings, timeout_sec, ("CONFIG", "GET", "appendonly"), ("CONFIG", "GET", "save")
        )
    except Exception as exc:
        return warn(name, f"cannot read the persistence settings ({_first_line(exc)})", AOF_FIX)
    if _config_value(aof, "appendonly").lower() == "yes":
        return ok(name, "append-only file (AOF) enabled")
    if rules := _config_value(save, "save").strip():
        return ok(name, f"RDB snapshots ({rules}); AOF would lose less")
    return warn(name, "neither AOF nor RDB snapshots are enabled", AOF_FIX)


REDIS_AUTH_FIX = (
    "give Redis a password (requirepass; compose: REDIS_PASSWORD in .env) and put it in "
    "SKILLJOBS_REDIS_URL: redis://:PASSWORD@host:6379/0"
)


def _without_credentials(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        return None  # sentinel and other forms: not probed
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=host))


async def check_redis_auth(settings: Settings, timeout_sec: float = 5.0) -> Check | None:
    """A Redis that answers without a password lets anyone who reaches it plant, cancel or
    read jobs: warn about it."""
    name = "redis auth"
    bare = _without_credentials(settings.redis_url or "") if settings.redis_url else None
    if bare is None:
        return None
    probe = settings.model_copy(update={"redis_url": bare})
    try:
        await _redis(probe, timeout_sec, ("PING",))
    except Exception as exc:
        text = str(exc).lower()
        if "noauth" in text or "authentication" in text or "auth" in type(exc).__name__.lower():
            return ok(name, "Redis refuses clients without a password")
        return warn(name, f"could not tell whether Redis needs a password ({_first_line(exc)})")
    return warn(
        name,
        "Redis answers clients without a password: anyone who can reach it can plant, "
        "cancel or read jobs",
        REDIS_AUTH_FIX,
    )


def _config_value(reply: object, key: str) -> str:
    if isinstance(reply, dict):
        return str(reply.get(key, ""))
    if isinstance(reply, list | tuple) and len(reply) >= 2:
        return str(reply[1])
    return ""


# --- skills, channels, notify, HTTP, fetch policy, LLM ----------------------------------


def check_skills(settings: Settings) -> Check:
    name = "skills"
    missing = [str(d) for d in settings.skill_dirs if not d.is_dir()]
    if missing:
        return fail(
            name,
            f"skill folder(s) not found: {', '.join(missing)}",
            "fix SKILLJOBS_SKILLS_PATH (folders separated by the OS path separator)",
        )
    try:
        registry = load_registry(settings.skill_dirs)
    except Exception as exc:
        return fail(
            name, f"loading skills failed: {_first_line(exc)}", "run `skilljobs skills check DIR`"
        )
    if errors := registry.errors():
        listed = "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())[:10])
        more = f" (+{len(errors) - 10} more)" if len(errors) > 10 else ""
        return fail(
            name,
            f"{len(errors)} of {len(registry)} skill(s) cannot load: {listed}{more}",
            "fix them; `skilljobs skills check DIR` shows the details",
        )
    problems = list(getattr(registry, "problems", []))
    warned = [s.name for s in registry if s.warnings]
    if problems or warned:
        notes = problems[:5] + ([f"warnings in: {', '.join(warned[:10])}"] if warned else [])
        return warn(
            name,
            f"{len(registry)} skill(s) loaded; " + "; ".join(notes),
            "`skilljobs skills list` shows the warnings",
        )
    if not len(registry):
        return warn(name, "no skills found", "set SKILLJOBS_SKILLS_PATH")
    return ok(name, f"{len(registry)} skill(s) loaded")


def check_sandbox(settings: Settings) -> Check:
    """Whether untrusted skills can run in the sandbox here, and which skills are trusted."""
    name = "sandbox"
    mode = sandbox.sandbox_mode(settings)
    trusted_dirs = ", ".join(str(d) for d in settings.trusted_skill_dirs[1:]) or "none"
    if mode == "none":
        return warn(
            name,
            "SKILLJOBS_SANDBOX=none: every skill runs as the worker, with its files and network",
            "unset SKILLJOBS_SANDBOX to run untrusted skills in bubblewrap",
        )
    if mode != "bwrap":
        return fail(name, f"SKILLJOBS_SANDBOX={mode!r} is not known", "use bwrap (the default)")
    try:
        box = sandbox.Sandbox.from_settings(settings)
    except sandbox.SandboxUnavailable as exc:
        return fail(name, str(exc), "fix SKILLJOBS_SANDBOX_NETWORK")
    problem = box.problem()
    where = " (in a container)" if in_container() else ""
    if problem is not None:
        return fail(
            name,
            f"untrusted skills are refused{where}: {problem}",
            "install bubblewrap and slirp4netns, allow user namespaces, or mark trusted skill "
            "folders (SKILLJOBS_SKILLS_PATH=bundled:trusted=/srv/own-skills)",
        )
    counts = _trust_counts(settings)
    return ok(
        name,
        f"bubblewrap works{where}; network: {box.network}; {counts}; trusted paths: "
        f"bundled, {trusted_dirs}",
    )


def in_container() -> bool:
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


def _trust_counts(settings: Settings) -> str:
    try:
        registry = load_registry(settings.skill_dirs)
    except Exception:
        return "skills not loaded"
    modes = [sandbox.run_mode(s, settings) for s in registry]
    names = [m for m, _why in modes]
    text = f"{names.count('sandboxed')} skill(s) sandboxed, {names.count('trusted')} trusted"
    if n := sum(1 for m in modes if m == ("sandboxed", sandbox.IN_PROCESS_REASON)):
        text += f" ({n} of the sandboxed: in-process Python handlers, run by the sandbox runner)"
    return text


def check_channel(settings: Settings, channel: str) -> Check:
    """All of a channel's credentials, or none; its API bases must be http(s) URLs."""
    required, bases = CHANNELS[channel]
    name = f"channel {channel}"
    present = [f for f in required if _value(settings, f)]
    if not present:
        return ok(name, "not configured")
    if missing := [env_name(f) for f in required if f not in present]:
        return fail(
            name,
            f"partly configured: {', '.join(missing)} is missing",
            f"set {', '.join(missing)}, or unset the other {channel.title()} variables",
        )
    problems = []
    for field in bases:
        base = urlsplit(_value(settings, field))
        if base.scheme not in {"http", "https"} or not base.hostname:
            problems.append(f"{env_name(field)}={_value(settings, field)!r} is not an http(s) URL")
    if channel == "wecom" and not _value(settings, "wecom_agent_id").isdigit():
        problems.append("SKILLJOBS_WECOM_AGENT_ID must be the app's numeric AgentId")
    if problems:
        return fail(name, "; ".join(problems), "fix the variable(s) named above")
    return ok(name, "configured")


def check_notify_targets(settings: Settings) -> Check:
    """Every alias maps to URLs that Apprise recognizes. Only schemes are ever shown."""
    import apprise

    name = "notify targets"
    try:
        targets = settings.notify_target_map
    except Exception as exc:
        return fail(
            name,
            f"SKILLJOBS_NOTIFY_TARGETS cannot be read: {_first_line(exc)}",
            'use a JSON object like {"ops": ["mailto://…", "tgram://…"]} or the path of a '
            "JSON/YAML file holding one",
        )
    if not targets:
        return ok(name, "none configured (notify still accepts bare Apprise URLs)")
    bad, count = [], 0
    with _quiet("apprise"):
        for alias, urls in targets.items():
            if not urls:
                bad.append(f"{alias!r} has no URL")
            for i, url in enumerate(urls, 1):
                count += 1
                if not apprise.Apprise().add(url):
                    bad.append(
                        f"{alias!r} URL #{i} ({_scheme_only(url)}) is not a valid Apprise URL"
                    )
    if bad:
        return fail(name, "; ".join(bad), "fix SKILLJOBS_NOTIFY_TARGETS (Apprise URL formats)")
    return ok(name, f"{len(targets)} alias(es), {count} URL(s): {', '.join(sorted(targets))}")


def _scheme_only(url: str) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    valid = re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,31}", scheme)
    return f"{scheme}://…" if valid else "no scheme"


def check_api_token(settings: Settings, host: str | None = None) -> Check:
    """Required when the web app binds a non-loopback address; informational otherwise."""
    name = "api token"
    token = _value(settings, "api_token")
    if token and len(token) < 16:
        return warn(
            name,
            f"SKILLJOBS_API_TOKEN is short ({len(token)} chars)",
            'use a long random value: python -c "import secrets; print(secrets.token_urlsafe(32))"',
        )
    if token:
        return ok(name, "SKILLJOBS_API_TOKEN is set")
    if host is not None and not is_loopback(host):
        return fail(
            name,
            f"not set, and the web app is to bind {host}",
            "set SKILLJOBS_API_TOKEN, or bind to 127.0.0.1",
        )
    return ok(
        name,
        "not set: `skilljobs web` on loopback generates one (api_token, 0600, in the data "
        "dir; every request needs it); set it to bind beyond loopback",
    )


def check_fetch_allow_hosts(settings: Settings) -> Check:
    name = "fetch allow-list"
    entries = settings.allow_hosts
    if not entries:
        return ok(name, "empty: only public https hosts are fetched")
    if bad := [f"{e!r}: {why}" for e in entries if (why := _allow_entry_problem(e))]:
        return fail(
            name,
            "; ".join(bad),
            "SKILLJOBS_FETCH_ALLOW_HOSTS is a comma list of host or host:port "
            "(IPv6 as [addr] or [addr]:port), without scheme or path",
        )
    return ok(name, f"{len(entries)} host(s) exempt from the outbound policy: {', '.join(entries)}")


def _allow_entry_problem(entry: str) -> str | None:
    if "://" in entry or "/" in entry or "@" in entry:
        return "must be host or host:port, without scheme, path or credentials"
    host, port = entry, None
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if rest and not rest.startswith(":"):
            return "expected [IPv6] or [IPv6]:port"
        port = rest[1:] if rest else None
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is not a number from 1 to 65535"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    return None if _HOSTNAME.match(host) else "not a valid host name"


def check_llm(settings: Settings) -> Check:
    name = "llm provider"
    fields = ("llm_provider", "llm_key", "llm_model")
    present = [f for f in fields if _value(settings, f)]
    if not present and not _value(settings, "llm_base"):
        return ok(name, "not configured: skills get provider=None")
    if missing := [env_name(f) for f in fields if f not in present]:
        return warn(
            name,
            f"partly configured: {', '.join(missing)} not set",
            "set them, or unset the other SKILLJOBS_LLM_* variables",
        )
    return ok(name, f"{_value(settings, 'llm_provider')} / {_value(settings, 'llm_model')}")


def check_logging(settings: Settings) -> Check:
    name = "logging"
    problems = []
    if settings.log_format not in {"text", "json"}:
        problems.append(f"SKILLJOBS_LOG_FORMAT={settings.log_format!r} is not text or json")
    if not isinstance(logging.getLevelName(settings.log_level.upper()), int):
        problems.append(f"SKILLJOBS_LOG_LEVEL={settings.log_level!r} is not a log level")
    if problems:
        return fail(name, "; ".join(problems), "use text|json and DEBUG|INFO|WARNING|ERROR")
    return ok(name, f"{settings.log_format}, {settings.log_level.upper()}")


# --- the whole report -----------------------------------------------------------------


async def run_checks(
    settings: Settings, *, host: str | None = None, timeout_sec: float = 5.0
) -> list[Check]:
    """Every check, in report order. An unreachable service skips the checks that need it."""
    checks: list[Check | None] = [check_secret_key(settings), check_directories(settings)]
    db = await check_database(settings, timeout_sec)
    checks.append(db)
    if db.status is Status.FAIL:
        checks.append(warn("migrations", "not checked: the database is unreachable"))
    else:
        checks.append(await check_migrations(settings, timeout_sec))
    checks.append(await check_read_replica(settings, timeout_sec))
    redis = await check_redis(settings, timeout_sec)
    checks.append(redis)
    if redis.status is not Status.FAIL:
        checks.append(await check_redis_auth(settings, timeout_sec))
        checks.append(await check_redis_persistence(settings, timeout_sec))
    checks.append(check_skills(settings))
    checks.append(check_sandbox(settings))
    checks.append(check_skill_envs(settings, ok, warn))
    checks.extend(check_channel(settings, c) for c in CHANNELS)
    checks += [
        check_notify_targets(settings),
        check_api_token(settings, host),
        check_fetch_allow_hosts(settings),
        check_llm(settings),
        check_logging(settings),
    ]
    return [c for c in checks if c is not None]


def failed(checks: list[Check]) -> bool:
    return any(c.status is Status.FAIL for c in checks)


def render(checks: list[Check]) -> str:
    """The plain-text report: ``✓ name: detail`` and, under a problem, ``→ fix``."""
    lines = []
    for c in checks:
        lines.append(f"{c.status.symbol} {c.name}: {c.detail}")
        if c.fix and c.status is not Status.OK:
            lines.append(f"    → {c.fix}")
    return "\n".join(lines)
