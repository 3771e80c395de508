"""SKILLJOBS_PUBLIC_URL gives the platform adapters signed download links for files that do
not fit the channel; the link opens the file through /files/ (and nothing outside the
workspaces gets one)."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx

from delivery.channels.registry import build_channels
from jobs.links import FILE_KIND, file_link_key, file_path, verify
from tests.helpers.settings import make_settings


async def test_registry_passes_link_for_when_public_url_is_set(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path,
        redis_url=None,
        prefix="p",
        telegram_bot_token="1:x",
        public_url="https://jobs.example.com/",
    )
    root = Path(settings.resolved_workspace_root)
    root.mkdir(parents=True, exist_ok=True)
    inside = root / "r1" / "s1" / "big.zip"
    inside.parent.mkdir(parents=True)
    inside.write_bytes(b"zip")
    async with httpx.AsyncClient() as http:
        chans = build_channels(settings, http)
        tg = chans["telegram"]
        link_for = getattr(tg, "link_for", None)
        assert link_for is not None
        url = link_for(str(inside))
        assert url is not None and url.startswith("https://jobs.example.com/files/")
        token = url.rsplit("/", 1)[1]
        claims = verify(file_link_key(settings), token, FILE_KIND)
        assert file_path(file_link_key(settings), claims) == str(inside.resolve())
        # the readable part carries an opaque id, not the server's path
        payload = base64.urlsafe_b64decode(token.split(".")[0] + "==").decode()
        assert "big.zip" not in payload and str(root) not in payload and '"p"' not in payload
        assert link_for(str(tmp_path / "elsewhere.zip")) is None
        unset = make_settings(tmp_path, redis_url=None, prefix="p", telegram_bot_token="1:x")
        assert getattr(build_channels(unset, http)["telegram"], "link_for", None) is None
