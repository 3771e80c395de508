"""cat_picture: the URL of a random cat picture (the platform downloads and sends it)."""

from __future__ import annotations

import re
import secrets
from typing import Any
from urllib.parse import quote

BASE = "https://cataas.com/cat"
_TAG = re.compile(r"^[A-Za-z0-9\-]{1,30}$")

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "says": {"type": "string", "description": "Caption drawn on the picture (≤ 60 chars)."},
        "tag": {"type": "string", "description": "Picture tag such as cute or orange."},
    },
}


async def execute(input_data: dict[str, Any], runtime_context: dict[str, Any]) -> dict[str, Any]:
    tag = str(input_data.get("tag") or "").strip()
    says = str(input_data.get("says") or "").strip()[:60]
    if tag and not _TAG.match(tag):
        return {
            "ok": False,
            "error": f"tag {tag!r} is not valid: use letters, digits and '-' (e.g. cute)",
            "error_type": "recoverable",
            "need_param": "tag",
        }
    url = BASE + (f"/{tag}" if tag else "")
    if says:
        url += "/says/" + quote(says, safe="")
    # A random query parameter makes each call a different picture (no shared cache hit).
    url += f"?width=640&r={secrets.token_hex(2)}"
    caption = f"Here is your cat{': ' + says if says else ''}."
    return {
        "ok": True,
        "image_url": url,
        "text": f"Here is your cat:\n\n![a cat]({url})",
        "message": caption,
    }
