"""Failures of the services a command needs, said in one or two lines that name the setting
and the fix (exit code 2) instead of a traceback; ``skilljobs --debug …`` shows it."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from jobs.cli.i18n import tr
from jobs.settings import Settings

#: exit code of a command that could not reach or use a service it needs
SERVICE_EXIT = 2

_DB_MODULES = ("sqlalchemy", "asyncpg", "aiosqlite", "sqlite3", "psycopg", "alembic")
_REDIS_MODULES = ("redis", "arq")


@dataclass
class Explained:
    message: str
    fix: str
    code: int = SERVICE_EXIT


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _modules(exc: BaseException) -> list[str]:
    """The modules the traceback of ``exc`` (and its causes) passed through, innermost first."""
    out: list[str] = []
    for e in _chain(exc):
        mods = [f.f_globals.get("__name__", "") for f, _ in traceback.walk_tb(e.__traceback__)]
        out = list(reversed(mods)) + out
        out.insert(0, type(e).__module__)
    return out


def _service(exc: BaseException) -> str | None:
    for mod in _modules(exc):
        root = mod.split(".", 1)[0]
        if root in _REDIS_MODULES:
            return "redis"
        if root in _DB_MODULES:
            return "database"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _shown(url: str | None) -> str:
    return mask_url(url or "")


def mask_url(url: str) -> str:
    """``scheme://user:****@host/path``: the password replaced, the rest kept."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        host = f"[{host}]" if ":" in host else host
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:****@{host}{port}"))
    except ValueError:
        return url.split("://", 1)[0] + "://…"


def explain(exc: BaseException, settings: Settings | None) -> Explained | None:
    """What went wrong with which setting, or None when ``exc`` is not a service's failure."""
    from sqlalchemy import exc as sa_exc

    db_url = settings.resolved_database_url if settings is not None else None
    redis_url = settings.redis_url if settings is not None else None
    for e in _chain(exc):
        if isinstance(e, sa_exc.ArgumentError | sa_exc.NoSuchModuleError) or (
            isinstance(e, ModuleNotFoundError) and _service(exc) == "database"
        ):
            return Explained(
                tr(
                    "SKILLJOBS_DATABASE_URL is not a usable database URL ({reason})",
                    reason=_first_line(e),
                ),
                tr(
                    "use postgresql://user:password@host:5432/name or sqlite:///path/to/file.db "
                    "(unset: the SQLite file in SKILLJOBS_DATA_DIR)"
                ),
            )
        text = str(e).lower()
        if "no such table" in text or ("relation" in text and "does not exist" in text):
            return Explained(
                tr("the database at {url} has no skilljobs tables", url=_shown(db_url)),
                tr("run `skilljobs db upgrade` (or start `skilljobs up`, which migrates)"),
            )
        if "redis" in type(e).__module__ and "auth" in type(e).__name__.lower():
            return Explained(
                tr(
                    "Redis at {url} refused the password ({reason})",
                    url=_shown(redis_url),
                    reason=_first_line(e),
                ),
                tr("put the right password in SKILLJOBS_REDIS_URL (redis://:PASSWORD@host:6379/0)"),
            )
    service = _service(exc)
    if service is None and not any(isinstance(e, OSError | TimeoutError) for e in _chain(exc)):
        return None
    reason = _first_line(exc)
    if service == "redis":
        return Explained(
            tr(
                "cannot reach Redis at {url}: {reason}",
                url=_shown(redis_url) or "(unset)",
                reason=reason,
            ),
            tr(
                "start Redis or set SKILLJOBS_REDIS_URL to a reachable one "
                "(`skilljobs up` starts an embedded one; `skilljobs doctor` checks every setting)"
            ),
        )
    if service == "database" or any(
        isinstance(e, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.DBAPIError)
        for e in _chain(exc)
    ):
        return Explained(
            tr("cannot use the database at {url}: {reason}", url=_shown(db_url), reason=reason),
            tr(
                "start the database or fix SKILLJOBS_DATABASE_URL (host, port, user, password, "
                "name); `skilljobs doctor` checks every setting"
            ),
        )
    return Explained(
        tr("a service is unreachable: {reason}", reason=reason),
        tr("check SKILLJOBS_DATABASE_URL and SKILLJOBS_REDIS_URL; `skilljobs doctor` checks them"),
    )
