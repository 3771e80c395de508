"""Running the dashboard app under uvicorn (``skilljobs web``)."""

from __future__ import annotations

import ipaddress

from jobs.settings import Settings


class UnsafeBind(ValueError):
    """Binding beyond loopback without an API token would expose the ops API."""


def is_loopback(host: str) -> bool:
    if host in {"localhost", "localhost.localdomain"}:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings, host: str) -> None:
    """Raise ``UnsafeBind`` (one-line reason) for a non-loopback host without a token."""
    token = settings.api_token.get_secret_value() if settings.api_token else ""
    if not token and not is_loopback(host):
        raise UnsafeBind(
            f"refusing to listen on {host}: set SKILLJOBS_API_TOKEN first "
            "(without a token only 127.0.0.1 / ::1 / localhost are allowed)"
        )


def build_config(settings: Settings, host: str = "127.0.0.1", port: int = 8000):  # type: ignore[no-untyped-def]
    import uvicorn

    from dashboard.app import create_app

    check_bind(settings, host)
    return uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        proxy_headers=False,
        # Event-stream URLs may carry ?token=: request lines are never logged.
        access_log=False,
        # Open event streams would otherwise hold shutdown forever.
        timeout_graceful_shutdown=5,
    )


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the dashboard (blocking). Raises ``UnsafeBind`` before binding anything."""
    import uvicorn

    uvicorn.Server(build_config(settings, host, port)).run()


async def serve_async(settings: Settings, host: str = "127.0.0.1", port: int = 8000) -> None:
    """The same, inside a running event loop (``skilljobs up`` runs it next to a worker)."""
    import uvicorn

    await uvicorn.Server(build_config(settings, host, port)).serve()
