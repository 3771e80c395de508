"""The ops surface as one ASGI app: JSON API, the dashboard page, live event streams,
Prometheus metrics and health checks. This is where the dashboard is wired together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dashboard import (
    api_audit,
    api_deliveries,
    api_files,
    api_incidents,
    api_jobs,
    api_limits,
    api_misc,
    api_schedules,
    api_skills,
    api_stats,
    api_tokens,
    api_workers,
    latency,
    limit_metrics,
    shared,
)
from dashboard.auth import AuthError, require_token
from dashboard.dispatch_lane import DispatchLane
from dashboard.errors import ApiError, envelope
from dashboard.guard import Guard
from dashboard.metrics import CONTENT_TYPE, Families, Metrics
from dashboard.queries import BadQuery
from dashboard.sync_pool import SyncPool
from dashboard.tokens import TokenKey
from jobs import counters
from jobs.db import db_unavailable
from jobs.queue import rates
from jobs.services import Services
from jobs.settings import Settings

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"

# Same origin only, no inline code: whatever a skill produced can only ever be text.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """Pure ASGI middleware (does not buffer, so event streams keep flowing)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in SECURITY_HEADERS if k not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, _send)


def create_app(
    settings: Settings, *, services: Services | None = None, sync_pool: bool = False
) -> FastAPI:
    """The dashboard app. Without ``services`` the lifespan opens (and closes) its own.
    ``sync_pool``: sync-line dispatches run in ``SKILLJOBS_SYNC_PROCESSES`` executor
    processes (``skilljobs web``/``up``) instead of on this event loop."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = None
        if sync_pool and settings.sync_processes > 0:
            pool = SyncPool(settings, settings.sync_processes)
            pool.start()
            app.state.sync_pool = pool
        try:
            if services is not None:
                app.state.services = services
                try:
                    yield
                finally:
                    await app.state.aggregates.close()
                return
            opened = await Services.open(settings)
            app.state.services = opened
            try:
                yield
            finally:
                await app.state.aggregates.close()
                await opened.close()
        finally:
            if pool is not None:
                app.state.sync_pool = None
                await asyncio.to_thread(pool.close)

    app = FastAPI(
        title="skilljobs",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # Behind the token like the rest of the API (the guard decides by path).
        openapi_url="/api/v1/openapi.json",
    )
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.aggregates = shared.Shared()
    app.state.token_key = TokenKey(settings)
    if services is not None:
        app.state.services = services

    _install_error_handlers(app)
    # The guard runs before anything reads the body; security headers wrap even its answers.
    # Inside the guard, a valid dispatch goes straight to the dispatcher.
    app.add_middleware(DispatchLane)
    app.add_middleware(Guard, settings=settings, tokens=app.state.token_key)
    app.add_middleware(SecurityHeaders)

    app.include_router(api_misc.open_router)
    app.include_router(api_files.router)  # the signed link is the authorization
    app.include_router(api_misc.stream_router)
    app.include_router(api_jobs.router, dependencies=[Depends(require_token)])
    app.include_router(api_schedules.router, dependencies=[Depends(require_token)])
    app.include_router(api_incidents.router, dependencies=[Depends(require_token)])
    app.include_router(api_limits.router, dependencies=[Depends(require_token)])
    app.include_router(api_misc.router, dependencies=[Depends(require_token)])
    app.include_router(api_tokens.router, dependencies=[Depends(require_token)])
    app.include_router(api_stats.router, dependencies=[Depends(require_token)])
    app.include_router(api_audit.router, dependencies=[Depends(require_token)])
    app.include_router(api_deliveries.router, dependencies=[Depends(require_token)])
    app.include_router(api_workers.router, dependencies=[Depends(require_token)])
    app.include_router(api_skills.router, dependencies=[Depends(require_token)])

    @app.get("/metrics", dependencies=[Depends(require_token)], include_in_schema=False)
    async def metrics(request: Request) -> Response:
        svc: Services = request.app.state.services
        waits, parked, totals = await asyncio.gather(
            latency.ratelimit_waits(svc.redis, svc.settings.key),
            latency.ratelimit_parked(svc.redis, svc.settings.key),
            counters.read(svc.redis, svc.settings),
        )
        items = await rates.items(svc)  # settings + run-time limits
        concurrency = {i["key"]: i["concurrency"] for i in items if i["concurrency"]}
        body = await request.app.state.metrics.render(
            svc.sessionmaker,
            request.app.state.aggregates,
            limits=concurrency,
            ratelimit_waits=waits,
            ratelimit_parked=parked,
            totals=totals,
            pending_stale_after=float(svc.settings.delivery_pending_stale_sec),
        )
        body += generate_latest(Families(limit_metrics.rate_families, {"items": items}))
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        # The page holds no data (it asks for the token and reads the API), so it is open.
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-store"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> Response:
        return envelope(exc.status_code, exc.error, exc.error_type, **exc.extra)

    @app.exception_handler(AuthError)
    async def _auth_error(_: Request, exc: AuthError) -> Response:
        resp = envelope(401, str(exc), "config")
        resp.headers["www-authenticate"] = "Bearer"
        return resp

    @app.exception_handler(BadQuery)
    async def _bad_query(_: Request, exc: BadQuery) -> Response:
        return envelope(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
            problems.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        return envelope(422, "invalid request: " + "; ".join(problems))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        text = exc.detail if isinstance(exc.detail, str) else "request failed"
        return envelope(exc.status_code, text)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        if db_unavailable(exc) or isinstance(exc, RedisConnectionError | RedisTimeoutError):
            # the database or Redis away (restarting, out of connections): nothing was done,
            # and the same request is worth sending again in a moment
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
            return envelope(
                503,
                f"temporarily unavailable ({type(exc).__name__}); try again in a moment",
                "transient",
            )
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return envelope(500, f"internal error ({type(exc).__name__})", "transient")
