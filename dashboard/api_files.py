"""``GET /files/<signed token>``: a file delivered to a web session, for whoever holds its link.

The signature is the authorization (no API token): a link names one file, and for a job's
delivery that job's registered artifact; it stops working when it expires, when any byte of
it is changed, or when the file is no longer inside the workspace root.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from sqlalchemy import select

from dashboard.errors import ApiError
from jobs.links import FILE_KIND, LinkError, file_link_key, file_path, verify
from jobs.media import guess_mime
from jobs.models import Artifact
from jobs.services import Services
from jobs.settings import Settings

router = APIRouter()

# Shown in the browser; anything else (HTML, SVG, scripts…) is only ever downloaded.
INLINE_PREFIXES = ("image/png", "image/jpeg", "image/gif", "image/webp", "video/", "audio/")


@router.get("/files/{token}", include_in_schema=False)
async def download(token: str, request: Request) -> FileResponse:
    svc: Services = request.app.state.services
    claims, real = await asyncio.to_thread(_check, svc.settings, token)
    path = str(real)
    job_id = claims.get("j")
    if job_id is not None:
        async with svc.sessionmaker() as s:
            found = await s.scalar(
                select(Artifact.id)
                .where(Artifact.job_id == str(job_id), Artifact.local_path == path)
                .limit(1)
            )
        if found is None:
            raise ApiError(404, "file not found")
    mime = guess_mime(real)
    inline = mime.startswith(INLINE_PREFIXES)
    return FileResponse(
        real,
        media_type=mime if inline else "application/octet-stream",
        filename=real.name,
        content_disposition_type="inline" if inline else "attachment",
        headers={"cache-control": "private, no-store"},
    )


def _check(settings: Settings, token: str) -> tuple[dict[str, Any], Path]:
    """The link's claims and its file, which must still be a file inside the workspace
    root under the very path that was signed (file reads: run in a thread)."""
    key = file_link_key(settings)
    try:
        claims = verify(key, token, FILE_KIND)
    except LinkError as exc:
        raise ApiError(403, str(exc)) from exc
    path = file_path(key, claims)
    if not isinstance(path, str) or not path:
        raise ApiError(403, "this link is not for this use")
    root = Path(os.path.realpath(settings.resolved_workspace_root))
    real = Path(os.path.realpath(path))
    if str(real) != path or not real.is_relative_to(root) or not real.is_file():
        raise ApiError(404, "file not found")
    return claims, real
