"""HTTP skills: one request described by a TOML file, sent through the shared httpx client.

The TOML (flat, or under a ``[request]`` table)::

    method = "POST"                      # default GET
    url = "https://api.example.com/v1/items/{item_id}"
    timeout = 30                         # seconds; the skill's wall clock also bounds it
    content_type = "application/json"    # for a string body
    [headers]
    Authorization = "Bearer {api_token}"
    [query]
    lang = "{lang}"
    [body]                               # JSON body; "{x}" alone keeps x's type
    name = "{name}"
    [response]
    path = "data.items"                  # optional: return only this part of the JSON

``{name}`` placeholders are filled from the input, then the skill's configs (§5.1 order,
then the environment), then ``{workspace}`` / ``{baseDir}``. Without ``body``, POST/PUT/PATCH
send the input as JSON; without ``query``, GET/DELETE send the unused scalar inputs as query
parameters. A JSON answer is the result; text becomes ``{"output": ...}``; a media answer is
saved into the workspace.
"""

from __future__ import annotations

import json
import mimetypes
import re
import secrets
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from jobs.context import lookup_config
from jobs.envelope import failure
from jobs.execution.skill_output import media_kind
from jobs.execution.subproc import OUTPUT_CAP
from jobs.skill import Skill

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_\-]*)\}")
_SPEC_CACHE: dict[str, tuple[int, dict[str, Any]]] = {}
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class TemplateError(ValueError):
    pass


def load_spec(path: Path) -> dict[str, Any]:
    """The request table of the TOML, cached per (path, mtime)."""
    key = str(path)
    mtime = path.stat().st_mtime_ns
    hit = _SPEC_CACHE.get(key)
    if hit and hit[0] == mtime:
        return hit[1]
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    req = data.get("request")
    spec: dict[str, Any] = req if isinstance(req, dict) else data
    if "response" in data and "response" not in spec:
        spec = {**spec, "response": data["response"]}
    if not isinstance(spec.get("url"), str) or not spec["url"].strip():
        raise TemplateError(f"{path.name} declares no url")
    _SPEC_CACHE[key] = (mtime, spec)
    return spec


