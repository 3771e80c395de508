"""Errors as the §5 envelope: ``{"ok": false, "error", "error_type", ...}`` with a 4xx/5xx."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class ApiError(Exception):
    """Raised by handlers; answered as an error envelope with ``status_code``."""

    def __init__(
        self, status_code: int, error: str, error_type: str = "recoverable", **extra: Any
    ) -> None:
        super().__init__(error)
        self.status_code = status_code
        self.error = error
        self.error_type = error_type
        self.extra = extra


def envelope(
    status_code: int, error: str, error_type: str = "recoverable", **extra: Any
) -> JSONResponse:
    body = {"ok": False, "error": error, "error_type": error_type, **extra}
    return JSONResponse(body, status_code=status_code)


def not_found(what: str) -> ApiError:
    return ApiError(404, f"{what} not found")
