"""Long-running commands: ``skilljobs worker``, ``skilljobs web`` and ``skilljobs up``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import sys
from pathlib import Path

import typer
import uvicorn
from pydantic import SecretStr

from chains.demo import install_demo
from dashboard.app import create_app
from dashboard.server import UnsafeBind, server_for
from dashboard.server import check_bind as dashboard_check_bind
from jobs import telemetry
from jobs.cli.common import fail, fail_on, load_settings, run_async
from jobs.cli.embedded import EmbeddedRedis, redis_password, write_private
from jobs.cli.errors import mask_url
from jobs.cli.skills import try_it
from jobs.cli.state import read_state, running, write_state
from jobs.cli.supervise import WorkerProcess
from jobs.db import create_engine
from jobs.logs import setup_logging
from jobs.migrate import upgrade
from jobs.privileges import make_undumpable
from jobs.queue import heap
from jobs.queue.worker import build_worker
from jobs.services import Services
from jobs.settings import Settings
from jobs.skill import SkillRegistry

log = logging.getLogger("skilljobs")


def worker(
    max_jobs: int = typer.Option(
        0, "--max-jobs", help="Skills run at once (default SKILLJOBS_WORKER_MAX_JOBS)."
    ),
    burst: bool = typer.Option(False, "--burst", help="Drain the queue, then exit."),
    no_scheduler: bool = typer.Option(
        False, "--no-scheduler", help="Do not run the chain scheduler here."
    ),
) -> None:
    """Run an arq worker (and the chain scheduler) against SKILLJOBS_REDIS_URL."""
    settings = load_settings()
    setup_logging(settings)
    telemetry.setup("skilljobs-worker")
    private_files(settings)
    lower_priority(settings.worker_nice)
    if not settings.redis_url and not embedded_url_file(settings).exists():
        fail(
            "SKILLJOBS_REDIS_URL is not set: point workers at your Redis "
            "(or use `skilljobs up`, which starts an embedded one)"
        )

    async def _go() -> None:
        svc = await _open(settings)
        try:
            w = build_worker(
                svc, burst=burst, max_jobs=max_jobs or None, scheduler=not no_scheduler
            )
            with contextlib.suppress(asyncio.CancelledError):
                await w.async_run()
            await w.close()
        finally:
            await Services.close(svc)

    run_async(_go)


def lower_priority(nice: int) -> None:
    """Run this process at CPU niceness ``nice`` (never raising its priority)."""
    with contextlib.suppress(OSError, AttributeError):  # (no setpriority: not POSIX)
        if nice > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, nice)


def web(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
) -> None:
    """Serve the dashboard, the JSON API and /metrics."""
    settings = load_settings()
    setup_logging(settings)
    telemetry.setup("skilljobs-web")
    private_files(settings)
    check_bind(settings, host)  # a public address needs a token the operator chose
    if not settings.api_token:
        admin_token(settings)
        typer.echo(f"API token (admin): {settings.data_dir / 'api_token'}", err=True)

    async def _go() -> None:
        svc = await _open(settings)
        try:
            await _serve_web(svc, host, port)
        finally:
            await svc.close()

    run_async(_go, fast_loop=True)


def up(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(int(os.environ.get("PORT", "8000")), "--port"),
    max_jobs: int = typer.Option(0, "--max-jobs"),
    redis_port: int | None = typer.Option(
        None,
        "--redis-port",
        min=1,
        max=65535,
        help="Port of the bundled Redis (default SKILLJOBS_EMBEDDED_REDIS_PORT, else a free one).",
    ),
) -> None:
    """Everything in one process tree: embedded Redis and SQLite unless URLs are set,
    migrations, the demo schedule, the web app, and a worker with the scheduler (a child
    process, started again if it exits). Leaves ``state.json`` in the data dir, where every
    other command finds this instance."""
    settings = _settings_for_up()
    setup_logging(settings)
    telemetry.setup("skilljobs")
    private_files(settings)
    embedded = None
    if not settings.redis_url:
        # A password even on loopback: any local account can reach a loopback port.
        password = redis_password(settings.data_dir / "redis.password")
        embedded = EmbeddedRedis(
            settings.data_dir / "redis",
            port=redis_port or settings.embedded_redis_port,
            persist=True,
            password=password,
        )
        try:
            url = embedded.start()
        except RuntimeError as exc:
            fail(str(exc))
            raise
        settings.redis_url = url
        write_private(embedded_url_file(settings), url)  # it holds the password
    token = admin_token(settings)
    check_bind(settings, host)

    async def _go() -> None:
        engine = create_engine(settings.resolved_database_url)
        try:
            await upgrade(engine)
        finally:
            await engine.dispose()
        svc = await _open(settings)
        worker = WorkerProcess(max_jobs=max_jobs, grace_s=settings.worker_grace_sec)
        try:
            await install_demo_schedule(svc)
            server = _web_server(svc, host, port)
            web_task = asyncio.create_task(server.serve())
            # The worker (and the scheduler) in a process of its own: a core of its own.
            worker_task = asyncio.create_task(worker.run())

            write_state(settings, web_url=_base_url(host, port))
            _print_banner(settings, host, port, token, svc.registry)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            stop_waiter = asyncio.create_task(stop.wait())
            await asyncio.wait(
                {web_task, worker_task, stop_waiter}, return_when=asyncio.FIRST_COMPLETED
            )
            typer.echo(
                "\nstopping: running jobs get "
                f"{settings.worker_grace_sec:.0f}s to finish, the rest are handed back…"
            )
            stop_waiter.cancel()
            server.should_exit = True
            await worker.stop()
            for t in (web_task, worker_task):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(t, 15)
        finally:
            with contextlib.suppress(Exception):
                await worker.stop()
            with contextlib.suppress(Exception):
                await svc.close()

    try:
        run_async(_go, fast_loop=True)
    finally:
        if embedded is not None:
            embedded.stop()
            with contextlib.suppress(FileNotFoundError):
                embedded_url_file(settings).unlink()


# --- helpers ------------------------------------------------------------------------------


def _settings_for_up() -> Settings:
    """``up`` starts an instance: it takes nothing from the state file of an earlier one
    but what the environment leaves unset and still holds (database, skills path)."""

    state = read_state(load_settings().data_dir)
    if running(state) and state is not None and state.get("pid") != os.getpid():
        fail(
            f"`skilljobs up` already runs for this data dir (pid {state['pid']}, "
            f"{state.get('web_url')}): stop it first, or use another SKILLJOBS_DATA_DIR"
        )
    settings = load_settings()
    if "redis_url" not in Settings().model_fields_set:
        settings.redis_url = None  # this instance starts its own embedded Redis
    return settings


def _base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}"


def private_files(settings: Settings) -> None:
    """What this process creates is its own: directories 0700, files 0600 (the database,
    keys, tokens, workspaces and their files). State left by an older version is tightened.
    The process is made non-dumpable: skills cannot read its environment or memory."""
    make_undumpable()
    os.umask(0o077)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    targets = [settings.data_dir, settings.resolved_workspace_root]
    db = settings.resolved_database_url
    if db.startswith("sqlite") and ":///" in db:
        name = db.split(":///", 1)[1]
        targets += [Path(name + suffix) for suffix in ("", "-wal", "-shm", "-turns")]
    targets += [settings.data_dir / "secret.key", settings.data_dir / "api_token"]
    targets += [settings.data_dir / "redis.password", embedded_url_file(settings)]
    targets.append(settings.data_dir / "skills.db")
    for path in targets:
        with contextlib.suppress(OSError):  # missing, or not ours to change
            path.chmod(0o700 if path.is_dir() else 0o600)


def embedded_url_file(settings: Settings) -> Path:
    """Where `skilljobs up` leaves its embedded Redis URL for other commands to find."""
    return settings.data_dir / "redis" / "url"


def admin_token(settings: Settings) -> str:
    """The admin token the web app runs with: the configured one, else the one kept
    (0600) in the data dir, generated on first use. There is no tokenless admin."""
    if settings.api_token and settings.api_token.get_secret_value():
        return settings.api_token.get_secret_value()
    token = ensure_local_token(settings)
    settings.api_token = SecretStr(token)
    return token


def ensure_local_token(settings: Settings) -> str:
    path = settings.data_dir / "api_token"
    if path.exists():
        return path.read_text().strip()
    token = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


def check_bind(settings: Settings, host: str) -> None:
    """The dashboard's bind rule (no public address without a token), as a one-line exit."""
    try:
        dashboard_check_bind(settings, host)
    except UnsafeBind as exc:
        fail(str(exc))