class _Filler:
    def __init__(self, skill: Skill, input_data: Mapping[str, Any], ctx: Mapping[str, Any]):
        self.skill, self.input, self.ctx = skill, input_data, ctx
        self.used: set[str] = set()
        self.extra = {"workspace": str(ctx.get("workspace_dir") or ""), "baseDir": str(skill.path)}

    def value(self, name: str) -> Any:
        if name in self.input and self.input[name] is not None:
            self.used.add(name)
            return self.input[name]
        v = lookup_config(self.ctx, self.skill.name, name)
        if v is not None:
            return v
        if name in self.extra:
            return self.extra[name]
        raise TemplateError(
            f"the request template needs {{{name}}}, which is neither in the input nor in "
            f"the skill's configuration (set it with: skilljobs config set ROLE "
            f"{self.skill.name} {name} VALUE)"
        )

    def text(self, template: str, *, url: bool = False) -> str:
        def sub(m: re.Match[str]) -> str:
            v = self.value(m.group(1))
            s = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            # A value that is itself a URL (a configured base) goes in as is.
            return quote(s, safe="") if url and "://" not in s else s

        return _PLACEHOLDER.sub(sub, template)

    def deep(self, obj: Any) -> Any:
        if isinstance(obj, str):
            m = _PLACEHOLDER.fullmatch(obj.strip())
            return self.value(m.group(1)) if m else self.text(obj)
        if isinstance(obj, dict):
            return {k: self.deep(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.deep(v) for v in obj]
        return obj


def _pick(data: Any, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        if isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise TemplateError(f"response.path {path!r}: {part!r} is not in the answer")
    return data


async def run_http(
    skill: Skill,
    input_data: Mapping[str, Any],
    ctx: Mapping[str, Any],
    http: httpx.AsyncClient,
    *,
    wall: float,
) -> Any:
    """Send the skill's request; return the raw result (the executor normalizes it)."""
    assert skill.entry is not None
    try:
        spec = load_spec(Path(skill.entry))
        fill = _Filler(skill, input_data, ctx)
        method = str(spec.get("method") or "GET").upper()
        url = fill.text(spec["url"], url=True)
        headers = {str(k): str(fill.deep(v)) for k, v in (spec.get("headers") or {}).items()}
        params = fill.deep(spec["query"]) if isinstance(spec.get("query"), dict) else None
        kwargs: dict[str, Any] = {}
        if "body" in spec:
            body = fill.deep(spec["body"])
            if isinstance(body, str):
                kwargs["content"] = body.encode()
                headers.setdefault("Content-Type", str(spec.get("content_type") or "text/plain"))
            else:
                kwargs["json"] = body
        elif method in _BODY_METHODS:
            kwargs["json"] = {k: v for k, v in input_data.items() if not k.startswith("_")}
        if params is None and method not in _BODY_METHODS:
            params = {
                k: v
                for k, v in input_data.items()
                if not k.startswith("_") and k not in fill.used and isinstance(v, str | int | float)
            }
        timeout = min(float(spec.get("timeout") or 60.0), wall)
    except (TemplateError, tomllib.TOMLDecodeError, OSError, UnicodeDecodeError) as exc:
        return failure(f"HTTP skill {skill.name!r}: {exc}", error_type="config", skill=skill.name)

    parts = urlsplit(url)
    where = f"{method} {parts.scheme}://{parts.netloc}{parts.path}"  # never the query (tokens)
    async with http.stream(
        method, url, headers=headers, params=params or None, timeout=timeout, **kwargs
    ) as resp:
        data = bytearray()
        async for chunk in resp.aiter_bytes():
            data += chunk
            if len(data) > OUTPUT_CAP:
                return failure(
                    f"{where} answered with more than {OUTPUT_CAP // (1 << 20)} MB",
                    skill=skill.name,
                )
        ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
        status = resp.status_code
        encoding = resp.encoding or "utf-8"
    if status >= 400:
        snippet = bytes(data[:500]).decode(encoding, errors="replace").strip()
        kind = (
            "config"
            if status in (401, 403)
            else "transient"
            if status == 429 or status >= 500
            else None
        )
        return failure(
            f"{where} answered HTTP {status}: {snippet or '(empty body)'}",
            error_type=kind,
            status_code=status,
            skill=skill.name,
        )
    if ctype.startswith(("image/", "video/", "audio/")) or ctype in (
        "application/pdf",
        "application/octet-stream",
        "application/zip",
    ):
        return _save(bytes(data), ctype, parts.path, ctx)
    text = bytes(data).decode(encoding, errors="replace")
    if ctype.endswith("json") or text.lstrip().startswith(("{", "[")):
        try:
            value = json.loads(text)
        except ValueError:
            return {"output": text, "status_code": status}
        path = (spec.get("response") or {}).get("path")
        if path:
            try:
                value = _pick(value, str(path))
            except TemplateError as exc:
                return failure(f"HTTP skill {skill.name!r}: {exc}", skill=skill.name)
        return value
    return {"output": text, "status_code": status}


def _save(data: bytes, ctype: str, url_path: str, ctx: Mapping[str, Any]) -> dict[str, Any]:
    ws = ctx.get("workspace_dir")
    if not ws:
        return failure("the HTTP skill answered with a file but this run has no workspace")
    name = Path(url_path).name or "download"
    if not Path(name).suffix:
        name += mimetypes.guess_extension(ctype) or ".bin"
    target = Path(ws) / f"{Path(name).stem}_{secrets.token_hex(3)}{Path(name).suffix}"
    target.write_bytes(data)
    return {
        "ok": True,
        "filename": target.name,
        "local_path": str(target),
        "media": media_kind(target.name),
        "size": len(data),
    }