async def _open(settings: Settings) -> Services:
    try:
        return await Services.open(settings)
    except Exception as exc:
        fail_on(exc)


def _web_server(svc: Services, host: str, port: int) -> uvicorn.Server:
    # Timeouts, connection cap and descriptor limit of the web app (dashboard.server).
    app = create_app(svc.settings, services=svc, sync_pool=True)
    # The web process serves a stream of short-lived requests over the same import heap
    # as a worker: the same collector policy keeps full collections out of its receipts.
    heap.settle()
    return server_for(svc.settings, host, port, app=app)


async def _serve_web(svc: Services, host: str, port: int) -> None:
    # uvicorn handles SIGINT/SIGTERM itself (graceful shutdown).
    await _web_server(svc, host, port).serve()


async def install_demo_schedule(svc: Services) -> None:
    """Add the bundled demo schedule once (it stays under the operator's control after)."""
    try:
        await install_demo(svc)
    except Exception as exc:
        log.warning("demo schedule not installed: %s", exc)


def _print_banner(
    settings: Settings, host: str, port: int, token: str, registry: SkillRegistry | None = None
) -> None:
    base = _base_url(host, port)
    # The command as the user can paste it (`make run` starts `.venv/bin/skilljobs up`).
    argv0 = sys.argv[0] if sys.argv and sys.argv[0].endswith("skilljobs") else "skilljobs"
    exe = os.path.relpath(argv0) if os.path.isabs(argv0) else argv0
    if exe.startswith(".."):
        exe = argv0
    lines = [
        "",
        "skilljobs is up.",
        f"  dashboard : {base}/?token={token}",
        f"  API token : {token}",
        f"  redis     : {mask_url(settings.redis_url or '')}",
        f"  database  : {settings.resolved_database_url}",
        "",
        *try_it(registry, exe, f"curl -s -H 'Authorization: Bearer {token}' {base}"),
        "",
        "Ctrl-C stops everything.",
    ]
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.command("web")(web)
    app.command("up")(up)
